"""Masks, and conversions between the conventions that trip people up.

Dimension legend: B batch, H heads, T query length, S key length.

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

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.types import Device

from ._checks import check_int

if TYPE_CHECKING:
    from torch.nn.attention.bias import CausalBias

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


def sliding_window_mask(T: int, window: int, S: int | None = None, *, causal: bool = False, device: Device = None) -> torch.Tensor:
    """Bool ``(T, S)``: query ``i`` may attend key ``j`` when ``|i - j| <= window``
    (``0 <= i - j <= window`` when ``causal``)."""
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    window = check_int("window", window, 0)
    i = torch.arange(T, device=device)[:, None]
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
