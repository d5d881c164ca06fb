"""Tests for attnbook.efficient: exact methods against masked exact attention and
PyTorch, approximations against their own definitions and their error trends.

Dimension legend: B batch, H heads, T query length, S key length, D head dim.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnbook.efficient as eff
from attnbook import causal_mask, scaled_dot_product_attention, sliding_window_mask
from attnbook.efficient import (
    bigbird_block_pattern,
    bigbird_pattern,
    block_sparse_attention,
    elu_feature_map,
    flash_attention,
    linear_attention,
    linear_attention_quadratic,
    linear_attention_recurrent,
    lsh_attention,
    lsh_buckets,
    performer_attention,
    performer_feature_map,
    performer_features,
    sliding_window_attention,
)
from attnbook.measure import TensorMemoryTracker
from tests.helpers import qkv, randn


def largest_tensor_bytes(fn) -> int:
    """Bytes of the largest tensor storage ``fn()`` allocates (attnbook.measure.TensorMemoryTracker)."""
    with TensorMemoryTracker() as probe:
        fn()
    return probe.largest


F32 = 4  # bytes per float32 element: the bounds below count elements


# ----------------------------------------------------------------------------- sliding window


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "B, H, T, D, window, block_size",
    [
        (1, 1, 1, 4, 0, None),
        (2, 3, 37, 8, 0, None),
        (2, 2, 37, 8, 3, None),
        (1, 2, 50, 4, 7, 5),  # T not a multiple of the block
        (1, 1, 33, 4, 4, 1),
        (2, 1, 20, 6, 50, None),  # window wider than the sequence: full attention
        (1, 2, 64, 8, 16, 16),
        (1, 1, 45, 4, 2, 64),  # block longer than the sequence
    ],
)
def test_sliding_window_equals_masked_exact(B, H, T, D, window, block_size, causal):
    q, k, v = qkv(B, H, T, D, Dv=D + 1)
    mask = sliding_window_mask(T, window, causal=causal)
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    out = sliding_window_attention(q, k, v, window, causal=causal, block_size=block_size)
    assert out.shape == (B, H, T, D + 1)
    torch.testing.assert_close(out, ref)


@settings(max_examples=25, deadline=None)
@given(
    T=st.integers(1, 40),
    window=st.integers(0, 12),
    block_size=st.one_of(st.none(), st.integers(1, 20)),
    causal=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_sliding_window_property(T, window, block_size, causal, seed):
    q, k, v = qkv(1, 2, T, 4, seed=seed)
    out = sliding_window_attention(q, k, v, window, causal=causal, block_size=block_size)
    ref, _ = scaled_dot_product_attention(q, k, v, sliding_window_mask(T, window, causal=causal))
    torch.testing.assert_close(out, ref)
    # rows of the weights sum to one: constant values come back unchanged
    ones = torch.ones_like(v)
    torch.testing.assert_close(sliding_window_attention(q, k, ones, window, causal=causal), ones)


def test_sliding_window_float32_and_scale():
    q, k, v = qkv(2, 2, 29, 8, dtype=torch.float32)
    ref, _ = scaled_dot_product_attention(q, k, v, sliding_window_mask(29, 4), scale=0.3)
    out = sliding_window_attention(q, k, v, 4, scale=0.3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_gradients_equal_exact(causal):
    q, k, v = qkv(1, 2, 23, 4)
    grads = []
    for fn in (
        lambda q, k, v: sliding_window_attention(q, k, v, 3, causal=causal, block_size=4),
        lambda q, k, v: scaled_dot_product_attention(q, k, v, sliding_window_mask(23, 3, causal=causal))[0],
    ):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        (fn(*leaves) * torch.linspace(-1, 1, 4, dtype=torch.float64)).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want)


def test_sliding_window_never_builds_t_by_t():
    T, window = 1024, 8
    q, k, v = qkv(1, 1, T, 4, dtype=torch.float32)
    largest = largest_tensor_bytes(lambda: sliding_window_attention(q, k, v, window))
    assert largest < T * T // 8 * F32  # a band is T * (block + 2 * window) = T * 48


def test_sliding_window_errors():
    q, k, v = qkv(1, 2, 10, 4)
    with pytest.raises(ValueError, match="window must be an int >= 0, got -1"):
        sliding_window_attention(q, k, v, -1)
    with pytest.raises(TypeError, match="window must be an int"):
        sliding_window_attention(q, k, v, 2.5)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        sliding_window_attention(q, k, v, 2, block_size=0)
    k2, v2 = randn(1, 2, 12, 4), randn(1, 2, 12, 4)
    with pytest.raises(ValueError, match=r"T=10 and S=12"):
        sliding_window_attention(q, k2, v2, 2)
    with pytest.raises(ValueError, match=r"same head dim D.*D=4.*D=5"):
        sliding_window_attention(q, randn(1, 2, 10, 5), v, 2)
    with pytest.raises(ValueError, match=r"must be 4-D.*\(10, 4\)"):
        sliding_window_attention(q[0, 0], k[0, 0], v[0, 0], 2)
    with pytest.raises(ValueError, match=r"do not broadcast"):
        sliding_window_attention(q, randn(1, 3, 10, 4), randn(1, 3, 10, 4), 2)
    with pytest.raises(ValueError, match=r"share \(B, H\)"):  # no broadcasting of heads either
        sliding_window_attention(q, randn(1, 1, 10, 4), randn(1, 1, 10, 4), 2)
    with pytest.raises(TypeError, match="floating-point"):
        sliding_window_attention(q.long(), k.long(), v.long(), 2)


# ----------------------------------------------------------------------------- BigBird


def test_bigbird_block_pattern_structure():
    nb, w, g, r = 12, 1, 2, 2
    p = bigbird_block_pattern(nb, window_blocks=w, global_blocks=g, random_blocks=r, seed=5)
    assert p.shape == (nb, nb) and p.dtype == torch.bool
    assert p[:g].all() and p[:, :g].all()  # global rows and columns
    a = torch.arange(nb)
    band = (a[:, None] - a[None, :]).abs() <= w
    assert p[band].all()  # the window is always in
    extra = (p & ~band)[g:, g:].sum(dim=-1)  # random blocks of the non-global rows
    assert (extra == r).all()
    assert torch.equal(p, bigbird_block_pattern(nb, w, g, r, seed=5))  # deterministic
    assert not torch.equal(p, bigbird_block_pattern(nb, w, g, r, seed=6))


def test_bigbird_random_blocks_capped_by_free_blocks():
    p = bigbird_block_pattern(4, window_blocks=1, global_blocks=1, random_blocks=10)
    assert p.all()  # only one free block per row, and it is taken
    assert torch.equal(bigbird_block_pattern(3, 0, 0, 0), torch.eye(3, dtype=torch.bool))


def test_bigbird_pattern_expands_blocks():
    T, bs = 23, 5  # last block has 3 positions
    blocks = bigbird_block_pattern(5, 1, 1, 1, seed=2)
    mask = bigbird_pattern(T, bs, 1, 1, 1, seed=2)
    assert mask.shape == (T, T)
    for i in range(T):
        for j in range(T):
            assert mask[i, j] == blocks[i // bs, j // bs]


@pytest.mark.parametrize(
    "T, block_size, window_blocks, global_blocks, random_blocks, seed",
    [
        (37, 4, 1, 1, 1, 0),  # T not a multiple of the block
        (40, 8, 1, 1, 1, 3),
        (33, 3, 2, 2, 3, 1),
        (20, 4, 0, 0, 0, 0),  # block-diagonal only
        (20, 4, 0, 0, 2, 7),  # random blocks only
        (18, 4, 1, 9, 1, 0),  # everything global: dense
        (7, 16, 1, 1, 1, 0),  # one block
    ],
)
def test_block_sparse_equals_masked_exact(T, block_size, window_blocks, global_blocks, random_blocks, seed):
    q, k, v = qkv(2, 2, T, 8, Dv=6)
    mask = bigbird_pattern(T, block_size, window_blocks, global_blocks, random_blocks, seed)
    ref, _ = scaled_dot_product_attention(q, k, v, mask)
    out = block_sparse_attention(q, k, v, block_size, window_blocks, global_blocks, random_blocks, seed)
    torch.testing.assert_close(out, ref)


def test_block_sparse_gradients_and_size():
    q, k, v = qkv(1, 1, 25, 4)
    mask = bigbird_pattern(25, 4)
    leaves_a = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves_b = [t.clone().requires_grad_() for t in (q, k, v)]
    block_sparse_attention(*leaves_a, 4).square().sum().backward()
    scaled_dot_product_attention(*leaves_b, mask)[0].square().sum().backward()
    for a, b in zip(leaves_a, leaves_b):
        torch.testing.assert_close(a.grad, b.grad)
    T = 1024
    q, k, v = qkv(1, 1, T, 4, dtype=torch.float32)
    largest = largest_tensor_bytes(lambda: block_sparse_attention(q, k, v, 32))
    assert largest < T * T // 4 * F32  # global rows: 32 * T; others: T * 6 blocks * 32


def test_block_sparse_errors():
    q, k, v = qkv(1, 1, 12, 4)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        block_sparse_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="random_blocks must be an int >= 0, got -1"):
        block_sparse_attention(q, k, v, 4, random_blocks=-1)
    with pytest.raises(ValueError, match=r"T=12 and S=8"):
        block_sparse_attention(q, k[:, :, :8], v[:, :, :8], 4)
    with pytest.raises(ValueError, match="T must be an int >= 1, got 0"):
        bigbird_pattern(0, 4)


# ----------------------------------------------------------------------------- linear attention


@pytest.mark.parametrize("T, S, chunk_size", [(1, 1, 128), (17, 17, 4), (30, 30, 128), (16, 16, 16), (9, 21, 128)])
def test_linear_attention_forms_agree(T, S, chunk_size):
    q, k, v = qkv(2, 2, T, 5, S=S, Dv=3)
    torch.testing.assert_close(linear_attention(q, k, v, chunk_size=chunk_size), linear_attention_quadratic(q, k, v))
    if T == S:
        rnn = linear_attention_recurrent(q, k, v)
        for method in ("chunkwise", "cumsum"):
            out = linear_attention(q, k, v, causal=True, chunk_size=chunk_size, method=method)
            torch.testing.assert_close(out, rnn)
        torch.testing.assert_close(linear_attention_quadratic(q, k, v, causal=True), rnn)


def test_linear_attention_matches_its_definition():
    q, k, v = qkv(1, 1, 6, 3, Dv=2)
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    assert (elu_feature_map(q) > 0).all()
    x = torch.cat([q.flatten(), torch.tensor([0.0, -50.0, 50.0], dtype=torch.float64)]).requires_grad_()
    y = x.detach().clone().requires_grad_()
    torch.testing.assert_close(elu_feature_map(x), F.elu(y) + 1)
    elu_feature_map(x).sum().backward()
    (F.elu(y) + 1).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    i = 4
    num = sum(fq[0, 0, i] @ fk[0, 0, j] * v[0, 0, j] for j in range(6))
    den = sum(fq[0, 0, i] @ fk[0, 0, j] for j in range(6))
    torch.testing.assert_close(linear_attention(q, k, v)[0, 0, i], num / (den + 1e-6))
    num_c = sum(fq[0, 0, i] @ fk[0, 0, j] * v[0, 0, j] for j in range(i + 1))
    den_c = sum(fq[0, 0, i] @ fk[0, 0, j] for j in range(i + 1))
    torch.testing.assert_close(linear_attention(q, k, v, causal=True)[0, 0, i], num_c / (den_c + 1e-6))


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_rows_are_averages(causal):
    q, k, v = qkv(2, 2, 40, 8, dtype=torch.float32)
    ones = torch.ones_like(v)
    torch.testing.assert_close(linear_attention(q, k, ones, causal=causal, eps=0.0), ones)
    out = linear_attention(q * 30, k * 30, v, causal=causal)
    assert out.isfinite().all()
    assert (out <= v.amax(dim=2, keepdim=True) + 1e-4).all() and (out >= v.amin(dim=2, keepdim=True) - 1e-4).all()


def test_linear_attention_memory_is_linear():
    T = 2048
    q, k, v = qkv(1, 1, T, 8, dtype=torch.float32)
    for causal, method in ((False, "chunkwise"), (True, "chunkwise"), (True, "cumsum")):
        largest = largest_tensor_bytes(lambda c=causal, m=method: linear_attention(q, k, v, causal=c, chunk_size=32, method=m))
        assert largest <= T * 9 * F32  # inputs (+ a column of ones) and per-chunk tensors; never T * T


def test_linear_attention_errors():
    q, k, v = qkv(1, 1, 6, 3)
    with pytest.raises(ValueError, match=r"causal=True.*T=6 and S=4"):
        linear_attention(q, k[:, :, :4], v[:, :, :4], causal=True)
    with pytest.raises(ValueError, match=r"T=6 and S=4"):
        linear_attention_recurrent(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(ValueError, match="eps must be >= 0"):
        linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        linear_attention(q, k, v, causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="method must be one of"):
        linear_attention(q, k, v, causal=True, method="scan")
    with pytest.raises(ValueError, match=r"k and v must have the same length S"):
        linear_attention(q, k, v[:, :, :5])


# ----------------------------------------------------------------------------- Performer


def test_performer_features_orthogonal_and_seeded():
    D = 8
    w = performer_features(20, D, orthogonal=True, seed=3, dtype=torch.float64)
    assert w.shape == (20, D)
    torch.testing.assert_close(w, performer_features(20, D, True, seed=3, dtype=torch.float64))
    assert not torch.allclose(w, performer_features(20, D, True, seed=4, dtype=torch.float64))
    for block in (w[:8], w[8:16], w[16:]):  # rows of a block are orthogonal
        u = block / block.norm(dim=1, keepdim=True)
        torch.testing.assert_close(u @ u.T, torch.eye(len(block), dtype=torch.float64))
    assert not torch.allclose(w.norm(dim=1), w.norm(dim=1)[:1].expand(20))  # chi lengths, not all equal
    iid = performer_features(20, D, orthogonal=False, seed=3)
    assert iid.shape == (20, D) and iid.dtype == torch.float32


def test_performer_feature_map_estimates_exp_kernel():
    D, m = 4, 4096
    q, k = randn(3, D, seed=1, scale=0.5), randn(5, D, seed=2, scale=0.5)
    ests = []
    for seed in range(8):
        w = performer_features(m, D, seed=seed, dtype=torch.float64)
        x = q * D**-0.25
        y = k * D**-0.25
        fq = torch.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(m)
        fk = torch.exp(y @ w.T - 0.5 * (y * y).sum(-1, keepdim=True)) / math.sqrt(m)
        ests.append(fq @ fk.T)
        # the stabilised map differs from phi only by a per-query and a global key factor
        sq = performer_feature_map(q[None, None], w, is_query=True)[0, 0]
        sk = performer_feature_map(k[None, None], w, is_query=False)[0, 0]
        torch.testing.assert_close(sq / sq.sum(-1, keepdim=True), fq / fq.sum(-1, keepdim=True))
        torch.testing.assert_close(sk / sk.sum(), fk / fk.sum())
    est = torch.stack(ests).mean(0)
    torch.testing.assert_close(est, torch.exp(q @ k.T / math.sqrt(D)), rtol=0.05, atol=0.0)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_falls_with_more_features(causal):
    errors = {}
    for m in (16, 256, 1024):
        total = 0.0
        for trial in range(4):
            q, k, v = qkv(1, 2, 48, 8, seed=10 * trial)
            q, k = q * 0.5, k * 0.5
            exact = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out = performer_attention(q, k, v, num_features=m, seed=trial, causal=causal, chunk_size=16)
            assert out.isfinite().all()
            total += (out - exact).abs().mean().item()
        errors[m] = total / 4
    assert errors[16] > 1.5 * errors[256] > 1.5 * 1.2 * errors[1024], errors
    assert errors[1024] < 0.03, errors


def test_performer_stable_and_normalised():
    q, k, v = qkv(1, 2, 64, 16, dtype=torch.float32)
    out = performer_attention(q * 20, k * 20, v, num_features=32)  # exp would overflow without stabilising
    assert out.isfinite().all()
    ones = torch.ones_like(v)
    for causal in (False, True):
        torch.testing.assert_close(performer_attention(q, k, ones, causal=causal), ones)
    a = performer_attention(q, k, v, seed=1)
    torch.testing.assert_close(a, performer_attention(q, k, v, seed=1))
    assert not torch.allclose(a, performer_attention(q, k, v, seed=2))
    with pytest.raises(ValueError, match="num_features must be an int >= 1, got 0"):
        performer_attention(q, k, v, num_features=0)
    with pytest.raises(ValueError, match=r"projection must be \(m, D=16\)"):
        performer_feature_map(q, torch.randn(8, 4), is_query=True)


# ----------------------------------------------------------------------------- Reformer (LSH)


def shared_qk_reference(qk, v, causal):
    """Exact shared-QK attention: keys are the normalised qk, no self unless nothing else."""
    T = qk.shape[2]
    mask = ~torch.eye(T, dtype=torch.bool)
    if causal:
        mask &= causal_mask(T)
        mask[0, 0] = True  # position 0 has no one else
    return scaled_dot_product_attention(qk, F.normalize(qk, dim=-1), v, mask)[0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_buckets, n_hashes", [(1, 1), (1, 3), (4, 1), (8, 2)])
def test_lsh_one_chunk_is_exact_shared_qk(causal, n_buckets, n_hashes):
    qk, _, v = qkv(2, 2, 29, 8)
    out = lsh_attention(qk, v, n_buckets=n_buckets, chunk_size=32, n_hashes=n_hashes, causal=causal)
    torch.testing.assert_close(out, shared_qk_reference(qk, v, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_equals_masked_attention_over_sorted_chunks(causal):
    T, C = 45, 8
    qk, _, v = qkv(1, 2, T, 6, seed=4)
    out, buckets = lsh_attention(qk, v, n_buckets=4, chunk_size=C, seed=1, causal=causal, return_buckets=True)
    assert buckets.shape == (1, 2, 1, T)
    for h in range(2):
        order = sorted(range(T), key=lambda i: (int(buckets[0, h, 0, i]), i))
        chunk = torch.empty(T, dtype=torch.long)
        for rank, i in enumerate(order):
            chunk[i] = rank // C
        d = chunk[:, None] - chunk[None, :]  # query chunk - key chunk
        allowed = (d == 0) | (d == 1)
        if causal:
            allowed &= causal_mask(T)
        eye = torch.eye(T, dtype=torch.bool)
        others = allowed & ~eye
        mask = others | (eye & ~others.any(dim=-1, keepdim=True))
        ref, _ = scaled_dot_product_attention(qk[:, h], F.normalize(qk[:, h], dim=-1), v[:, h], mask)
        torch.testing.assert_close(out[:, h], ref)


def test_lsh_buckets_deterministic_in_seed():
    x = randn(2, 2, 64, 8)
    b = lsh_buckets(x, 8, n_hashes=3, seed=0)
    assert b.shape == (2, 2, 3, 64) and b.dtype == torch.long
    assert b.min() >= 0 and b.max() < 8
    assert torch.equal(b, lsh_buckets(x, 8, n_hashes=3, seed=0))
    assert not torch.equal(b, lsh_buckets(x, 8, n_hashes=3, seed=1))
    assert not torch.equal(b[:, :, 0], b[:, :, 1])  # rounds use different rotations
    assert torch.equal(lsh_buckets(x * 3.0, 8, n_hashes=3, seed=0), b)  # direction only
    # nearby directions share buckets more often than random pairs
    near = lsh_buckets(x + 0.05 * randn(2, 2, 64, 8, seed=9), 8, n_hashes=3, seed=0)
    assert (near == b).float().mean() > 0.8
    _, got = lsh_attention(x, x, seed=0, n_hashes=3, return_buckets=True)
    assert torch.equal(got, b)


def test_lsh_attention_finite_and_errors():
    qk, _, v = qkv(1, 2, 100, 8, dtype=torch.float32)
    for causal in (False, True):
        out = lsh_attention(qk * 10, v, n_buckets=8, chunk_size=16, n_hashes=2, causal=causal)
        assert out.shape == (1, 2, 100, 8) and out.isfinite().all()
        ones = torch.ones_like(v)
        torch.testing.assert_close(lsh_attention(qk, ones, n_hashes=2, causal=causal), ones)
    with pytest.raises(ValueError, match="n_buckets must be even"):
        lsh_attention(qk, v, n_buckets=3)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1, got 0"):
        lsh_attention(qk, v, chunk_size=0)
    with pytest.raises(ValueError, match=r"k and v must have the same length S"):
        lsh_attention(qk, v[:, :, :50])
    with pytest.raises(ValueError, match=r"must be 4-D \(B, H, T, D\), got shape \(100, 8\)"):
        lsh_buckets(qk[0, 0], 4)
    with pytest.raises(TypeError, match="floating-point"):
        lsh_buckets(qk.long(), 4)


# ----------------------------------------------------------------------------- FlashAttention


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "T, S, block_size, query_block_size",
    [(1, 1, 128, None), (37, 37, 8, None), (64, 64, 16, 16), (50, 50, 128, None), (37, 53, 8, 16),
     (53, 37, 10, 20), (5, 40, 3, None), (70, 45, 4, 8), (45, 70, 16, 32)],
)
def test_flash_equals_pytorch(T, S, block_size, query_block_size, causal, dtype):
    q, k, v = qkv(2, 3, T, 16, S=S, Dv=12, dtype=dtype)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = flash_attention(q, k, v, causal=causal, block_size=block_size, query_block_size=query_block_size)
    assert out.dtype == dtype
    tol = {} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(out, ref, **tol)


def test_flash_scale_and_large_scores():
    q, k, v = qkv(1, 2, 30, 8, dtype=torch.float32)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.7)
    torch.testing.assert_close(flash_attention(q, k, v, block_size=7, scale=0.7), ref, atol=1e-5, rtol=1e-5)
    big = flash_attention(q * 100, k * 100, v, block_size=7)  # the running max keeps exp finite
    torch.testing.assert_close(big, F.scaled_dot_product_attention(q * 100, k * 100, v), atol=1e-4, rtol=1e-4)


def _grads(fn, q, k, v, dout):
    """(out, dq, dk, dv) of ``fn(q, k, v)`` for the output gradient ``dout``."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return (out.detach(), *torch.autograd.grad(out, leaves, dout))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "T, S, block_size, query_block_size",
    [(21, 21, 6, None), (37, 53, 8, 16), (53, 37, 10, 20), (5, 40, 3, 3), (70, 45, 16, 16), (1, 9, 4, None),
     (100, 100, 128, None)],
)
def test_flash_gradients_equal_pytorch(T, S, block_size, query_block_size, causal, dtype):
    # T != S, sizes that are not multiples of either block, one query, one tile
    q, k, v = qkv(2, 3, T, 16, S=S, Dv=12, dtype=dtype)
    dout = randn(2, 3, T, 12, seed=7, dtype=dtype)  # a random output gradient, not the all-ones of .sum()
    got = _grads(lambda q, k, v: flash_attention(q, k, v, causal=causal, block_size=block_size,
                                                 query_block_size=query_block_size), q, k, v, dout)
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, dout)
    tol = {} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 1e-5}
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a, b, **tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T, S", [(7, 7), (5, 9), (9, 4)])
def test_flash_gradcheck(T, S, causal):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, T, 3, S=S, Dv=2))
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal=causal, block_size=2, query_block_size=4), (q, k, v)
    )


def test_flash_lse_gives_the_weights_and_the_backward_pass_by_hand():
    from attnbook.efficient import flash_attention_backward, flash_attention_with_lse

    T, S = 29, 41
    for causal in (False, True):
        q, k, v = qkv(2, 2, T, 8, S=S, Dv=5)
        out, lse = flash_attention_with_lse(q, k, v, causal=causal, block_size=8)
        assert lse.shape == (2, 2, T) and not lse.requires_grad
        scores = q @ k.transpose(-1, -2) / math.sqrt(8)  # (B, H, T, S)
        allowed = causal_mask(T, S) if causal else torch.ones(T, S, dtype=torch.bool)
        lowest = torch.finfo(scores.dtype).min
        torch.testing.assert_close(lse, torch.logsumexp(scores.masked_fill(~allowed, lowest), dim=-1))
        weights = torch.exp(scores - lse[..., None]) * allowed  # P = exp(s - lse): the weights, normalised
        torch.testing.assert_close(weights, torch.softmax(scores.masked_fill(~allowed, lowest), dim=-1))
        torch.testing.assert_close(out, weights @ v)
        dout = randn(2, 2, T, 5, seed=3)
        by_hand = flash_attention_backward(q, k, v, out, lse, dout, causal=causal, block_size=8)
        want = _grads(lambda q, k, v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c), q, k, v, dout)[1:]
        for a, b in zip(by_hand, want):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_low_precision_computes_in_float32(dtype):
    q, k, v = qkv(1, 2, 40, 8, dtype=torch.float32)
    dout = randn(1, 2, 40, 8, seed=5, dtype=torch.float32)
    low = _grads(lambda q, k, v: flash_attention(q, k, v, causal=True, block_size=8),
                 *(t.to(dtype) for t in (q, k, v, dout)))
    ref = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, dout)
    for a, b in zip(low, ref):
        assert a.dtype == dtype
        torch.testing.assert_close(a.float(), b, atol=5e-2, rtol=5e-2)


def test_flash_memory_is_tiles():
    T, bs, bq = 1024, 64, 128
    q, k, v = qkv(1, 1, T, 8, dtype=torch.float32)
    with torch.no_grad():
        largest = largest_tensor_bytes(lambda: flash_attention(q, k, v, block_size=bs, query_block_size=bq))
    assert largest <= max(bq * bs, T * 8) * F32  # one (query block, key block) tile of scores, or an output


def test_flash_keeps_only_the_output_and_the_lse_for_the_backward_pass():
    B, H, T, D = 1, 2, 512, 16
    q, k, v = (t.requires_grad_() for t in qkv(B, H, T, D, dtype=torch.float32))
    with TensorMemoryTracker() as m:
        out = flash_attention(q, k, v, causal=True, block_size=64)
        kept = m.current  # alive after the forward pass: the output and what the backward pass saved
    assert kept == B * H * T * (D + 1) * F32  # out (B, H, T, D) and lse (B, H, T): no tile, no (T, T)
    del out


def test_flash_training_memory_is_a_small_fraction_of_the_explicit_path():
    from attnbook.measure import forward_backward, tracked_memory

    D, blocks = 32, {"block_size": 64, "query_block_size": 128}
    paths = {"explicit": lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
             "flash": lambda q, k, v: flash_attention(q, k, v, **blocks),
             "flash causal": lambda q, k, v: flash_attention(q, k, v, causal=True, **blocks)}
    peak: dict[tuple[str, int], int] = {}
    for T in (512, 1024):
        q, k, v = qkv(1, 1, T, D, dtype=torch.float32)
        dout = randn(1, 1, T, D, seed=4, dtype=torch.float32)
        for name, fn in paths.items():
            runs = [tracked_memory(forward_backward(fn, q, k, v, grad_out=dout))["peak_bytes"] for _ in range(2)]
            assert runs[0] == runs[1], name  # deterministic: the same bytes every time
            peak[name, T] = runs[0]
    T = 1024
    assert peak["explicit", T] >= 3 * T * T * F32  # scores, weights and their gradient, (T, T) each
    assert peak["explicit", T] >= 3.5 * peak["explicit", T // 2]  # quadratic in T
    for name in ("flash", "flash causal"):
        assert peak[name, T] <= peak["explicit", T] / 10, (name, peak)
        assert peak[name, T] <= 2.1 * peak[name, T // 2], (name, peak)  # linear in T: tiles of a fixed size


def test_flash_errors():
    from attnbook.efficient import flash_attention_backward, flash_attention_with_lse

    q, k, v = qkv(1, 1, 8, 4)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        flash_attention(q, k, v, block_size=0)
    with pytest.raises(ValueError, match="query_block_size must be an int >= 1, got 0"):
        flash_attention(q, k, v, query_block_size=0)
    with pytest.raises(TypeError, match="query_block_size must be an int, got float"):
        flash_attention(q, k, v, query_block_size=2.0)
    with pytest.raises(ValueError, match="scale must be positive, got -1"):
        flash_attention(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match=r"same head dim D"):
        flash_attention(q, randn(1, 1, 8, 5), v)
    with pytest.raises(TypeError, match="share one dtype"):
        flash_attention(q, k.float(), v)
    out, lse = flash_attention_with_lse(q, k, v)
    with pytest.raises(ValueError, match=r"lse must be \(1, 1, 8\) for q \(1, 1, 8, 4\)"):
        flash_attention_backward(q, k, v, out, lse[..., :4], out)
    with pytest.raises(TypeError, match="grad_out must be a torch.Tensor, got NoneType"):
        flash_attention_backward(q, k, v, out, lse, None)


# ----------------------------------------------------------------------------- the registry


def test_registry_says_what_each_variant_is():
    from attnbook.efficient import REGISTRY, attention_call, make_inputs, variant

    T, W = 96, 16
    q, k, v = make_inputs(T, head_dim=8, dtype=torch.float64)
    patterns = {"sliding window": sliding_window_mask(T, W), "block sparse": bigbird_pattern(T, W)}
    assert list(REGISTRY)[:2] == ["exact", "pytorch"]  # the references first
    for name, var in REGISTRY.items():
        assert var.name == name and variant(name) is var
        out = attention_call(name, q, k, v, W)()
        assert out.shape == (1, 2, T, 8)
        exact, _ = scaled_dot_product_attention(q, k, v, patterns.get(name))  # (B, H, T, D) under its pattern
        if var.exact:
            torch.testing.assert_close(out, exact)
        else:
            assert (out - exact).abs().max() > 1e-3, f"{name} is marked approximate but equals exact attention"
        assert (var.window is None) == (name in ("exact", "pytorch", "linear", "performer"))
        assert var.scores_pairs == (name not in ("linear", "performer"))
        if var.causal:
            out = attention_call(name, q, k, v, W, causal=True)()
            if var.exact:
                mask = causal_mask(T) if name not in patterns else sliding_window_mask(T, W, causal=True)
                torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, mask)[0])
        else:
            with pytest.raises(ValueError, match="no causal form"):
                attention_call(name, q, k, v, W, causal=True)
    with pytest.raises(ValueError, match=r"variant must be one of \('exact', 'pytorch'"):
        variant("dense")


# ----------------------------------------------------------------------------- bool flags


def _flag_calls():
    """Every bool flag of efficient.py's public functions, each passed as the string "yes"."""
    q, k, v = qkv(1, 2, 16, 4, seed=0, dtype=torch.float32)
    proj = eff.performer_features(4, 8)
    return [
        ("causal", lambda: eff.sliding_window_attention(q, k, v, 2, causal="yes")),
        ("causal", lambda: eff.linear_attention(q, k, v, causal="yes")),
        ("causal", lambda: eff.linear_attention_quadratic(q, k, v, causal="yes")),
        ("orthogonal", lambda: eff.performer_features(4, 8, orthogonal="yes")),
        ("is_query", lambda: eff.performer_feature_map(q, proj, "yes")),
        ("orthogonal", lambda: eff.performer_attention(q, k, v, orthogonal="yes")),
        ("causal", lambda: eff.performer_attention(q, k, v, causal="yes")),
        ("causal", lambda: eff.lsh_attention(q, v, causal="yes")),
        ("return_buckets", lambda: eff.lsh_attention(q, v, return_buckets="yes")),
        ("causal", lambda: eff.flash_attention(q, k, v, causal="yes")),
        ("causal", lambda: eff.flash_attention_with_lse(q, k, v, causal="yes")),
        ("causal", lambda: eff.flash_attention_backward(q, k, v, v, q[..., 0], v, causal="yes")),
        ("causal", lambda: eff.attention_call("exact", q, k, v, causal="yes")),
        ("memory", lambda: eff.measure_costs(("exact",), (16,), memory="yes")),
        ("use_qk_l2norm", lambda: eff.delta_rule_attention(q, k, v, 0.5, use_qk_l2norm="yes")),
        ("output_final_state", lambda: eff.delta_rule_attention(q, k, v, 0.5, output_final_state="yes")),
    ]


@pytest.mark.parametrize("index", range(16))
def test_bool_flags_refuse_other_types(index):
    """causal="yes" (or 1) is not a bool: a TypeError naming the flag, before any work."""
    name, call = _flag_calls()[index]
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        call()
