"""Tests for attnbook.efficient.decayed_linear_attention: its three forms agree, gamma = 1 is causal linear
attention, the decay acts as its definition says, and bad input names the problem.

Dimension legend: B batch, H heads, T length, D head dim, Dv value head dim. Unless said, q and k are
(2, 3, T, 8) and v (2, 3, T, 5): three heads, each with its own gamma in the per-head tests.
"""

from __future__ import annotations

import pytest
import torch

from attnbook.efficient import (
    DECAYED_METHODS,
    decayed_linear_attention,
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
)
from tests.helpers import qkv


def definition(q, k, v, gamma, eps=1e-6):
    """out_t = sum_{j<=t} gamma^(t-j) phi(q_t).phi(k_j) v_j / (sum_{j<=t} gamma^(t-j) phi(q_t).phi(k_j) + eps),
    written with loops over t and j."""
    B, H, T, _ = q.shape
    g = torch.as_tensor(gamma, dtype=q.dtype).expand(H).view(1, H, 1)
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    out = torch.zeros(B, H, T, v.shape[-1], dtype=q.dtype)
    for t in range(T):
        num = torch.zeros(B, H, v.shape[-1], dtype=q.dtype)
        den = torch.zeros(B, H, 1, dtype=q.dtype)
        for j in range(t + 1):
            w = (fq[:, :, t] * fk[:, :, j]).sum(-1, keepdim=True) * g ** (t - j)  # (B, H, 1)
            num += w * v[:, :, j]
            den += w
        out[:, :, t] = num / (den + eps)
    return out


@pytest.mark.parametrize("gamma", [0.5, 0.9, 1.0, "per-head"])
@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64])
def test_three_forms_agree(gamma, chunk_size):
    q, k, v = qkv(2, 3, 37, 8, Dv=5)
    g = torch.tensor([0.3, 0.8, 1.0], dtype=torch.float64) if gamma == "per-head" else gamma
    ref = decayed_linear_attention(q, k, v, g, method="parallel")
    for method in ("recurrent", "chunkwise"):
        out = decayed_linear_attention(q, k, v, g, method=method, chunk_size=chunk_size)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_matches_the_definition():
    q, k, v = qkv(2, 3, 9, 8, Dv=5)
    for gamma in (0.6, torch.tensor([0.2, 0.7, 1.0], dtype=torch.float64)):
        torch.testing.assert_close(decayed_linear_attention(q, k, v, gamma), definition(q, k, v, gamma))


def test_gamma_one_is_causal_linear_attention():
    q, k, v = qkv(2, 3, 50, 8, Dv=5)
    for method in DECAYED_METHODS:
        out = decayed_linear_attention(q, k, v, 1.0, method=method, chunk_size=16)
        torch.testing.assert_close(out, linear_attention(q, k, v, causal=True), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(out, linear_attention_recurrent(q, k, v), rtol=1e-10, atol=1e-10)


def test_float32_long_sequence_no_overflow():
    """gamma^(i-j) underflows to 0 far back instead of overflowing; chunked and parallel still agree."""
    q, k, v = qkv(1, 2, 600, 8, Dv=5, dtype=torch.float32)
    for gamma in (0.5, 0.99):
        a = decayed_linear_attention(q, k, v, gamma, method="parallel")
        b = decayed_linear_attention(q, k, v, gamma, chunk_size=128)
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_small_gamma_forgets():
    """With a tiny gamma the output at t is (nearly) v_t itself: the state holds almost only the last step."""
    q, k, v = qkv(2, 3, 20, 8, Dv=5)
    out = decayed_linear_attention(q, k, v, 1e-6)
    torch.testing.assert_close(out, v, rtol=1e-4, atol=1e-4)


def test_causal():
    """Changing the future does not change the past."""
    q, k, v = qkv(2, 3, 30, 8, Dv=5)
    out = decayed_linear_attention(q, k, v, 0.8)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 20:] += 1.0
    v2[:, :, 20:] -= 3.0
    out2 = decayed_linear_attention(q, k2, v2, 0.8, chunk_size=8)
    torch.testing.assert_close(out2[:, :, :20], out[:, :, :20])


def test_gradients_flow():
    q, k, v = (t.requires_grad_() for t in qkv(2, 3, 12, 8, Dv=5))
    decayed_linear_attention(q, k, v, 0.9, chunk_size=5).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_bad_input():
    q, k, v = qkv(2, 3, 10, 8, Dv=5)
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
        decayed_linear_attention(q, k, v, 0.0)
    with pytest.raises(ValueError, match=r"gamma must be in \(0, 1\]"):
        decayed_linear_attention(q, k, v, 1.5)
    with pytest.raises(ValueError, match=r"\(H,\) = \(3,\), got shape \(2\)"):
        decayed_linear_attention(q, k, v, torch.tensor([0.5, 0.5]))
    with pytest.raises(TypeError, match="gamma must be a float"):
        decayed_linear_attention(q, k, v, "0.5")
    with pytest.raises(TypeError, match="gamma must be a float"):
        decayed_linear_attention(q, k, v, True)
    with pytest.raises(ValueError, match="method must be one of"):
        decayed_linear_attention(q, k, v, 0.5, method="fast")
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        decayed_linear_attention(q, k, v, 0.5, chunk_size=2.0)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        decayed_linear_attention(q, k, v, 0.5, chunk_size=0)
    with pytest.raises(ValueError, match=r"same length, got T=10 and S=4"):
        decayed_linear_attention(q, k[:, :, :4], v[:, :, :4], 0.5)
    with pytest.raises(ValueError, match=r"must be 4-D"):
        decayed_linear_attention(q[0], k[0], v[0], 0.5)
