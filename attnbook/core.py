"""Scaled dot-product attention, written out so every step can be read.

Dimension legend used throughout attnbook:
    B  batch size
    H  number of heads
    T  query length (target)
    S  key/value length (source)
    D  head dimension (d_k for queries and keys, Dv for values)
    E  model dimension (d_model = H * D)

Mask convention (the same everywhere in the package): a bool mask is True
where a query **may attend** to a key, exactly as in
``torch.nn.functional.scaled_dot_product_attention``. A float mask is added to
the scores (ALiBi slopes, relative position biases). Blocked scores are filled
with ``torch.finfo(dtype).min``, never a fixed literal such as minus 10^9 (which overflows
float16), and a query whose keys are all blocked gets zero weights and a zero
output instead of NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._checks import check_prob, shape_str
from ._compat import default_device

__all__ = ["scaled_dot_product_attention", "default_device", "check_mask", "check_qkv", "softmax_stats"]


def check_mask(mask: torch.Tensor, scores_shape: torch.Size) -> None:
    """Raise a clear error when ``mask`` is not a bool/float tensor that
    broadcasts to ``scores_shape`` = (..., T, S)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise TypeError(
            f"mask must be bool (True = may attend) or float (added to the scores), "
            f"got {mask.dtype}; convert a 0/1 mask with mask.bool() (1 = may attend)"
        )
    try:
        shape = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        shape = None
    if shape != scores_shape:
        target = "(" + ", ".join(str(s) for s in scores_shape) + ")"
        raise ValueError(
            f"mask of shape {shape_str(mask)} does not broadcast to the scores' shape "
            f"{target} = (..., T, S)"
        )


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Size:
    """Raise a clear error unless q ``(..., T, D)``, k ``(..., S, D)`` and v ``(..., S, Dv)`` are
    floating-point tensors of one dtype whose leading dims broadcast; return the scores' shape
    ``(..., T, S)``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., length, dim), got shape {shape_str(t)}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dim D: q is {shape_str(q)} (D={q.shape[-1]}), "
            f"k is {shape_str(k)} (D={k.shape[-1]})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length S: k is {shape_str(k)} (S={k.shape[-2]}), "
            f"v is {shape_str(v)} (S={v.shape[-2]})"
        )
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch/head) dims of q {shape_str(q)}, k {shape_str(k)} and v {shape_str(v)} "
            f"do not broadcast"
        ) from None
    return torch.Size((*batch, q.shape[-2], k.shape[-2]))


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + mask) v, returning the output and the weights.

    Args:
        q: queries ``(..., T, D)``.
        k: keys ``(..., S, D)``.
        v: values ``(..., S, Dv)``.
        mask: bool, broadcastable to ``(..., T, S)``, True = may attend; or a
            float tensor added to the scores (e.g. an ALiBi bias).
        scale: multiplies the scores; defaults to ``1 / sqrt(D)``.
        dropout_p: dropout on the weights (only when > 0). The returned
            weights are the ones actually used, i.e. after dropout, as in
            ``torch.nn.MultiheadAttention``.

    Returns:
        ``(out, weights)`` with out ``(..., T, Dv)`` and weights ``(..., T, S)``.
        Rows of ``weights`` sum to 1, except rows whose keys are all masked,
        which are all zeros (and so is their output).
    """
    scores_shape = check_qkv(q, k, v)
    check_prob("dropout_p", dropout_p)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")

    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (..., T, S)
    blocked_rows = None
    if mask is not None:
        check_mask(mask, scores_shape)
        mask = mask.to(scores.device)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            blocked_rows = ~mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        else:
            scores = scores + mask.to(scores.dtype)
    if blocked_rows is None:
        # a float mask may block with -inf or with finfo.min (see masks.to_additive);
        # a row whose every score is that low has no keys to attend to
        blocked_rows = scores.amax(dim=-1, keepdim=True) <= torch.finfo(scores.dtype).min / 2
        # softmax of an all -inf row is NaN, and so would be its gradient: give
        # such rows finite scores here; their weights are zeroed just below
        scores = scores.masked_fill(blocked_rows, 0.0)

    # softmax in at least float32: float16/bfloat16 lose too much in exp()
    weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(scores.dtype).masked_fill(blocked_rows, 0.0)  # (..., T, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.matmul(weights, v)  # (..., T, Dv)
    return out, weights


def softmax_stats(logits: torch.Tensor) -> dict[str, float]:
    """Entropy, largest weight and softmax-Jacobian norm for logits (B, T), averaged over B.

    The Jacobian of p = softmax(z) is diag(p) - p p^T; its Frobenius norm is how
    much the weights can still move when the logits move: near 0 means
    saturated (vanishing gradients).
    """
    p = torch.softmax(logits.double(), dim=-1)  # (B, T)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (B,)
    jac = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # (B, T, T)
    grad_norm = jac.flatten(1).norm(dim=-1)  # (B,)
    return {
        "entropy": entropy.mean().item(),
        "max_weight": p.max(-1).values.mean().item(),
        "grad_norm": grad_norm.mean().item(),
    }
