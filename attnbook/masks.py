"""Masks, and conversions between the conventions that trip people up.

Dimension legend: B batch, H heads, T query length, S key length; Bq, Bk queries and keys of one tile
of a FlexAttention block mask.

attnbook's convention: a bool mask is True where a query **may attend** to a
key, as in ``torch.nn.functional.scaled_dot_product_attention``. Other
conventions you will meet, and the converters for them:

* attnbook and ``F.scaled_dot_product_attention``: bool, True = may attend.
* ``nn.MultiheadAttention``'s ``attn_mask``: bool, True = **blocked**
  (:func:`from_blocked`, :func:`to_blocked`).
* ``nn.MultiheadAttention``'s ``key_padding_mask``: bool ``(B, S)``, True = padding
  (:func:`from_key_padding_mask`).
* additive float masks: 0 = attend, a very negative number = blocked
  (:func:`to_additive`, :func:`from_additive`).
* sequence lengths: int ``(B,)``, the first ``length`` keys are real
  (:func:`padding_mask`, :func:`lengths_from_mask`).
* Hugging Face's ``attention_mask``: int ``(B, S)``, 1 = real token, 0 = padding
  (:func:`from_hf_attention_mask`, :func:`to_hf_attention_mask`); the models
  turn it into an additive ``(B, 1, T, S)`` mask, which is
  ``to_additive(from_hf_attention_mask(m, T, causal=True), dtype)``.
* PyTorch's causal biases ``torch.nn.attention.bias.causal_upper_left`` (top-left,
  as ``is_causal=True``) and ``causal_lower_right`` (bottom-right, the KV-cache
  alignment) (:func:`from_causal_bias`; :func:`causal_mask` with ``offset=0`` or
  ``offset=S - T``).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from numbers import Real
from typing import TYPE_CHECKING

import torch
from torch.types import Device

from ._checks import check_int, shape_str
from .positional import alibi_slopes, relative_position_bucket

if TYPE_CHECKING:
    from torch.nn.attention.bias import CausalBias
    from torch.nn.attention.flex_attention import BlockMask

    from .positional import RelativePositionBias

__all__ = [
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "combine_masks",
    "from_blocked",
    "to_blocked",
    "from_key_padding_mask",
    "to_key_padding_mask",
    "to_additive",
    "from_additive",
    "lengths_from_mask",
    "from_hf_attention_mask",
    "to_hf_attention_mask",
    "from_causal_bias",
    # FlexAttention programs
    "MaskMod",
    "ScoreMod",
    "FLEX_BLOCK_SIZE",
    "TILE_KINDS",
    "UNFUSED_WARNING",
    "flex_available",
    "check_mask_mod",
    "dense_mask",
    "apply_score_mod",
    "causal_mask_mod",
    "sliding_window_mask_mod",
    "padding_mask_mod",
    "document_ids",
    "document_mask",
    "document_mask_mod",
    "prefix_lm_mask",
    "prefix_lm_mask_mod",
    "combine_mask_mods",
    "union_mask_mods",
    "alibi_score_mod",
    "relative_position_score_mod",
    "soft_cap_score_mod",
    "block_tiles",
    "make_block_mask",
    "block_mask_stats",
    "silence_unfused_warning",
    "eager_flex_attention",
]


def causal_mask(T: int, S: int | None = None, *, offset: int = 0, device: Device = None) -> torch.Tensor:
    """Bool ``(T, S)``: query ``i`` may attend key ``j`` when ``j <= i + offset``.

    With the default ``offset=0`` this is True on and below the diagonal (the
    same as ``is_causal=True`` in PyTorch). When the queries are the last T of
    S positions (decoding with a KV cache), pass ``offset=S - T``.
    """
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=offset)


def padding_mask(lengths: torch.Tensor | Sequence[int], max_len: int | None = None, *, left: bool = False) -> torch.Tensor:
    """Bool ``(B, 1, 1, S)``, True for the real (non-padding) keys.

    ``lengths`` holds the true length of each sequence in the batch; ``S`` is
    ``max_len`` or, by default, the longest length. The shape broadcasts over
    heads (H) and queries (T). With ``left=True`` the padding comes first (the
    real tokens are the last ``length`` positions), as in batched generation.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.long) if isinstance(lengths, (list, tuple)) and not lengths else torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be a 1-D sequence of ints, got shape {tuple(lengths.shape)} and {lengths.dtype}")
    if len(lengths) and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max()) if len(lengths) else 0
    if max_len is None:
        max_len = longest
    elif max_len < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest length {longest}")
    keys = torch.arange(max_len, device=lengths.device)  # (S,)
    if left:
        real = keys[None, :] >= (max_len - lengths)[:, None]  # (B, S)
    else:
        real = keys[None, :] < lengths[:, None]  # (B, S)
    return real[:, None, None, :]  # (B, 1, 1, S)


def sliding_window_mask(T: int, window: int, S: int | None = None, *, causal: bool = False, offset: int = 0,
                        device: Device = None) -> torch.Tensor:
    """Bool ``(T, S)``: query ``i``, at position ``p = i + offset``, may attend key ``j`` when
    ``|p - j| <= window`` (``0 <= p - j <= window`` when ``causal``). ``offset=0`` (the default) numbers
    queries and keys from the same start, as :func:`causal_mask`; when the queries are the last T of S
    positions (decoding with a KV cache), pass ``offset=S - T``."""
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    window = check_int("window", window, 0)
    offset = check_int("offset", offset, None)
    i = torch.arange(T, device=device)[:, None] + offset
    j = torch.arange(S, device=device)[None, :]
    d = i - j  # (T, S)
    if causal:
        return (d >= 0) & (d <= window)
    return d.abs() <= window


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of bool masks (None entries are skipped), broadcast together:
    a key is allowed only if every mask allows it."""
    out = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise TypeError(f"combine_masks takes bool masks, got {m.dtype}")
        out = m if out is None else out & m
    return out


def from_blocked(mask: torch.Tensor) -> torch.Tensor:
    """``nn.MultiheadAttention``'s bool ``attn_mask`` (True = blocked) to ours."""
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a bool mask, got {mask.dtype}")
    return ~mask


def to_blocked(mask: torch.Tensor) -> torch.Tensor:
    """Our bool mask (True = may attend) to ``nn.MultiheadAttention``'s (True = blocked)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a bool mask, got {mask.dtype}")
    return ~mask


def from_key_padding_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """``nn.MultiheadAttention``'s ``key_padding_mask`` ``(B, S)``, True = padding,
    to ours ``(B, 1, 1, S)``, True = real token."""
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise TypeError(
            f"key_padding_mask must be bool (B, S), got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )
    return ~key_padding_mask[:, None, None, :]  # (B, 1, 1, S)


def to_key_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """Ours ``(B, 1, 1, S)`` (or ``(B, S)``), True = real token, to
    ``nn.MultiheadAttention``'s ``key_padding_mask`` ``(B, S)``, True = padding."""
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a bool mask, got {mask.dtype}")
    if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        mask = mask[:, 0, 0, :]  # (B, S)
    if mask.dim() != 2:
        raise ValueError(f"expected a padding mask (B, 1, 1, S) or (B, S), got shape {tuple(mask.shape)}")
    return ~mask


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bool (True = may attend) to an additive float mask: 0 where allowed,
    ``torch.finfo(dtype).min`` where blocked."""
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a bool mask, got {mask.dtype}")
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return zero.masked_fill(~mask, torch.finfo(dtype).min).expand(mask.shape).clone()


def from_additive(mask: torch.Tensor) -> torch.Tensor:
    """Additive float mask to bool: True where the added value is not a
    blocking value (-inf or at most half of ``finfo(dtype).min``)."""
    if not mask.dtype.is_floating_point:
        raise TypeError(f"expected a float mask, got {mask.dtype}")
    return mask > torch.finfo(mask.dtype).min / 2


def lengths_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """The lengths behind a padding mask ``(B, 1, 1, S)`` or ``(B, S)``
    (True = real token): the number of True entries per sequence."""
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a bool mask, got {mask.dtype}")
    return mask.reshape(mask.shape[0], -1).sum(dim=-1)




def from_hf_attention_mask(attention_mask: torch.Tensor, T: int | None = None, *, causal: bool = False) -> torch.Tensor:
    """Hugging Face's ``attention_mask`` ``(B, S)`` (1 = real token, 0 = padding; int or bool) to ours.

    Returns bool ``(B, 1, 1, S)``, True = may attend, or with ``causal=True`` the
    ``(B, 1, T, S)`` mask a decoder uses: padding AND causal, with the ``T`` queries
    (default ``S``) at the last T of the S positions (bottom-right, as Hugging Face
    numbers a query by its cache position). ``to_additive(..., dtype)`` of the
    result is the 4-D float mask Hugging Face's eager attention adds to the scores.
    """
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (B, S), got shape {tuple(attention_mask.shape)}")
    if attention_mask.dtype.is_floating_point or attention_mask.is_complex():
        raise TypeError(f"attention_mask must hold ints or bools (1 = real token), got {attention_mask.dtype}")
    if attention_mask.dtype != torch.bool and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError(f"attention_mask must hold only 0 and 1, got values {attention_mask.unique().tolist()}")
    real = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    if not causal:
        if T is not None:
            raise ValueError("T is only used with causal=True (a padding mask broadcasts over the queries)")
        return real
    S = attention_mask.shape[1]
    T = S if T is None else check_int("T", T)
    if T > S:
        raise ValueError(f"T={T} queries cannot be the last T of S={S} key positions")
    return real & causal_mask(T, S, offset=S - T, device=attention_mask.device)  # (B, 1, T, S)


def to_hf_attention_mask(mask: torch.Tensor) -> torch.Tensor:
    """Ours, a padding mask ``(B, 1, 1, S)`` or ``(B, S)`` (True = real token), to Hugging Face's
    ``attention_mask``: int64 ``(B, S)``, 1 = real token, 0 = padding."""
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a bool mask, got {mask.dtype}")
    if mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
        mask = mask[:, 0, 0, :]  # (B, S)
    if mask.dim() != 2:
        raise ValueError(
            f"only a padding mask (B, 1, 1, S) or (B, S) has a Hugging Face attention_mask, got shape {tuple(mask.shape)}"
        )
    return mask.long()


def from_causal_bias(bias: CausalBias) -> torch.Tensor:
    """A ``torch.nn.attention.bias.CausalBias`` (``causal_upper_left(T, S)`` or
    ``causal_lower_right(T, S)``) as our bool ``(T, S)`` mask: ``causal_mask(T, S)``
    for upper left, ``causal_mask(T, S, offset=S - T)`` for lower right."""
    from torch.nn.attention.bias import CausalBias, CausalVariant

    if not isinstance(bias, CausalBias):
        raise TypeError(f"expected a torch.nn.attention.bias.CausalBias, got {type(bias).__name__}")
    T, S = bias.seq_len_q, bias.seq_len_kv
    offset = S - T if bias.variant == CausalVariant.LOWER_RIGHT else 0
    return causal_mask(T, S, offset=offset)


# ---------------------------------------------------------------------------
# FlexAttention programs
# ---------------------------------------------------------------------------
#
# A ``mask_mod(b, h, q_idx, kv_idx) -> bool`` says whether query ``q_idx`` of batch element ``b`` and head
# ``h`` may attend key ``kv_idx``; a ``score_mod(score, b, h, q_idx, kv_idx) -> score`` rewrites one scaled
# score before the softmax. FlexAttention calls them on scalar tensors under ``torch.vmap`` (eager) or
# inlines them into a kernel (compiled); attnbook calls the same functions on broadcasting aranges
# (:func:`dense_mask`, :func:`apply_score_mod`), so each program is checked against the package's dense
# masks and biases. The functions below only build closures over plain tensors: nothing here needs
# FlexAttention itself except :func:`make_block_mask` and :func:`eager_flex_attention`.

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``mask_mod(b, h, q_idx, kv_idx) -> bool tensor`` (True = may attend), FlexAttention's signature."""
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``score_mod(score, b, h, q_idx, kv_idx) -> score``, FlexAttention's signature (``score`` already scaled)."""

FLEX_BLOCK_SIZE = 128
"""The default side of a ``BlockMask``'s blocks (``create_block_mask``'s ``BLOCK_SIZE``; torch calls it the sparse
block size): the unit of sparsity, i.e. which (query block, key block) pairs the kernel skips, computes with
``mask_mod`` or computes whole. It is not the compiled kernel's tile: the kernel picks its own tile sizes, which
divide it. The module's "tile" means such a block."""
TILE_KINDS = ("skipped", "partial", "full")
"""What a (query block, key block) tile of a block mask is, by its code in :func:`block_tiles`'s grid: 0 no
pair allowed (the kernel skips it), 1 some pairs allowed (computed, with ``mask_mod`` applied), 2 every pair
allowed (computed without calling ``mask_mod``)."""
UNFUSED_WARNING = r"flex_attention called without torch\.compile\(\)"
"""The start of the message (a regular expression) torch warns with when ``flex_attention`` runs eagerly."""


def flex_available() -> bool:
    """Whether this torch has FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5) and can run it
    eagerly (it traces the score and mask programs with TorchDynamo, which some Python versions lack).

    It also imports ``torch.utils.cpp_extension`` quietly, through :func:`attnbook.measure.torch_benchmark`: on
    a CUDA build of torch without a GPU (Colab's CPU runtime) that module says "No CUDA runtime is found, using
    CUDA_HOME=..." once, when it is first imported, and FlexAttention's tracing or compiling imports it in some
    versions. Imported here first, with only that line dropped, it stays quiet. :func:`make_block_mask` and
    :func:`eager_flex_attention` call this function before they use FlexAttention."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    import torch._dynamo

    from .measure import torch_benchmark

    torch_benchmark()  # imports torch.utils.cpp_extension without its "No CUDA runtime" line
    return bool(torch._dynamo.is_dynamo_supported())


def _named(fn: Callable[..., torch.Tensor], name: str, *, T: int | None = None, S: int | None = None,
           square: bool = False) -> Callable[..., torch.Tensor]:
    """``fn`` with a readable ``__name__`` (``BlockMask``'s repr and the errors show it) and the sizes it is
    right for: ``T`` queries and ``S`` keys (None: any), or with ``square`` self-attention of any length
    (T == S, query i at key position i). :func:`check_mask_mod` and :func:`apply_score_mod` refuse other sizes."""
    fn.__name__ = fn.__qualname__ = name
    setattr(fn, _SIZES, (T, S, square))
    return fn


_SIZES = "_attnbook_sizes"  # the attribute where _named keeps the (T, S, square) a program is right for


def _mod_name(fn: object) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def _check_sizes(program: object, T: int, S: int) -> None:
    """ValueError unless ``program`` (one of attnbook's) is right for ``T`` queries against ``S`` keys. A
    program of one's own (no recorded sizes) is not checked."""
    sizes = getattr(program, _SIZES, None)
    if sizes is None:
        return
    pT, pS, square = sizes
    name = _mod_name(program)
    if square and T != S:
        raise ValueError(
            f"{name} is a self-attention program (T == S, query i at key position i), used with T={T} queries "
            f"and S={S} keys: for queries offset into the keys (decoding, chunked prefill) build it for T={T}, "
            f"S={S} (the queries are then the last T keys' positions, offset = S - T, unless offset= says otherwise)")
    if (pT is not None and pT != T) or (pS is not None and pS != S):
        raise ValueError(
            f"{name} was built for T={pT if pT is not None else 'any'} queries and S={pS} keys, used with T={T} "
            f"and S={S}: its positions would be wrong (a decoding step has one more key than the last); build "
            f"the program for this step's T and S")


def _offset(T: int, S: int, offset: object) -> int:
    """The absolute position of query 0: ``S - T`` by default (the queries are the last T of the S keys, as
    ``causal_lower_right``; negative when there are more queries than keys: the first see none), else
    ``offset`` (an int)."""
    return S - T if offset is None else check_int("offset", offset, None)


def _lengths(T: int | None, S: int | None) -> tuple[int | None, int | None]:
    """Checked ``(T, S)`` of a program that may be built without sizes (``T`` None: self-attention)."""
    if T is None:
        if S is not None:
            raise ValueError(f"S={S} needs T (the number of queries) too")
        return None, None
    T = check_int("T", T)
    return T, T if S is None else check_int("S", S)


def _int_tensor(name: str, values: torch.Tensor | Sequence[int], device: Device = None) -> torch.Tensor:
    """``values`` as an int64 tensor; TypeError for floats, bools or anything else."""
    if isinstance(values, torch.Tensor):
        t = values
    elif isinstance(values, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in values):
        t = torch.tensor(list(values), dtype=torch.long)
    else:
        raise TypeError(f"{name} must be a sequence of ints or an integer tensor, got {type(values).__name__} "
                        f"{values!r}")
    if t.dtype.is_floating_point or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold ints, got {t.dtype}")
    return t.to(device=device if device is not None else t.device, dtype=torch.long)


def _grid(B: int, H: int, T: int, S: int, device: Device = None) -> tuple[torch.Tensor, ...]:
    """Broadcasting aranges ``b (B,1,1,1)``, ``h (1,H,1,1)``, ``q_idx (1,1,T,1)``, ``kv_idx (1,1,1,S)``."""
    return (torch.arange(B, device=device)[:, None, None, None], torch.arange(H, device=device)[None, :, None, None],
            torch.arange(T, device=device)[None, None, :, None], torch.arange(S, device=device)[None, None, None, :])


def check_mask_mod(mask_mod: MaskMod, T: int, S: int | None = None, *, B: int = 1, H: int = 1,
                   device: Device = None) -> None:
    """Raise unless ``mask_mod`` is a FlexAttention mask program for ``B x H`` (``T``, ``S``) scores: called on
    scalar int32 indices (as FlexAttention calls it) it returns a 0-dim bool tensor, and called on broadcasting
    aranges (as :func:`dense_mask` calls it) a bool tensor that broadcasts to ``(B, H, T, S)``.

    TypeError names the program when it is not callable, returns something other than a bool tensor (an
    int 0/1 mask, a Python bool), or combines its comparisons with Python's ``and``/``or`` (which work on
    FlexAttention's scalar indices but not on a grid: use ``&``/``|``); ValueError when its result does not broadcast to ``(B, H, T, S)``, or when
    it is one of this module's programs built for other sizes (a program knows where its queries sit among
    the keys: one built for a step of decoding is wrong one step later, and says so).
    """
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    B, H = check_int("B", B), check_int("H", H)
    if not callable(mask_mod):
        raise TypeError(f"mask_mod must be callable (b, h, q_idx, kv_idx) -> bool tensor, got {type(mask_mod).__name__}")
    _check_sizes(mask_mod, T, S)
    name = _mod_name(mask_mod)
    zero = torch.zeros((), dtype=torch.int32, device=device)
    for args, what in (((zero, zero, zero, zero), "scalar indices"), (_grid(B, H, T, S, device), "index grids")):
        try:
            out = mask_mod(*args)
        except RuntimeError as e:
            if "Boolean value of Tensor" not in str(e):
                raise
            raise TypeError(f"mask_mod {name} asked for the truth value of a tensor of indices (Python's `and`, "
                            "`or`, `not` or an `if` on them): combine comparisons with `&`, `|` and `~`, "
                            "e.g. (kv_idx <= q_idx) & (q_idx - kv_idx <= w)") from e
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
            raise TypeError(f"mask_mod {name} must return a bool tensor (True = may attend), got {got} on {what}")
        if what == "scalar indices" and out.dim() != 0:
            raise ValueError(f"mask_mod {name} must return one value per (b, h, q_idx, kv_idx), got shape "
                             f"{shape_str(out)} for scalar indices")
        if what == "index grids":
            try:
                fits = torch.broadcast_shapes(out.shape, (B, H, T, S)) == (B, H, T, S)
            except RuntimeError:
                fits = False
            if not fits:
                raise ValueError(f"mask_mod {name} returned shape {shape_str(out)}, which does not broadcast to "
                                 f"(B, H, T, S) = ({B}, {H}, {T}, {S})")


def dense_mask(mask_mod: MaskMod, B: int, H: int, T: int, S: int | None = None, *, device: Device = None) -> torch.Tensor:
    """Bool ``(B, H, T, S)``: ``mask_mod`` evaluated on every (batch, head, query, key), vectorised by
    calling it once on broadcasting aranges (no FlexAttention needed; the same mask as torch's
    ``create_mask``). Checks the program first (:func:`check_mask_mod`)."""
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    check_mask_mod(mask_mod, T, S, B=B, H=H, device=device)
    return mask_mod(*_grid(B, H, T, S, device)).expand(B, H, T, S)  # (B, H, T, S)


def apply_score_mod(score_mod: ScoreMod, scores: torch.Tensor) -> torch.Tensor:
    """``score_mod`` applied to dense scores ``(B, H, T, S)`` (already scaled), vectorised on broadcasting
    aranges: the scores FlexAttention's softmax sees. On zeros it gives an additive program's bias
    (ALiBi's, T5's). ValueError for one of this module's programs built for other T and S."""
    if not callable(score_mod):
        raise TypeError(f"score_mod must be callable (score, b, h, q_idx, kv_idx) -> score, got {type(score_mod).__name__}")
    if not isinstance(scores, torch.Tensor) or not scores.dtype.is_floating_point:
        raise TypeError(f"scores must be a float tensor (B, H, T, S), got {getattr(scores, 'dtype', type(scores).__name__)}")
    if scores.dim() != 4:
        raise ValueError(f"scores must be (B, H, T, S), got shape {shape_str(scores)}")
    _check_sizes(score_mod, scores.shape[2], scores.shape[3])
    out = score_mod(scores, *_grid(*scores.shape, device=scores.device))  # type: ignore[misc]
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        raise TypeError(f"score_mod {_mod_name(score_mod)} must return float scores, got "
                        f"{getattr(out, 'dtype', type(out).__name__)}")
    return out.expand(scores.shape)  # (B, H, T, S)


# -- mask programs ----------------------------------------------------------------------------------------
#
# Positions: query q_idx of a block of T queries sits at absolute position offset + q_idx among the S keys
# (key kv_idx at position kv_idx). offset = S - T by default: the queries are the last T positions, as when
# decoding (T = 1 against a cache of S keys) or prefilling a chunk (T new tokens after S - T cached ones),
# and as torch's causal_lower_right. A program built for (T, S) refuses other sizes (_check_sizes); one built
# without them is for self-attention (T == S, offset 0) of any length and refuses T != S.


def causal_mask_mod(T: int, S: int | None = None, *, offset: int | None = None) -> MaskMod:
    """Causal: ``kv_idx <= q_idx + offset`` with ``offset = S - T`` by default (the queries are the last T of
    S positions: ``causal_mask(T, S, offset=S - T)``, torch's ``causal_lower_right``; a decoding step sees
    every cached key). ``offset=0`` is top-left (``is_causal=True``, ``causal_upper_left``). Built for these
    T and S only (:func:`check_mask_mod` refuses others)."""
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    off = _offset(T, S, offset)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return kv_idx <= q_idx + off

    return _named(mask_mod, f"causal(T={T}, S={S}, offset={off})", T=T, S=S)


def sliding_window_mask_mod(window: int, T: int | None = None, S: int | None = None, *, causal: bool = False,
                            offset: int | None = None) -> MaskMod:
    """``|p - kv_idx| <= window`` (``0 <= p - kv_idx <= window`` when ``causal``), where ``p = q_idx + offset``
    is the query's position: the mask of :func:`sliding_window_mask`. Without ``T`` a self-attention program
    (T == S, ``p = q_idx``, any length); with ``T`` and ``S`` the queries sit at ``offset`` (default
    ``S - T``: the last T positions, as a decoding step's query after S - 1 cached keys), for those sizes
    only. (Hugging Face's ``sliding_window`` W is this with ``window = W - 1``.)"""
    window = check_int("window", window, 0)
    T, S = _lengths(T, S)
    if T is None and offset is not None:
        raise ValueError("offset needs T and S: a program built without them is for self-attention (offset 0)")
    off = 0 if T is None or S is None else _offset(T, S, offset)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        d = q_idx + off - kv_idx
        return (d >= 0) & (d <= window) if causal else d.abs() <= window

    sizes = "" if T is None else f", T={T}, S={S}, offset={off}"
    return _named(mask_mod, f"sliding_window(window={window}, causal={causal}{sizes})", T=T, S=S, square=T is None)


def padding_mask_mod(lengths: torch.Tensor | Sequence[int], max_len: int | None = None, *, left: bool = False,
                     device: Device = None) -> MaskMod:
    """Key ``kv_idx`` of batch element ``b`` is real: ``kv_idx < lengths[b]`` (with ``left``,
    ``kv_idx >= max_len - lengths[b]``): the mask of :func:`padding_mask`. ``max_len`` (S) defaults to the
    longest length; the program is for S = ``max_len`` keys and any number of queries (it reads key positions
    only). A length of 0 blocks every query of that element: FlexAttention gives such fully masked rows a
    zero output, attnbook's convention too."""
    lengths = _int_tensor("lengths", lengths, device)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {shape_str(lengths)}")
    if len(lengths) and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max()) if len(lengths) else 0
    S = longest if max_len is None else check_int("max_len", max_len, 0)
    if S < longest:
        raise ValueError(f"max_len={S} is shorter than the longest length {longest}")
    first_real = S - lengths  # (B,)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return kv_idx >= first_real[b] if left else kv_idx < lengths[b]

    return _named(mask_mod, f"padding(lengths={lengths.tolist()}, max_len={S}, left={left})", S=S)


def document_ids(lengths: torch.Tensor | Sequence[int], *, device: Device = None) -> torch.Tensor:
    """Int64 ``(T,)``: the document each position of a packed sequence belongs to, for documents of
    ``lengths`` packed one after the other (``[3, 2] -> [0, 0, 0, 1, 1]``; T = their sum)."""
    lengths = _int_tensor("lengths", lengths, device)
    if lengths.dim() != 1 or not len(lengths) or int(lengths.min()) < 1:
        raise ValueError(f"lengths must be a non-empty 1-D sequence of lengths >= 1, got {lengths.tolist()}")
    return torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)  # (T,)


def _check_document_ids(ids: torch.Tensor | Sequence[int], device: Device) -> torch.Tensor:
    ids = _int_tensor("document_ids", ids, device)
    if ids.dim() not in (1, 2) or ids.shape[-1] == 0:
        raise ValueError(f"document_ids must be (T,) or (B, T) with T >= 1, got shape {shape_str(ids)}")
    return ids


def document_mask(document_ids: torch.Tensor | Sequence[int], *, causal: bool = True) -> torch.Tensor:
    """Bool ``(T, T)`` (or ``(B, 1, T, T)`` for ids ``(B, T)``): several documents packed into one sequence,
    each attending only to itself: ``document_ids[i] == document_ids[j]``, and ``j <= i`` when ``causal``.
    The dense mask of :func:`document_mask_mod`."""
    ids = _check_document_ids(document_ids, None)
    same = ids[..., :, None] == ids[..., None, :]  # (..., T, T)
    if causal:
        same = same & causal_mask(ids.shape[-1], device=ids.device)
    return same[:, None] if ids.dim() == 2 else same  # (B, 1, T, T) or (T, T)


def document_mask_mod(document_ids: torch.Tensor | Sequence[int], T: int | None = None, *, causal: bool = True,
                      offset: int | None = None, device: Device = None) -> MaskMod:
    """Packed documents: ``document_ids`` ``(S,)`` (one id per key position, e.g. from :func:`document_ids`)
    or ``(B, S)`` (one row per batch element); a query attends keys of its own document only, causally when
    ``causal``. ``T`` queries (default S: self-attention, the mask of :func:`document_mask`) sit at positions
    ``offset + q_idx`` with ``offset = S - T`` by default (the last T positions: decoding, chunked prefill);
    built for these T and S only."""
    ids = _check_document_ids(document_ids, device)
    S = ids.shape[-1]
    T = S if T is None else check_int("T", T)
    off = _offset(T, S, offset)
    if off < 0 or off + T > S:
        raise ValueError(f"document_ids give the documents of S={S} positions; queries at positions {off} to "
                         f"{off + T - 1} (offset={off}, T={T}) lie past them")

    if ids.dim() == 1:
        def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            same = ids[q_idx + off] == ids[kv_idx]
            return same & (kv_idx <= q_idx + off) if causal else same
    else:
        def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            same = ids[b, q_idx + off] == ids[b, kv_idx]
            return same & (kv_idx <= q_idx + off) if causal else same

    return _named(mask_mod, f"document(T={T}, S={S}, offset={off}, documents={int(ids.unique().numel())}, "
                            f"causal={causal})", T=T, S=S)


def prefix_lm_mask(T: int, prefix_len: int, *, device: Device = None) -> torch.Tensor:
    """Bool ``(T, T)``: a prefix LM (T5's, UniLM's): every query sees the whole prefix of ``prefix_len``
    positions (so the prefix attends to itself bidirectionally), and the rest is causal: ``j <= i or
    j < prefix_len``. The dense mask of :func:`prefix_lm_mask_mod`."""
    T = check_int("T", T)
    prefix_len = check_int("prefix_len", prefix_len, 0, T)
    prefix = torch.arange(T, device=device) < prefix_len  # (S,)
    return causal_mask(T, device=device) | prefix[None, :]  # (T, S)


def prefix_lm_mask_mod(prefix_len: int, T: int | None = None, S: int | None = None, *,
                       offset: int | None = None) -> MaskMod:
    """Prefix LM: ``kv_idx <= q_idx + offset or kv_idx < prefix_len`` (bidirectional over the prefix, causal
    after): the mask of :func:`prefix_lm_mask`. Without ``T`` a self-attention program (offset 0, T == S);
    with ``T`` and ``S`` the queries are the last T positions (``offset = S - T`` by default), for those
    sizes only."""
    prefix_len = check_int("prefix_len", prefix_len, 0)
    T, S = _lengths(T, S)
    if T is None and offset is not None:
        raise ValueError("offset needs T and S: a program built without them is for self-attention (offset 0)")
    off = 0 if T is None or S is None else _offset(T, S, offset)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (kv_idx <= q_idx + off) | (kv_idx < prefix_len)

    sizes = "" if T is None else f", T={T}, S={S}, offset={off}"
    return _named(mask_mod, f"prefix_lm(prefix_len={prefix_len}{sizes})", T=T, S=S, square=T is None)


def _joint_sizes(mods: Sequence[object]) -> dict:
    """The sizes a combination of programs is right for: those every part agrees on; ValueError if two
    parts were built for different sizes."""
    T: int | None = None
    S: int | None = None
    square = False
    for m in mods:
        mT, mS, msq = getattr(m, _SIZES, (None, None, False))
        for name, mine, theirs in (("T", mT, T), ("S", mS, S)):
            if mine is not None and theirs is not None and mine != theirs:
                raise ValueError(f"the programs to combine were built for different sizes ({name}={theirs} and "
                                 f"{name}={mine}: {', '.join(_mod_name(x) for x in mods)})")
        T, S, square = mT if mT is not None else T, mS if mS is not None else S, square or msq
    if square and T is not None and S is not None and T != S:
        raise ValueError(f"a self-attention program (T == S) cannot be combined with one built for T={T}, S={S}: "
                         f"build every part for T={T}, S={S}")
    return {"T": T, "S": S, "square": square}


def combine_mask_mods(*mask_mods: MaskMod) -> MaskMod:
    """Logical AND of mask programs (torch's ``and_masks``; as :func:`combine_masks` for dense masks): a key
    is allowed only if every program allows it. Right for the sizes its parts agree on (ValueError when
    they were built for different ones)."""
    if not mask_mods or not all(callable(m) for m in mask_mods):
        raise TypeError(f"combine_mask_mods takes one or more mask programs, got {[type(m).__name__ for m in mask_mods]}")
    from torch.nn.attention.flex_attention import and_masks

    sizes = _joint_sizes(mask_mods)
    return _named(and_masks(*mask_mods), " & ".join(_mod_name(m) for m in mask_mods), **sizes)


def union_mask_mods(*mask_mods: MaskMod) -> MaskMod:
    """Logical OR of mask programs (torch's ``or_masks``): a key is allowed if any program allows it (a
    window OR the first key: an attention sink). Right for the sizes its parts agree on."""
    if not mask_mods or not all(callable(m) for m in mask_mods):
        raise TypeError(f"union_mask_mods takes one or more mask programs, got {[type(m).__name__ for m in mask_mods]}")
    from torch.nn.attention.flex_attention import or_masks

    sizes = _joint_sizes(mask_mods)
    return _named(or_masks(*mask_mods), " | ".join(_mod_name(m) for m in mask_mods), **sizes)


# -- score programs ---------------------------------------------------------------------------------------


def alibi_score_mod(num_heads: int, T: int, S: int | None = None, *, offset: int | None = None,
                    device: Device = None) -> ScoreMod:
    """ALiBi: ``score - slope_h * |q_idx + offset - kv_idx|`` with :func:`attnbook.alibi_slopes`'s slopes, the
    queries at ``offset`` (default ``S - T``: the last T of S positions). With :func:`causal_mask_mod`
    ``(T, S)`` as the mask it is ``attnbook.alibi_bias(num_heads, T, S)``; alone, ``alibi_bias(...,
    causal=False)``. For these T and S only."""
    num_heads = check_int("num_heads", num_heads)
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    slopes = alibi_slopes(num_heads, device=device)  # (H,)
    off = _offset(T, S, offset)

    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                  kv_idx: torch.Tensor) -> torch.Tensor:
        return score - slopes[h] * (q_idx + off - kv_idx).abs()

    return _named(score_mod, f"alibi(num_heads={num_heads}, T={T}, S={S}, offset={off})", T=T, S=S)


def relative_position_score_mod(bias: RelativePositionBias, T: int, S: int | None = None, *,
                                offset: int | None = None) -> ScoreMod:
    """T5's relative position bias as a score program: ``score + table[bucket(kv_idx - q_idx - offset), h]``
    (default ``offset = S - T``: the queries are the last T of S positions), with ``bias``'s learned table
    (``bias.embedding.weight``, read at each call, so training moves it) and
    :func:`attnbook.relative_position_bucket`'s buckets, computed once for the ``T + S - 1`` diagonals. Equal
    to adding ``bias(T, S)``. For these T and S only."""
    from .positional import RelativePositionBias

    if not isinstance(bias, RelativePositionBias):
        raise TypeError(f"bias must be an attnbook.RelativePositionBias, got {type(bias).__name__}")
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    off = _offset(T, S, offset)
    table = bias.embedding.weight  # (num_buckets, H)
    # diagonal d = kv_idx - q_idx + T - 1 in [0, T + S - 2] has relative position kv - (q + offset) = d - (T - 1) - offset
    rel = torch.arange(T + S - 1, device=table.device) - (T - 1) - off  # (T + S - 1,)
    buckets = relative_position_bucket(rel, bias.bidirectional, bias.num_buckets, bias.max_distance)
    last = T - 1

    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                  kv_idx: torch.Tensor) -> torch.Tensor:
        return score + table[buckets[kv_idx - q_idx + last], h]

    return _named(score_mod, f"t5_relative(T={T}, S={S}, offset={off}, num_buckets={bias.num_buckets})", T=T, S=S)


def soft_cap_score_mod(cap: float) -> ScoreMod:
    """Tanh soft-capping (Gemma 2): ``cap * tanh(score / cap)``, which keeps every score in ``(-cap, cap)``
    (Gemma 2 caps attention scores at 50). Applied before any mask; reads no position, so any sizes."""
    if isinstance(cap, bool) or not isinstance(cap, Real):
        raise TypeError(f"cap must be a positive number, got {type(cap).__name__} {cap!r}")
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"cap must be a positive finite number, got {cap!r}")
    cap = float(cap)

    def score_mod(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                  kv_idx: torch.Tensor) -> torch.Tensor:
        return cap * torch.tanh(score / cap)

    return _named(score_mod, f"soft_cap(cap={cap:g})")


# -- block masks: what FlexAttention skips ----------------------------------------------------------------


def _check_block_size(block_size: object) -> int:
    return check_int("block_size", block_size)


def block_tiles(mask: torch.Tensor, block_size: int = FLEX_BLOCK_SIZE) -> torch.Tensor:
    """Int8 ``(..., ceil(T / Bq), ceil(S / Bk))`` (``Bq = Bk = block_size``): each tile of the bool mask
    ``(..., T, S)`` as its code in :data:`TILE_KINDS` (0 skipped, 1 partial, 2 full), counted from the dense
    mask as ``create_block_mask`` counts it: a ragged last tile is padded with blocked pairs, so it is never
    full. Needs no FlexAttention."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() < 2:
        raise TypeError(f"mask must be a bool tensor (..., T, S), got {getattr(mask, 'dtype', type(mask).__name__)}")
    bs = _check_block_size(block_size)
    T, S = mask.shape[-2:]
    nq, nk = -(-T // bs), -(-S // bs)
    padded = torch.nn.functional.pad(mask, (0, nk * bs - S, 0, nq * bs - T))  # (..., nq * Bq, nk * Bk), False
    tiles = padded.reshape(*mask.shape[:-2], nq, bs, nk, bs).sum(dim=(-3, -1))  # (..., nq, nk) allowed pairs
    return (tiles > 0).to(torch.int8) + (tiles == bs * bs).to(torch.int8)  # (..., nq, nk)


def make_block_mask(mask_mod: MaskMod, T: int, S: int | None = None, *, B: int = 1, H: int = 1,
                    block_size: int = FLEX_BLOCK_SIZE, device: Device = "cpu") -> BlockMask:
    """``torch.nn.attention.flex_attention.create_block_mask`` for ``mask_mod``, after checking the program
    (:func:`check_mask_mod`) and the sizes (``block_size`` > 0: ValueError otherwise). ``device`` defaults to
    the CPU (torch's own default is the accelerator, when there is one). RuntimeError without FlexAttention
    (:func:`flex_available`). Eagerly, ``create_block_mask`` evaluates ``mask_mod`` into the dense
    ``(B, H, T, S)`` bool mask (``create_mask``) and sums it by blocks: fine for a chapter's sizes, memory
    quadratic in T for long sequences, where ``torch.compile(create_block_mask)`` builds it block by block
    (torch's older ``_compile=True`` flag does that too, and now warns that it is deprecated)."""
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    bs = _check_block_size(block_size)
    check_mask_mod(mask_mod, T, S, B=B, H=H, device=device)
    return _create_block_mask(mask_mod, B, H, T, S, bs, device)


def _create_block_mask(mask_mod: MaskMod, B: int, H: int, T: int, S: int, block_size: int,
                       device: Device) -> BlockMask:
    """torch's ``create_block_mask``, for arguments already checked."""
    if not flex_available():
        raise RuntimeError(f"FlexAttention needs torch >= 2.5 with TorchDynamo; this is torch {torch.__version__}")
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_mod, B, H, T, S, device=device, BLOCK_SIZE=block_size)


def _tiles_of(block_mask: BlockMask) -> torch.Tensor:
    """Int8 ``(B, H, nq, nk)``: a BlockMask's tiles as :func:`block_tiles` codes, from its public index lists
    (``kv_num_blocks``/``kv_indices`` for partial tiles, ``full_kv_*`` for full ones)."""
    *lead, nq, nk = block_mask.kv_indices.shape
    tiles = torch.zeros(*lead, nq, nk, dtype=torch.int8, device=block_mask.kv_indices.device)  # (B, H, nq, nk)
    lists = [(block_mask.kv_num_blocks, block_mask.kv_indices, 1)]
    if block_mask.full_kv_num_blocks is not None and block_mask.full_kv_indices is not None:
        lists.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices, 2))
    for num, idx, code in lists:
        used = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]  # (B, H, nq, nk): listed entries
        mark = torch.zeros_like(tiles)
        mark.scatter_(-1, idx.long(), used.to(torch.int8) * code)  # unused entries scatter a 0 (max below keeps it)
        tiles = torch.maximum(tiles, mark)
    return tiles


def block_mask_stats(mask_mod: MaskMod, T: int, S: int | None = None, block_size: int = FLEX_BLOCK_SIZE, *,
                     B: int = 1, H: int = 1, method: str = "auto") -> dict:
    """How FlexAttention's block mask for ``mask_mod`` splits the (T, S) scores into ``block_size`` tiles.

    Returns a dict: ``tiles`` (int8 ``(B, H, nq, nk)``, codes of :data:`TILE_KINDS`), ``full``, ``partial``,
    ``skipped`` and ``total`` (tile counts over all B x H), ``skipped_share`` (skipped / total: the share of
    the score tiles a block-sparse kernel never computes), ``allowed_share`` (allowed pairs / T S),
    ``block_size`` and ``method``. ``method``: ``"flex"`` reads ``create_block_mask``'s index lists,
    ``"dense"`` counts the dense mask's tiles (:func:`block_tiles`, no FlexAttention needed), ``"auto"``
    (the default) the first where FlexAttention is available, else the second; both give the same tiles.
    """
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    bs = _check_block_size(block_size)
    if method not in ("auto", "flex", "dense"):
        raise ValueError(f"method must be 'auto', 'flex' or 'dense', got {method!r}")
    if method == "auto":
        method = "flex" if flex_available() else "dense"
    mask = dense_mask(mask_mod, B, H, T, S)  # (B, H, T, S); also checks the program
    if method == "flex":
        tiles = _tiles_of(_create_block_mask(mask_mod, B, H, T, S, bs, "cpu"))
    else:
        tiles = block_tiles(mask, bs)  # (B, H, nq, nk)
    counts = {kind: int((tiles == code).sum()) for code, kind in enumerate(TILE_KINDS)}
    total = tiles.numel()
    return {"tiles": tiles, **counts, "total": total, "skipped_share": counts["skipped"] / total,
            "allowed_share": int(mask.sum()) / mask.numel(), "block_size": bs, "method": method}


@contextlib.contextmanager
def silence_unfused_warning() -> Iterator[None]:
    """Inside ``with silence_unfused_warning():`` torch's one warning that ``flex_attention`` runs without
    ``torch.compile`` is not shown; every other warning is (a ``warnings.filterwarnings`` on that message
    and ``UserWarning`` only, undone on exit).

    What the warning says: eagerly, FlexAttention is *unfused*: it computes the whole ``(B, H, T, S)``
    score tensor, applies ``score_mod`` and ``mask_mod`` to every entry (vectorised with ``torch.vmap``), and
    takes a softmax over it, as attnbook's dense path does; its ``BlockMask`` skips nothing. Only
    ``torch.compile(flex_attention)`` fuses the programs into one tiled kernel that never materialises the
    scores and skips the tiles the block mask marks empty. Eager is right for checking a program, not for
    speed. (torch warns once per process: a call silenced here uses that once up.)
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=UNFUSED_WARNING, category=UserWarning)
        yield


def eager_flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, score_mod: ScoreMod | None = None,
                         mask_mod: MaskMod | None = None, block_size: int = FLEX_BLOCK_SIZE,
                         scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """``flex_attention(q, k, v, score_mod, block_mask, enable_gqa=...)`` run eagerly, with the block mask
    made from ``mask_mod`` (:func:`make_block_mask`, on q's device, for q's B and H, T = q's length and
    S = k's: one of this module's programs built for other sizes is refused) and the unfused warning
    silenced (:func:`silence_unfused_warning`). q ``(B, H, T, D)``, k ``(B, Hkv, S, D)``, v
    ``(B, Hkv, S, Dv)`` -> out ``(B, H, T, Dv)``: Hkv = H, or with ``enable_gqa`` any divisor of H
    (grouped-query attention: query head h reads key/value head ``h // (H // Hkv)``, as SDPA's
    ``enable_gqa=True``). A query row no key is allowed gets a zero output, as in attnbook. Whether a
    backward pass runs on the CPU depends on the torch version (torch 2.13 raises NotImplementedError when an
    input requires grad; some earlier versions ran one): try it."""
    if not flex_available():
        raise RuntimeError(f"FlexAttention needs torch >= 2.5 with TorchDynamo; this is torch {torch.__version__}")
    from torch.nn.attention.flex_attention import flex_attention

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, len, D), got shape {shape_str(t)}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__} {enable_gqa!r}")
    B, H, T, _ = q.shape
    S = k.shape[-2]
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k and v must be (B, Hkv, S, D) and (B, Hkv, S, Dv) for q (B, H, T, D), got q "
                         f"{shape_str(q)}, k {shape_str(k)}, v {shape_str(v)}")
    Hkv = k.shape[1]
    if Hkv != H and not (enable_gqa and H % Hkv == 0):
        need = "enable_gqa=True, with" if not enable_gqa else "with enable_gqa,"
        raise ValueError(f"q has H={H} heads and k, v Hkv={Hkv}: {need} Hkv must divide H (q {shape_str(q)}, "
                         f"k {shape_str(k)})")
    bs = _check_block_size(block_size)
    block_mask = None
    if mask_mod is not None:
        block_mask = make_block_mask(mask_mod, T, S, B=B, H=H, block_size=bs, device=q.device)
    if score_mod is not None:
        _check_sizes(score_mod, T, S)
    with silence_unfused_warning():
        out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)
    assert isinstance(out, torch.Tensor)
    return out
