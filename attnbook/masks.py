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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.types import Device

from ._checks import check_int

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


