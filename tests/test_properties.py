"""Property tests (hypothesis): statements that hold for every shape and input, checked on many drawn ones.

* flash attention equals exact attention (tiled online softmax = one softmax), causal or not, any tile size,
  and so do its gradients (FlashAttention-2's backward pass, recomputing the tiles from the log-sum-exp);
* decoding with a KV cache (concatenating or preallocated), one chunk of new tokens at a time, equals the
  uncached causal pass;
* ``merge_heads`` undoes ``split_heads`` and the other way round, and a head is a contiguous slice of E;
* RoPE's score depends on the positions only through their difference, and keeps norms.

Dimension legend: B batch, H heads, Hkv key/value heads, T query length, S key length, D head dim,
E model dim.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook import (
    KVCache,
    MultiHeadAttention,
    StaticKVCache,
    apply_rotary,
    causal_mask,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)
from attnbook.efficient import flash_attention
from tests.helpers import qkv, randn


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2), H=st.integers(1, 3), T=st.integers(1, 40), S=st.integers(1, 40), D=st.integers(1, 8),
    Dv=st.integers(1, 6), block_size=st.integers(1, 17), causal=st.booleans(), seed=st.integers(0, 10_000),
    scale=st.one_of(st.none(), st.floats(0.05, 3.0)),
)
def test_flash_equals_exact_attention(B, H, T, S, D, Dv, block_size, causal, seed, scale):
    if causal:
        S = T  # causal: self-attention, top-left aligned as in PyTorch
    q, k, v = qkv(B, H, T, D, S=S, Dv=Dv, seed=seed)
    mask = causal_mask(T, S) if causal else None
    expected, _ = scaled_dot_product_attention(q, k, v, mask, scale=scale)  # (B, H, T, Dv), one softmax
    out = flash_attention(q, k, v, causal=causal, block_size=block_size, scale=scale)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(
    T=st.integers(1, 30), S=st.integers(1, 30), D=st.integers(1, 6), Dv=st.integers(1, 5),
    block_size=st.integers(1, 13), query_block_size=st.one_of(st.none(), st.integers(1, 20)), causal=st.booleans(),
    seed=st.integers(0, 10_000), scale=st.one_of(st.none(), st.floats(0.05, 3.0)),
)
def test_flash_gradients_equal_exact_attention(T, S, D, Dv, block_size, query_block_size, causal, seed, scale):
    # top-left causal alignment (query i sees keys j <= i) also when T != S, as is_causal in PyTorch
    q, k, v = qkv(1, 2, T, D, S=S, Dv=Dv, seed=seed)
    dout = randn(1, 2, T, Dv, seed=seed + 3)  # (B, H, T, Dv) the output's gradient
    mask = causal_mask(T, S) if causal else None
    grads = []
    for fn in (lambda q, k, v: flash_attention(q, k, v, causal=causal, block_size=block_size, scale=scale,
                                               query_block_size=query_block_size),
               lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, scale=scale)[0]):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        grads.append(torch.autograd.grad(fn(*leaves), leaves, dout))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@settings(max_examples=30, deadline=None)
@given(
    H=st.sampled_from([1, 2, 4]), kv_div=st.sampled_from([1, 2, 4]), D=st.integers(1, 4),
    prefix=st.integers(1, 6), chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4), B=st.integers(1, 2),
    seed=st.integers(0, 10_000), static=st.booleans(), room=st.integers(0, 3),
)
def test_cached_decoding_equals_the_uncached_causal_pass(H, kv_div, D, prefix, chunks, B, seed, static, room):
    num_kv_heads = max(1, H // kv_div)
    E = H * D
    torch.manual_seed(seed)
    m = MultiHeadAttention(E, H, num_kv_heads=num_kv_heads).double().eval()
    T = prefix + sum(chunks)
    x = randn(B, T, E, seed=seed)  # (B, T, E)
    with torch.no_grad():
        full, _ = m(x, mask=causal_mask(T))  # (B, T, E): every token sees itself and the earlier ones
        cache = StaticKVCache(T + room) if static else KVCache()
        steps, start = [], 0
        for n in [prefix, *chunks]:  # the prompt, then a few new tokens at a time
            past = len(cache)
            mask = causal_mask(n, past + n, offset=past)  # (n, S): new tokens after the cached ones
            steps.append(m(x[:, start:start + n], mask=mask, cache=cache)[0])
            start += n
    assert len(cache) == T and cache.k is not None and cache.k.shape == (B, num_kv_heads, T, D)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=1e-12)


@settings(max_examples=50, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 7), H=st.integers(1, 6), D=st.integers(1, 5), seed=st.integers(0, 999))
def test_split_and_merge_heads_round_trip(B, T, H, D, seed):
    x = randn(B, T, H * D, seed=seed)  # (B, T, E)
    heads = split_heads(x, H)  # (B, H, T, D)
    assert heads.shape == (B, H, T, D)
    assert torch.equal(merge_heads(heads), x)
    for h in range(H):  # head h is the slice h*D:(h+1)*D of every token's features
        assert torch.equal(heads[:, h], x[..., h * D:(h + 1) * D])
    y = randn(B, H, T, D, seed=seed + 1)  # (B, H, T, D)
    assert torch.equal(split_heads(merge_heads(y), H), y)


@settings(max_examples=50, deadline=None)
@given(
    half_D=st.integers(1, 8), m=st.integers(-50, 200), n=st.integers(-50, 200), shift=st.integers(-100, 1000),
    interleaved=st.booleans(), base=st.sampled_from([100.0, 10000.0, 500000.0]), seed=st.integers(0, 999),
)
def test_rope_scores_depend_on_the_relative_position_only(half_D, m, n, shift, interleaved, base, seed):
    D = 2 * half_D
    q, k = randn(1, D, seed=seed), randn(1, D, seed=seed + 1)  # (T=1, D): one query, one key

    def score(pos_q: int, pos_k: int) -> float:
        rq = apply_rotary(q, torch.tensor([pos_q]), base=base, interleaved=interleaved)
        rk = apply_rotary(k, torch.tensor([pos_k]), base=base, interleaved=interleaved)
        return float((rq * rk).sum())

    assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-9 * (1 + abs(score(m, n)))
    assert abs(score(m, m) - float((q * k).sum())) < 1e-9 * (1 + float(q.abs().sum() * k.abs().sum()))
    rotated = apply_rotary(q, torch.tensor([m]), base=base, interleaved=interleaved)
    torch.testing.assert_close(rotated.norm(), q.norm())  # a rotation keeps the length
