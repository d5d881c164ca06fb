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
from numbers import Real

import torch
import torch.nn.functional as F

from ._checks import check_prob, shape_str

__all__ = ["scaled_dot_product_attention", "masked_softmax", "fully_masked_rows", "check_scale", "check_mask",
           "check_qkv", "softmax_stats"]


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


def check_scale(scale: float | None, D: int) -> float:
    """The factor the scores ``q . k`` are multiplied by: ``1 / sqrt(D)`` when ``scale`` is None (D: the head
    dim), else ``scale`` as a float. ``TypeError`` unless it is a real number (not a bool), ``ValueError``
    unless it is positive and finite."""
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, Real):
        raise TypeError(f"scale must be a positive float or None, got {type(scale).__name__} {scale!r}")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be positive, got {scale}")
    return float(scale)


def fully_masked_rows(mask: torch.Tensor) -> torch.Tensor:
    """Bool ``(..., T, 1)``: True for a query row of the bool mask ``(..., T, S)`` (True = may attend) that
    allows no key, the rows whose weights and output are zero by attnbook's convention."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool torch.Tensor (True = may attend), got {getattr(mask, 'dtype', type(mask).__name__)}")
    if mask.dim() < 1:
        raise ValueError(f"mask must have at least 1 dim (..., S), got shape {shape_str(mask)}")
    if mask.shape[-1] == 0:  # no keys at all
        return torch.ones((*mask.shape[:-1], 1), dtype=torch.bool, device=mask.device)
    # as uint8 (a view): on a CPU its max is vectorised, many times faster than a bool any()
    return mask.view(torch.uint8).amax(dim=-1, keepdim=True) == 0  # (..., T, 1)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None, *, inplace: bool = False) -> torch.Tensor:
    """Softmax of ``scores (..., T, S)`` over the keys (the last dim), under attnbook's mask convention.

    Args:
        scores: floating-point scores ``(..., T, S)``.
        mask: ``None``; or bool, broadcastable to the scores, True = may attend: a blocked score counts as
            ``torch.finfo(scores.dtype).min`` (its weight is exactly 0); or float, added to the scores.
        inplace: add the mask to ``scores`` itself instead of to a copy: saves a tensor of the scores' size
            (on a CPU, allocating it costs as much as the softmax). For a caller whose scores are a
            temporary of its own, whose values it then no longer needs (never a leaf that requires grad).

    Returns:
        The weights, in the scores' dtype, computed in at least float32 (float16 and bfloat16 lose too much
        in exp()). Each row sums to 1, except a row whose keys are all blocked, which is all zeros (not
        NaN, and its gradient is finite: zero).

    How, and why so: a bool mask becomes an additive bias, 0 where allowed and ``finfo.min`` where blocked
    (``(mask - 1) * finfo.max``, float arithmetic on the mask), added to the scores: on a CPU
    ``scores + bias`` is several times faster than ``masked_fill`` with a broadcast bool mask. A sum that
    rounds down to -inf (a score below about -1e31 in float32) still gets weight 0. The rows with no
    allowed key are found on the mask (:func:`fully_masked_rows`, no larger than the mask), left unmasked
    so that their softmax stays finite, and set to zero afterwards: on a CPU that pass over the weights runs
    only when there is such a row (on a GPU, where asking would wait for the device, it always runs). A float mask blocks a row when every masked score of it is at most
    ``finfo.min / 2`` (-inf included).
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.dtype.is_floating_point:
        raise TypeError(f"scores must be a floating-point tensor, got {scores.dtype}")
    if scores.dim() < 1:
        raise ValueError(f"scores must have at least 1 dim (..., S), got shape {shape_str(scores)}")
    dtype = scores.dtype
    work = torch.promote_types(dtype, torch.float32)
    if work != dtype:
        scores, inplace = scores.to(work), True  # (..., T, S) a copy of our own in float32
    blocked = None  # (..., T, 1) rows with no key to attend to, when there are any
    # on a CPU, look whether any row is fully blocked and skip the zeroing pass when none is; on a GPU the
    # look would wait for the device, so the pass always runs there
    ask = scores.device.type == "cpu"
    if mask is not None:
        check_mask(mask, scores.shape)
        mask = mask.to(scores.device).reshape(mask.shape or (1,))  # a 0-d mask as (1,): it has a last dim
        if mask.dtype == torch.bool:
            none = fully_masked_rows(mask)  # (..., T, 1), no larger than the mask
            if not ask or bool(none.any()):
                blocked = none
                mask = mask | blocked  # unmasked here (finite scores), zeroed below
            # 0 or finfo(dtype).min, mask-sized; bool -> uint8 is a view, and uint8 -> float is vectorised
            bias = mask.view(torch.uint8).to(work).sub_(1.0).mul_(torch.finfo(dtype).max)
        else:
            bias = mask.to(work)
        scores = scores.add_(bias) if inplace else scores + bias  # (..., T, S)
        if mask.dtype != torch.bool:
            # a float mask may block with -inf or with finfo.min (see masks.to_additive); a row whose every
            # score is that low has no key to attend to: give it finite scores, zero its weights below
            low = scores.amax(dim=-1, keepdim=True) <= torch.finfo(dtype).min / 2  # (..., T, 1)
            if not ask or bool(low.any()):
                blocked = low
                scores = scores.masked_fill_(blocked, 0.0)  # our own tensor by now: in place
    weights = F.softmax(scores, dim=-1).to(dtype)  # (..., T, S)
    if blocked is not None:
        weights = weights.masked_fill(blocked, 0.0) if weights.requires_grad else weights.masked_fill_(blocked, 0.0)
    return weights


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
    scale = check_scale(scale, q.shape[-1])
    if mask is not None:
        check_mask(mask, scores_shape)

    # the scale goes on q (T x D numbers) rather than on the scores (T x S)
    scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (..., T, S)
    weights = masked_softmax(scores, mask, inplace=True)  # (..., T, S)
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
