"""Positional information for attention: absolute, relative, rotary and ALiBi.

Dimension legend:
    B  batch size
    H  number of heads
    T  query length,  S  key length
    D  head dimension (RoPE rotates pairs of the D features of one head)
    E  model dimension (``d_model``)

Attention by itself is permutation equivariant: shuffle the tokens and the
outputs shuffle the same way. Everything here breaks that symmetry, in four
different places:

* added to the input embeddings (``SinusoidalPositionalEncoding``,
  ``LearnedPositionalEmbedding``);
* added to the scores as a float ``mask`` (``RelativePositionBias``, T5;
  ``alibi_bias``, ALiBi);
* rotating the queries and keys before the dot product (``apply_rotary``, RoPE),
  with the frequencies of a config's ``rope_parameters`` (``rope_frequencies``: plain,
  linear position interpolation, YaRN) for contexts longer than the model was trained on.

Float biases follow attnbook's mask convention (:mod:`attnbook.core`): they
are added to the scores, and a blocked key holds ``torch.finfo(dtype).min``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn
from torch.types import Device

from ._checks import check_int, check_module_inputs, check_prob, shape_str

__all__ = [
    "sinusoidal_encoding",
    "shift_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "relative_position_bucket",
    "RelativePositionBias",
    "apply_rotary",
    "rotary_permutation",
    "rope_frequencies",
    "yarn_ramp",
    "yarn_mscale",
    "ROPE_TYPES",
    "alibi_slopes",
    "alibi_bias",
]


def _check_base(base: object) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"base must be a number > 1, got {type(base).__name__} {base!r}")
    if not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return float(base)


# ---------------------------------------------------------------------------
# Sinusoidal (Vaswani et al., 2017)
# ---------------------------------------------------------------------------


def _inverse_frequencies(d_model: int, base: float, dtype: torch.dtype, device: Device = None) -> torch.Tensor:
    """1 / base^(2i / d_model) for the columns 2i = 0, 2, 4, ... < d_model."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # (ceil(E/2),)
    return torch.exp(-math.log(base) * two_i / d_model).to(dtype)


def sinusoidal_encoding(
    max_len: int, d_model: int, base: float = 10000.0, *, dtype: torch.dtype | None = None, device: Device = None
) -> torch.Tensor:
    """The fixed table ``PE`` of shape ``(max_len, d_model)``::

        PE[pos, 2i]     = sin(pos / base^(2i / d_model))
        PE[pos, 2i + 1] = cos(pos / base^(2i / d_model))

    An odd ``d_model`` is allowed: its last column ``d_model - 1 = 2i`` is a
    sine. The table is computed in float64 and returned in ``dtype`` (the
    default dtype when None).
    """
    max_len = check_int("max_len", max_len)
    d_model = check_int("d_model", d_model)
    base = _check_base(base)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    pos = torch.arange(max_len, dtype=torch.float64, device=device)  # (max_len,)
    angles = pos[:, None] * _inverse_frequencies(d_model, base, torch.float64, device)[None, :]  # (max_len, ceil(E/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64, device=device)  # (max_len, E)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.to(dtype)


def shift_matrix(
    k: int, d_model: int, base: float = 10000.0, *, dtype: torch.dtype | None = None, device: Device = None
) -> torch.Tensor:
    """The fixed ``(d_model, d_model)`` matrix ``M_k`` with, for every ``pos``,

        PE(pos + k) = PE(pos) @ M_k        (PE rows are row vectors)

    where ``PE`` is :func:`sinusoidal_encoding`. It is block diagonal: the
    block for columns ``(2i, 2i + 1)`` is ``[[cos w, -sin w], [sin w, cos w]]``
    with ``w = k / base^(2i / d_model)``, a rotation, so ``M_k`` is
    orthogonal, ``M_j @ M_k = M_(j + k)`` and ``M_(-k) = M_k^T``. This is why the
    paper says a fixed offset is a linear function of the encoding.

    ``d_model`` must be even: with an odd ``d_model`` the last column
    ``sin(pos * w)`` has no cosine partner, and ``sin((pos + k) w)`` is not a
    linear function of the row ``PE(pos)`` in general, so a ``ValueError`` is
    raised. ``k`` may be negative.
    """
    check_int("k", k, None)
    d_model = check_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(
            f"shift_matrix needs an even d_model, got d_model={d_model}: the last sine column "
            f"sin(pos * w) has no cosine partner, so PE(pos + k) is not a linear map of PE(pos)"
        )
    base = _check_base(base)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    w = k * _inverse_frequencies(d_model, base, torch.float64, device)  # (E/2,)
    c, s = torch.cos(w), torch.sin(w)
    m = torch.zeros(d_model, d_model, dtype=torch.float64, device=device)  # (E, E)
    idx = torch.arange(0, d_model, 2, device=device)
    m[idx, idx] = c
    m[idx, idx + 1] = -s
    m[idx + 1, idx] = s
    m[idx + 1, idx + 1] = c
    return m.to(dtype)


def _check_embeddings(x: torch.Tensor, d_model: int, max_len: int, offset: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"x must be (B, T, {d_model}) (batch-first), got {shape_str(x)}")
    check_int("offset", offset, 0)
    T = x.shape[1]
    if offset + T > max_len:
        raise ValueError(
            f"positions {offset}..{offset + T - 1} (T={T}, offset={offset}) do not fit in max_len={max_len}"
        )
    return T


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to token embeddings.

    Args:
        d_model: model dimension E (odd is allowed).
        max_len: longest sequence (plus ``offset``) it will see.
        dropout: dropout applied to the sum (training only), as in the paper.
        base: the 10000 of the formula.

    ``forward(x, offset=0)`` takes ``x`` ``(B, T, E)`` and returns
    ``dropout(x + PE[offset : offset + T])``. The table is a non-persistent
    buffer named ``pe`` (it moves with ``.to()`` but is not saved in the
    ``state_dict``: it is recomputed from the arguments).
    """

    pe: torch.Tensor

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0, base: float = 10000.0):
        super().__init__()
        check_prob("dropout", dropout)
        self.d_model = check_int("d_model", d_model)
        self.max_len = check_int("max_len", max_len)
        self.base = _check_base(base)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, base={self.base:g}"

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        T = _check_embeddings(x, self.d_model, self.max_len, offset)
        pe = self.pe[offset : offset + T].to(x.dtype)  # (T, E)
        return self.dropout(x + pe[None])  # (B, T, E)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per position (BERT, GPT-2): an ``nn.Embedding``
    with ``max_len`` rows of width ``d_model``, initialised N(0, ``init_std``^2)
    (0.02 by default; ``init_std=1.0`` keeps ``nn.Embedding``'s own N(0, 1)
    draw, as the toy models of :mod:`attnbook.tasks` and MiniLM's embeddings do).

    ``forward(x, offset=0)`` takes ``x`` ``(B, T, E)`` and returns
    ``dropout(x + P[offset : offset + T])``. Unlike the sinusoidal table it
    cannot extrapolate: ``offset + T > max_len`` raises a ``ValueError``.
    """

    def __init__(self, d_model: int, max_len: int, dropout: float = 0.0, *, init_std: float = 0.02):
        super().__init__()
        check_prob("dropout", dropout)
        self.d_model = check_int("d_model", d_model)
        self.max_len = check_int("max_len", max_len)
        if not init_std > 0:
            raise ValueError(f"init_std must be positive, got {init_std!r}")
        self.embedding = nn.Embedding(max_len, d_model)  # initialised N(0, 1)
        if init_std != 1.0:
            nn.init.normal_(self.embedding.weight, std=init_std)
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"

    @property
    def weight(self) -> torch.Tensor:
        """The table ``P``, ``(max_len, E)``: ``embedding.weight``, as an ``nn.Embedding`` names it."""
        return self.embedding.weight

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        T = _check_embeddings(x, self.d_model, self.max_len, offset)
        check_module_inputs(self, x=x)
        positions = torch.arange(offset, offset + T, device=x.device)  # (T,)
        p = self.embedding(positions)  # (T, E)
        return self.dropout(x + p[None])  # (B, T, E)


# ---------------------------------------------------------------------------
# Relative position bias (T5, Raffel et al., 2020)
# ---------------------------------------------------------------------------


def _check_buckets(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    num_buckets = check_int("num_buckets", num_buckets)
    max_distance = check_int("max_distance", max_distance)
    half = num_buckets // 2 if bidirectional else num_buckets
    if bidirectional and num_buckets % 2:
        raise ValueError(f"bidirectional buckets need an even num_buckets (half per direction), got {num_buckets}")
    if half < 2:
        raise ValueError(f"num_buckets={num_buckets} is too small: need at least 2 per direction")
    if max_distance <= half // 2:
        raise ValueError(
            f"max_distance={max_distance} must exceed the {half // 2} exact buckets "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional})"
        )


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """T5's bucket (an int64 tensor of the same shape) for each
    ``relative_position = key_position - query_position``.

    With ``bidirectional`` the buckets are split in two halves: keys before the
    query use ``[0, num_buckets / 2)``, keys after it ``[num_buckets / 2,
    num_buckets)``. Without it only keys at or before the query are told apart
    (keys after the query all share bucket 0, the bucket of distance 0; a
    causal mask hides them anyway). Within a half of ``n`` buckets, the
    distances ``0 .. n/2 - 1`` get a bucket each; larger distances share
    logarithmically wider buckets up to ``max_distance``, and every distance
    beyond that lands in the last bucket. The bucket index grows with ``|distance|``.
    """
    if not isinstance(relative_position, torch.Tensor):
        relative_position = torch.as_tensor(relative_position)
    if relative_position.dtype.is_floating_point or relative_position.dtype == torch.bool:
        raise TypeError(f"relative_position must be an integer tensor, got {relative_position.dtype}")
    _check_buckets(bidirectional, num_buckets, max_distance)
    rel = relative_position.long()
    bucket = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (rel > 0).long() * num_buckets  # keys after the query: upper half
        distance = rel.abs()
    else:
        distance = (-rel).clamp(min=0)  # keys after the query count as distance 0
    max_exact = num_buckets // 2
    # log-spaced buckets for max_exact <= distance < max_distance; clamp keeps log() finite
    # (float32 as in T5, so pretrained tables line up bucket for bucket)
    far = distance.clamp(min=max_exact).to(torch.float32)
    log_bucket = (
        max_exact + (torch.log(far / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)).long()
    )
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < max_exact, distance, log_bucket)


class RelativePositionBias(nn.Module):
    """A learned scalar per (head, relative-position bucket), added to the scores (T5).

    Args:
        num_heads: H.
        num_buckets, max_distance, bidirectional: see :func:`relative_position_bucket`
            (encoders are bidirectional, decoder self-attention is not).

    ``forward(T, S=None)`` returns a float bias ``(1, H, T, S)`` to pass as the
    ``mask`` of :func:`attnbook.scaled_dot_product_attention` or
    :class:`attnbook.MultiHeadAttention` (it broadcasts over B). ``S``
    defaults to ``T``; when ``S != T`` the queries are the last T of the S
    positions (query ``i`` sits at position ``i + S - T``, as when decoding with
    a KV cache). The table is an ``nn.Embedding(num_buckets, H)`` initialised
    N(0, 0.02^2).
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        _check_buckets(bidirectional, num_buckets, max_distance)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bool(bidirectional)
        self.embedding = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )

    def forward(self, T: int, S: int | None = None) -> torch.Tensor:
        T = check_int("T", T)
        S = T if S is None else check_int("S", S)
        device = self.embedding.weight.device
        query_pos = torch.arange(T, device=device) + (S - T)  # (T,)
        key_pos = torch.arange(S, device=device)  # (S,)
        rel = key_pos[None, :] - query_pos[:, None]  # (T, S)
        buckets = relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)  # (T, S)
        bias = self.embedding(buckets)  # (T, S, H)
        return bias.permute(2, 0, 1).unsqueeze(0)  # (1, H, T, S)


# ---------------------------------------------------------------------------
# Rotary position embedding (RoPE, Su et al., 2021)
# ---------------------------------------------------------------------------


def apply_rotary(
    x: torch.Tensor,
    positions: torch.Tensor | Sequence[float] | None = None,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
    inv_freq: torch.Tensor | None = None,
    attention_factor: float = 1.0,
) -> torch.Tensor:
    """Rotate pairs of features of ``x`` ``(..., T, D)`` by position-dependent angles.

    Pair ``i`` (``i = 0 .. D/2 - 1``) of the token at position ``m`` is rotated
    by the angle ``m * base^(-2i / D)``. Applied to both queries and keys, the
    score ``<R_m q, R_n k>`` depends on ``q``, ``k`` and ``m - n`` only, and the
    norms are unchanged.

    Args:
        x: ``(..., T, D)`` with ``D`` even, e.g. queries ``(B, H, T, D)``.
        positions: the position of each of the T tokens; default ``arange(T)``.
            A tensor (or sequence) of ints (floats are accepted, for position
            interpolation) of shape ``(T,)`` or any shape broadcastable to
            ``x.shape[:-1]``, e.g. ``offset + arange(T)`` for new tokens after a KV
            cache, or ``(B, 1, T)`` per-sequence positions for ``(B, H, T, D)``.
        base: the 10000 of the frequencies (Llama 3 and others use larger bases).
        interleaved: which features form a pair. ``True`` pairs ``(0, 1), (2, 3), ...``
            (RoFormer, GPT-J, Meta's Llama checkpoints); ``False`` pairs
            ``(i, i + D/2)`` (GPT-NeoX, Hugging Face's ``rotate_half``). See
            :func:`rotary_permutation` to move weights between the two.
        inv_freq: ``(D/2,)`` the angle per position of each pair, in place of ``base^(-2i / D)``
            (then ``base`` is not used): the scaled frequencies of :func:`rope_frequencies`.
        attention_factor: multiplies the rotated features (Hugging Face multiplies its cos and sin
            by it); YaRN's temperature, :func:`rope_frequencies`' second result. Applied to queries
            and keys, it multiplies every score by ``attention_factor ** 2``.

    The angles are computed in float64 (at position 100,000 a float32 angle is only good to
    about 0.004 rad), the rotation in at least float32, returned in ``x.dtype``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"x must be (..., T, D), got shape {shape_str(x)}")
    T, D = x.shape[-2], x.shape[-1]
    if D % 2:
        raise ValueError(
            f"RoPE rotates pairs of features, so the head dim D must be even; got D={D} (x is {shape_str(x)})"
        )
    base = _check_base(base)
    work = torch.promote_types(x.dtype, torch.float32)
    if positions is None:
        positions = torch.arange(T, device=x.device)  # (T,)
    positions = torch.as_tensor(positions, device=x.device)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be ints (or floats), got {positions.dtype}")
    try:
        ok = positions.dim() >= 1 and torch.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"positions of shape {tuple(positions.shape)} must be (T,) = ({T},) or broadcast to "
            f"x.shape[:-1] = {tuple(x.shape[:-1])}"
        )
    if inv_freq is None:
        freqs = _inverse_frequencies(D, base, torch.float64, x.device)  # (D/2,)
    else:
        if not isinstance(inv_freq, torch.Tensor) or not inv_freq.dtype.is_floating_point:
            raise TypeError(f"inv_freq must be a floating-point torch.Tensor, got {type(inv_freq).__name__}")
        if tuple(inv_freq.shape) != (D // 2,):
            raise ValueError(f"inv_freq must be (D/2,) = ({D // 2},), one frequency per pair of x {shape_str(x)}; "
                             f"got {shape_str(inv_freq)}")
        freqs = inv_freq.to(device=x.device, dtype=torch.float64)  # (D/2,)
    if isinstance(attention_factor, bool) or not isinstance(attention_factor, (int, float)) or not attention_factor > 0:
        raise ValueError(f"attention_factor must be a positive number, got {attention_factor!r}")
    angles = positions.to(torch.float64)[..., None] * freqs  # (..., T, D/2)
    cos = (torch.cos(angles) * attention_factor).to(work)  # (..., T, D/2)
    sin = (torch.sin(angles) * attention_factor).to(work)  # (..., T, D/2)
    xw = x.to(work)
    if interleaved:
        x1, x2 = xw[..., 0::2], xw[..., 1::2]  # (..., T, D/2) each
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, D/2, 2)
        out = out.flatten(-2)  # (..., T, D)
    else:
        x1, x2 = xw[..., : D // 2], xw[..., D // 2 :]  # (..., T, D/2) each
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., T, D)
    return out.to(x.dtype)


def rotary_permutation(D: int, *, inverse: bool = False, device: Device = None) -> torch.Tensor:
    """Index permutation (int64, length D) between the two RoPE pairings.

    ``perm = [0, 2, 4, ..., D-2, 1, 3, ..., D-1]`` takes the interleaved layout to
    the half-split one: feature ``2i`` goes to ``i`` and ``2i + 1`` to ``i + D/2``, so

        apply_rotary(x, interleaved=True)[..., perm] == apply_rotary(x[..., perm], interleaved=False)

    ``inverse=True`` gives the way back (``argsort(perm)``). Applied to the
    rows of the query and key projection weights (per head) it converts a
    checkpoint from one convention to the other; scores are unchanged because
    a dot product does not care about the order of the features.
    """
    D = check_int("D", D)
    if D % 2:
        raise ValueError(f"RoPE pairs features, so D must be even; got D={D}")
    perm = torch.cat((torch.arange(0, D, 2, device=device), torch.arange(1, D, 2, device=device)))  # (D,)
    return torch.argsort(perm) if inverse else perm


# ---------------------------------------------------------------------------
# RoPE for long contexts: position interpolation (Chen et al., 2023), NTK-aware
# scaling (bloc97, 2023) and YaRN (Peng et al., 2023)
# ---------------------------------------------------------------------------

#: The ``rope_type`` values :func:`rope_frequencies` knows (Hugging Face's names).
ROPE_TYPES = ("default", "linear", "yarn")

_ROPE_KEYS = {
    "default": ({"rope_type", "rope_theta"}, set()),
    "linear": ({"rope_type", "rope_theta", "factor"}, set()),
    "yarn": ({"rope_type", "rope_theta", "factor", "original_max_position_embeddings"},
             {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"}),
}
# keys a config may carry next to these, which set nothing here (partial_rotary_factor is the layer's)
_ROPE_IGNORED = {"partial_rotary_factor", "type", "max_position_embeddings"}


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's temperature ``0.1 * mscale * ln(scale) + 1`` (1 when ``scale <= 1``): the factor by which
    YaRN multiplies queries and keys (Peng et al. 2023, eq. 22 with ``sqrt(1/t) = 0.1 ln(s) + 1``).
    DeepSeek's ``mscale`` / ``mscale_all_dim`` are its second argument: DeepSeek-V3 multiplies its
    softmax scale by ``yarn_mscale(40, 1.0) ** 2 = 1.874``."""
    for name, value in (("scale", scale), ("mscale", mscale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0 (a context extension factor), got {scale!r}")
    return 1.0 if scale <= 1 else 0.1 * float(mscale) * math.log(scale) + 1.0


def _correction_dim(num_rotations: float, dim: int, base: float, original_max_position_embeddings: int) -> float:
    """The (fractional) feature index 2i whose pair turns ``num_rotations`` times over the original context."""
    return dim * math.log(original_max_position_embeddings / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_ramp(dim: int, base: float, original_max_position_embeddings: int, *, beta_fast: float = 32.0,
              beta_slow: float = 1.0, truncate: bool = True) -> torch.Tensor:
    """YaRN's share of interpolation for each of the ``dim / 2`` pairs (float64, in [0, 1]).

    Pair i has wavelength ``2 pi / base^(-2i / dim)`` and turns ``L / wavelength`` times over the
    original context ``L = original_max_position_embeddings``. Pairs that turn more than ``beta_fast``
    times (the fast, high-frequency ones, low i) get 0: they are kept as trained (extrapolated, they
    saw every angle during training). Pairs that turn fewer than ``beta_slow`` times get 1: fully
    interpolated (their frequency divided by the factor, as position interpolation does). Between
    the two bounds (``low``, ``high``: the pair indices where the rotation counts are ``beta_fast`` and
    ``beta_slow``; rounded outwards with ``truncate``) the share rises linearly. As Hugging Face's
    ``_compute_yarn_parameters``: ``inv_freq = inv_freq / factor * ramp + inv_freq * (1 - ramp)``.
    """
    dim = check_int("dim", dim)
    if dim % 2:
        raise ValueError(f"RoPE rotates pairs of features, so dim must be even; got dim={dim}")
    base = _check_base(base)
    original = check_int("original_max_position_embeddings", original_max_position_embeddings)
    for name, value in (("beta_fast", beta_fast), ("beta_slow", beta_slow)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number of rotations, got {value!r}")
    if beta_fast < beta_slow:
        raise ValueError(f"beta_fast={beta_fast} must be >= beta_slow={beta_slow} (fast pairs turn more often)")
    if not isinstance(truncate, bool):
        raise TypeError(f"truncate must be a bool, got {type(truncate).__name__} {truncate!r}")
    low = _correction_dim(beta_fast, dim, base, original)
    high = _correction_dim(beta_slow, dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as Hugging Face: no division by zero
    i = torch.arange(dim // 2, dtype=torch.float64)  # (D/2,)
    return ((i - low) / (high - low)).clamp(0.0, 1.0)  # (D/2,)


def _rope_number(rope: Mapping[str, Any], key: str, minimum: float) -> float:
    value = rope[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"rope_parameters[{key!r}] must be a number, got {type(value).__name__} {value!r}")
    if not value >= minimum:
        raise ValueError(f"rope_parameters[{key!r}] must be >= {minimum}, got {value!r}")
    return float(value)


def rope_frequencies(dim: int, rope_parameters: Mapping[str, Any] | None = None, *,
                     device: Device = None) -> tuple[torch.Tensor, float]:
    """RoPE's inverse frequencies ``(dim/2,)`` (float64) and attention factor for a config's
    ``rope_parameters`` (Hugging Face 5.x's name; its older ``rope_scaling`` dict plus ``rope_theta``).

    ``dim`` is the number of rotated features (a head's, or ``int(head_dim * partial_rotary_factor)``).
    ``rope_parameters`` (``None``: plain RoPE with base 10000) holds ``rope_type`` (or the older
    ``type``), ``rope_theta`` (the base, default 10000) and, by type:

    * ``"default"``: ``inv_freq_i = base^(-2i / dim)``, attention factor 1;
    * ``"linear"`` (position interpolation, Chen et al. 2023): every frequency divided by ``factor``,
      i.e. positions divided by ``factor``; attention factor 1;
    * ``"yarn"`` (Peng et al. 2023): per pair, ``inv_freq / factor`` blended with ``inv_freq`` by
      :func:`yarn_ramp` (``original_max_position_embeddings``, ``beta_fast`` default 32, ``beta_slow``
      default 1, ``truncate`` default True); attention factor ``attention_factor`` if given, else
      ``yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)`` when both are set
      (DeepSeek: 1.0 / 1.0 = 1; its temperature goes into the softmax scale instead), else
      ``yarn_mscale(factor)`` (gpt-oss, factor 32: 1.347).

    An unknown ``rope_type``, a ``factor`` below 1, a missing or unknown key raise a ``ValueError``
    naming it. The frequencies equal transformers' ``ROPE_INIT_FUNCTIONS`` (which computes them in
    float32).
    """
    dim = check_int("dim", dim)
    if dim % 2:
        raise ValueError(f"RoPE rotates pairs of features, so dim must be even; got dim={dim}")
    rope: dict[str, Any] = {} if rope_parameters is None else dict(_check_rope_mapping(rope_parameters))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in _ROPE_KEYS:
        raise ValueError(f"rope_parameters['rope_type'] = {rope_type!r} is not supported; attnbook knows "
                         f"{', '.join(ROPE_TYPES)}")
    rope.setdefault("rope_type", rope_type)
    rope.setdefault("rope_theta", 10000.0)
    required, optional = _ROPE_KEYS[rope_type]
    missing = sorted(required - set(rope))
    if missing:
        raise ValueError(f"rope_parameters of rope_type {rope_type!r} is missing {missing} "
                         f"(it needs {sorted(required)})")
    unknown = sorted(set(rope) - required - optional - _ROPE_IGNORED)
    if unknown:
        raise ValueError(f"rope_parameters has keys {unknown} that rope_type {rope_type!r} does not use "
                         f"(it takes {sorted(required | optional)})")
    base = rope["rope_theta"]
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"rope_parameters['rope_theta'] must be a number > 1, got {base!r}")
    inv_freq = _inverse_frequencies(dim, float(base), torch.float64, device)  # (D/2,)
    if rope_type == "default":
        return inv_freq, 1.0
    factor = _rope_number(rope, "factor", 1.0)
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    original = rope["original_max_position_embeddings"]
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
        if rope.get(key) is not None:
            _rope_number(rope, key, 0.0)
    ramp = yarn_ramp(dim, float(base), original, beta_fast=float(rope.get("beta_fast") or 32.0),
                     beta_slow=float(rope.get("beta_slow") or 1.0),
                     truncate=bool(rope.get("truncate", True))).to(device)  # (D/2,): 1 = interpolated
    blended = inv_freq / factor * ramp + inv_freq * (1.0 - ramp)  # (D/2,)
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    return blended, float(attention_factor)


def _check_rope_mapping(rope_parameters: object) -> Mapping[str, Any]:
    if not isinstance(rope_parameters, Mapping):
        raise TypeError(f"rope_parameters must be a mapping (a config's rope_parameters), "
                        f"got {type(rope_parameters).__name__}")
    return rope_parameters


# ---------------------------------------------------------------------------
# ALiBi (Press et al., 2022)
# ---------------------------------------------------------------------------


def _slopes_power_of_two(n: int) -> list[float]:
    return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]


def alibi_slopes(num_heads: int, *, dtype: torch.dtype = torch.float32, device: Device = None) -> torch.Tensor:
    """The per-head slopes ``(H,)`` of ALiBi.

    For ``H`` a power of two: ``2^(-8 i / H)`` for ``i = 1 .. H`` (8 heads:
    1/2, 1/4, ..., 1/256). Otherwise, with ``n`` the largest power of two below
    ``H``: the ``n`` slopes for ``n`` heads, followed by the first ``H - n`` of
    every other slope (``[0::2]``) of the ``2n``-head sequence, as in the ALiBi
    authors' reference code.
    """
    num_heads = check_int("num_heads", num_heads)
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _slopes_power_of_two(n)
    if n < num_heads:
        slopes += _slopes_power_of_two(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=dtype, device=device)


def alibi_bias(
    num_heads: int,
    T: int,
    S: int | None = None,
    *,
    causal: bool = True,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """ALiBi's float bias ``(H, T, S)``: ``-slope_h * distance``, to pass as the
    float ``mask`` of :func:`attnbook.scaled_dot_product_attention` (it
    broadcasts with the scores ``(B, H, T, S)``).

    The queries are the last T of the S positions: query ``i`` sits at
    position ``i + S - T`` (``S`` defaults to ``T``), so the distance to key
    ``j`` is ``i + S - T - j``.

    ``causal=True`` (ALiBi's decoder setting; needs ``S >= T``): keys at or
    before the query get ``-slope * distance`` (0 for the query's own position)
    and keys after it get ``torch.finfo(dtype).min``, so this bias alone is
    both the positional bias and the causal mask. ``causal=False`` gives the
    symmetric ``-slope * |distance|`` for every key (a common bidirectional
    variant, not in the paper). Pass the ``dtype`` of the scores (e.g.
    ``torch.float16``) so the blocked value is that dtype's minimum.
    """
    num_heads = check_int("num_heads", num_heads)
    T = check_int("T", T)
    S = T if S is None else check_int("S", S)
    if causal and S < T:
        raise ValueError(
            f"a causal ALiBi bias puts the T={T} queries at the last T of the S={S} key positions, so it needs S >= T"
        )
    slopes = alibi_slopes(num_heads, dtype=torch.float64, device=device)  # (H,)
    query_pos = torch.arange(T, device=device) + (S - T)  # (T,)
    key_pos = torch.arange(S, device=device)  # (S,)
    distance = (query_pos[:, None] - key_pos[None, :]).to(torch.float64)  # (T, S)
    bias = -slopes[:, None, None] * distance.abs()[None] + 0.0  # (H, T, S); + 0.0 turns -0.0 into 0.0
    bias = bias.to(dtype)
    if causal:
        bias = bias.masked_fill((distance < 0)[None], torch.finfo(dtype).min)  # (H, T, S)
    return bias
