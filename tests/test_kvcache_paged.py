"""The paged KV cache (attnbook.kvcache's BlockPool, PagedKVCache, simulate_requests): a batch of requests of
different lengths decoded through it gives, token by token, what each request gets from its own contiguous
KVCache (chapter 9), with GQA and RoPE; freed blocks are reused; prefix caching finds a prompt's full blocks by
their hashes (freed ones too, until evicted least recently used first); fork's copy-on-write keeps each
continuation its own; attention over the pages equals the gathered path; the allocation simulation matches a
step-by-step count.

Dimension legend: B batch, H heads, Hkv key/value heads, T query length, S key length, D head dim, E model dim.
"""

from __future__ import annotations

import heapq
import math
import random

import pytest
import torch

from attnbook import KVCache, MultiHeadAttention, apply_rotary, causal_mask, padding_mask
from attnbook.kvcache import (
    BlockPool,
    OutOfBlocksError,
    PagedKVCache,
    paged_attention,
    prefix_block_hashes,
    simulate_requests,
)
from tests.helpers import randn

TOL = {torch.float64: 1e-12, torch.float32: 1e-6}
E, H = 32, 4  # model dim, query heads: head dim D = 8


def _mha(num_kv_heads: int, dtype: torch.dtype) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(E, H, num_kv_heads=num_kv_heads).to(dtype).eval()


def _project(mha, x, positions, rope):
    """q (B, H, n, D), k and v (B, Hkv, n, D) of the new tokens x (B, n, E); with ``rope``, q and k rotated at
    ``positions`` ((n,) or (B, 1, n): the cached length + arange(n))."""
    q, k, v = mha.project(x)
    if rope:
        q, k = apply_rotary(q, positions), apply_rotary(k, positions)
    return q, k, v


def _contiguous(mha, x, prompt_len, rope):
    """Chapter 9's way: ``x`` (1, L, E) as a prompt of ``prompt_len`` tokens, then one token at a time, through a
    KVCache; the outputs (1, L, E)."""
    cache, outs = KVCache(), []
    for start, end in [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, x.shape[1])]:
        past = len(cache)
        q, k, v = _project(mha, x[:, start:end], past + torch.arange(end - start), rope)
        k_all, v_all = cache.append(k, v)  # (1, Hkv, past + n, D)
        outs.append(mha.attend(q, k_all, v_all, causal_mask(end - start, past + end - start, offset=past))[0])
    return torch.cat(outs, dim=1)


class _PagedRun:
    """Requests decoded through one PagedKVCache: ``start`` prefills a request alone, ``step`` decodes one token
    of every given request in one batch (gather_batch + padding mask). Collects each request's outputs."""

    def __init__(self, mha, cache, rope):
        self.mha, self.cache, self.rope = mha, cache, rope
        self.x: dict = {}
        self.outs: dict = {}
        self.first: dict = {}  # the first position each request computed (after its cached prefix)

    def start(self, seq_id, x, prompt_len, prompt_ids=None):
        """Prefill: compute and append the part of the prompt that is not found cached (never all of it)."""
        self.x[seq_id] = x
        cached = self.cache.add_sequence(seq_id, prompt_ids)
        assert cached < prompt_len  # the last prompt token is always computed
        self.first[seq_id] = cached
        q, k, v = _project(self.mha, x[:, cached:prompt_len], cached + torch.arange(prompt_len - cached), self.rope)
        self.cache.append(seq_id, k[0], v[0])  # (Hkv, n, D)
        k_all, v_all = self.cache.gather(seq_id)  # (1, Hkv, prompt_len, D)
        mask = causal_mask(prompt_len - cached, prompt_len, offset=cached)
        self.outs[seq_id] = [self.mha.attend(q, k_all, v_all, mask)[0]]
        return cached

    def step(self, seq_ids):
        lengths = [self.cache.length(s) for s in seq_ids]
        x_new = torch.cat([self.x[s][:, n:n + 1] for s, n in zip(seq_ids, lengths)])  # (B, 1, E)
        positions = torch.tensor(lengths).view(-1, 1, 1)  # (B, 1, 1): each request's own offset
        q, k, v = _project(self.mha, x_new, positions, self.rope)  # q (B, H, 1, D); k, v (B, Hkv, 1, D)
        for i, s in enumerate(seq_ids):
            self.cache.append(s, k[i], v[i])
        k_all, v_all, mask = self.cache.gather_batch(seq_ids)  # (B, Hkv, S, D), mask (B, 1, 1, S)
        out = self.mha.attend(q, k_all, v_all, mask)[0]  # (B, 1, E)
        for i, s in enumerate(seq_ids):
            self.outs[s].append(out[i:i + 1])

    def done(self, seq_id):
        return self.cache.length(seq_id) == self.x[seq_id].shape[1]

    def output(self, seq_id):
        return torch.cat(self.outs[seq_id], dim=1)  # (1, L - first, E): the positions it computed


def _assert_close(a, b, dtype):
    err = (a - b).abs().max().item()
    assert err < TOL[dtype], f"max |diff| {err:.3g} >= {TOL[dtype]:g}"


# ----------------------------------------------------------------------------- decoding equals chapter 9's cache


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_a_batch_decoded_through_the_paged_cache_equals_each_contiguous_cache(num_kv_heads, rope, dtype):
    """Three requests of different prompt and output lengths decoded together; when the first finishes, it is
    freed and a fourth request takes its blocks. Every output equals the request's own contiguous KVCache."""
    mha = _mha(num_kv_heads, dtype)
    requests = {"a": (3, 7), "b": (6, 13), "c": (5, 9), "d": (4, 10)}  # seq_id: (prompt_len, total length)
    x = {s: randn(1, total, E, seed=10 + i, dtype=dtype) for i, (s, (_, total)) in enumerate(requests.items())}
    pool = BlockPool(12, 4, num_kv_heads, E // H, dtype=dtype)
    run = _PagedRun(mha, PagedKVCache(pool), rope)
    with torch.no_grad():
        for s in "abc":
            run.start(s, x[s], requests[s][0])
        active, reused = ["a", "b", "c"], None
        while active:
            run.step(active)
            for s in [s for s in active if run.done(s)]:
                active.remove(s)
                if s == "a":  # the first to finish: its blocks go to the new request
                    a_blocks = run.cache.block_table("a")
                    run.cache.free("a")
                    assert "a" not in run.cache and pool.num_free >= len(a_blocks)
                    run.start("d", x["d"], requests["d"][0])
                    reused = run.cache.block_table("d")
                    active.append("d")
        assert reused == [a_blocks[0]]  # free releases the last block first: the first block is handed out first
        live = {blk for s in run.cache.seq_ids for blk in run.cache.block_table(s)}
        assert set(a_blocks) <= live  # every block of "a" holds another request's tokens now
        for s, (prompt_len, _) in requests.items():
            _assert_close(run.output(s), _contiguous(mha, x[s], prompt_len, rope), dtype)
    assert len(run.cache) == 3 and run.cache.length("b") == 13
    if rope:  # without each request's own offset (one position for the whole batch) the answer is wrong
        wrong = _PagedRun(mha, PagedKVCache(BlockPool(12, 4, num_kv_heads, E // H, dtype=dtype)), rope)
        with torch.no_grad():
            for s in "bc":
                wrong.start(s, x[s], requests[s][0])
            lengths = [wrong.cache.length(s) for s in "bc"]
            x_new = torch.cat([x[s][:, n:n + 1] for s, n in zip("bc", lengths)])  # (2, 1, E)
            q, k, v = _project(mha, x_new, torch.tensor([max(lengths)]), rope)
            for i, s in enumerate("bc"):
                wrong.cache.append(s, k[i], v[i])
            k_all, v_all, mask = wrong.cache.gather_batch(["b", "c"])
            out = mha.attend(q, k_all, v_all, mask)[0]
        shorter = _contiguous(mha, x["c"][:, :6], 5, rope)[:, 5:6]
        assert (out[1:2] - shorter).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("arrive_after", [0, 3])
@pytest.mark.parametrize("prompt_len", [6, 8, 9])
def test_prefix_caching_shares_full_prompt_blocks_and_each_continuation_stays_its_own(prompt_len, arrive_after,
                                                                                     dtype):
    """Two requests with one prompt and different continuations: the second finds the prompt's full blocks
    cached (right after the first's prefill, or after it decoded 3 tokens), at most prompt_len - 1 tokens, and
    computes the rest (its last prompt token always). Each decodes as its own contiguous cache; shared blocks
    are full, never written again, and no block is ever copied."""
    mha = _mha(2, dtype)
    prompt = randn(1, prompt_len, E, seed=1, dtype=dtype)
    x = {s: torch.cat([prompt, randn(1, 7, E, seed=2 + i, dtype=dtype)], dim=1) for i, s in enumerate("ab")}
    ids = list(range(100, 100 + prompt_len))  # the prompt's token ids
    pool = BlockPool(16, 4, 2, E // H, dtype=dtype)
    cache = PagedKVCache(pool)
    run = _PagedRun(mha, cache, rope=True)
    found = (prompt_len - 1) // 4 * 4  # full blocks, the last prompt token excluded
    with torch.no_grad():
        assert run.start("a", x["a"], prompt_len, ids) == 0  # nothing cached yet: "a" computes the prompt
        for _ in range(arrive_after):
            run.step(["a"])
        assert run.start("b", x["b"], prompt_len, ids) == found
        assert cache.block_table("b")[:found // 4] == cache.block_table("a")[:found // 4]
        active = ["a", "b"]
        while active:
            run.step(active)
            active = [s for s in active if not run.done(s)]
        for s in "ab":
            _assert_close(run.output(s), _contiguous(mha, x[s], prompt_len, rope=True)[:, run.first[s]:], dtype)
    shared = found // 4
    a, b = cache.block_table("a"), cache.block_table("b")
    assert a[:shared] == b[:shared] and all(pool.ref_count(blk) == 2 for blk in a[:shared])
    assert not set(a[shared:]) & set(b[shared:]) and cache.num_copies == 0 and cache.num_hit_tokens == found
    total = prompt_len + 7
    assert pool.num_used == 2 * math.ceil(total / 4) - shared
    assert cache.used_bytes() == (2 * total - 4 * shared) * pool.bytes_per_token  # shared tokens counted once
    cache.free("a")  # the shared blocks survive in "b"
    assert all(pool.ref_count(blk) == 1 for blk in b[:shared]) and pool.num_used == math.ceil(total / 4)
    k, v = cache.gather("b")
    torch.testing.assert_close(k[:, :, :prompt_len], _project(mha, prompt, torch.arange(prompt_len), True)[1],
                               rtol=0, atol=TOL[dtype])
    cache.free("b")
    assert pool.num_free == pool.num_blocks and len(cache) == 0
    assert pool.num_cached_free == prompt_len // 4  # the prompt's full blocks stay cached, free, for reuse


def test_prefix_block_hashes_name_the_whole_prefix():
    a = prefix_block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(a) == 2 and len(set(a)) == 2  # two full blocks; the 9th token's block is not full: no name
    assert prefix_block_hashes(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]), 4) == a
    b = prefix_block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)  # the first block differs ...
    assert b[0] != a[0] and b[1] != a[1]  # ... so the second block's name differs too, though its tokens agree
    assert prefix_block_hashes([5, 6, 7, 8], 4)[0] != a[1]  # a block's name depends on what comes before it
    assert prefix_block_hashes([1, 2, 3], 4) == []


def test_freed_prompt_blocks_are_reused_then_evicted_least_recently_used_first():
    pool = BlockPool(6, 2, 1, 2)
    cache = PagedKVCache(pool)
    kv = torch.ones(1, 5, 2)
    p = [7, 8, 9, 10, 11]  # two full blocks and one token
    assert cache.add_sequence("a", p) == 0
    cache.append("a", kv, kv)
    blocks_a = cache.block_table("a")
    cache.free("a")
    assert pool.num_used == 0 and pool.num_cached_free == 2 and pool.num_free == 6
    assert cache.add_sequence("b", p) == 4 and cache.block_table("b") == blocks_a[:2]  # found after "a" ended
    assert cache.add_sequence("c", p[:4]) == 2  # a 4-token prompt: its last block is recomputed
    assert cache.add_sequence("d", [7, 8, 0, 0, 1]) == 2  # a shared first block only: prefixes, not whole prompts
    cache.free("b")
    cache.free("c")
    cache.free("d")
    q = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # 11 tokens: 6 blocks, more than the uncached free blocks
    cache.add_sequence("e", q)
    cache.append("e", torch.ones(1, 11, 2), torch.ones(1, 11, 2))
    assert pool.num_evictions == 2 and pool.num_cached_free == 0
    cache.free("e")
    assert cache.add_sequence("f", p) == 0  # evicted: computed again
    assert cache.add_sequence("g", q) == 10  # e's blocks are cached now


def test_paged_attention_reads_the_pages_and_equals_the_gathered_path():
    """Sequences of lengths around the block size, a single token, a chunk of prefill (T = 3) and decoding
    (T = 1), GQA (H = 6, Hkv = 2): attention over the pages equals attention over the gathered copy."""
    g = torch.Generator().manual_seed(0)
    pool = BlockPool(40, 4, 2, 8, dtype=torch.float64)
    cache = PagedKVCache(pool)
    lengths = {"a": 13, "b": 4, "c": 3, "d": 17}
    for s, n in lengths.items():
        cache.add_sequence(s)
        k = torch.randn(2, n, 8, generator=g, dtype=torch.float64) * 4
        cache.append(s, k, torch.randn(2, n, 8, generator=g, dtype=torch.float64))
    cache.fork("d", "e", 10)  # shares blocks with d (copy-on-write on its next write)
    cache.append("e", torch.randn(2, 1, 8, generator=g, dtype=torch.float64), torch.randn(2, 1, 8, generator=g, dtype=torch.float64))
    ids = ["a", "b", "c", "d", "e"]
    for T in (1, 3):
        q = torch.randn(len(ids), 6, T, 8, generator=g, dtype=torch.float64)  # (B, H, T, D)
        out = paged_attention(q, cache, ids)
        for i, s in enumerate(ids):
            k_all, v_all = cache.gather(s)  # (1, Hkv, S, D)
            S = k_all.shape[2]
            ref = torch.nn.functional.scaled_dot_product_attention(
                q[i:i + 1], k_all, v_all, attn_mask=causal_mask(T, S, offset=S - T), enable_gqa=True)
            err = ((out[i:i + 1] - ref).abs().max() / ref.abs().max()).item()
            assert err < 1e-12, (s, T, err)
    with pytest.raises(ValueError, match="caches only 3"):
        paged_attention(torch.zeros(5, 6, 4, 8, dtype=torch.float64), cache, ids)
    with pytest.raises(ValueError, match="multiple of Hkv = 2"):
        paged_attention(torch.zeros(5, 5, 1, 8, dtype=torch.float64), cache, ids)
    with pytest.raises(TypeError, match="float64"):
        paged_attention(torch.zeros(5, 6, 1, 8), cache, ids)


# ----------------------------------------------------------------------------- the blocks themselves


def test_append_across_blocks_gather_and_accounting():
    pool = BlockPool(8, 4, 2, 3, dtype=torch.float64)
    cache = PagedKVCache(pool)
    assert pool.k.shape == (8, 2, 4, 3) and pool.bytes_per_token == 2 * 2 * 3 * 8 and pool.bytes_per_block == 4 * 96
    assert cache.add_sequence(7) == 0 and cache.add_sequence("req-2") == 0
    k, v = randn(2, 10, 3, seed=1), randn(2, 10, 3, seed=2)  # (Hkv, T_new, D)
    cache.append(7, k[:, :3], v[:, :3])  # 3 tokens, then 6 (crossing two block boundaries), then 1
    cache.append("req-2", k[:, :5], v[:, :5])
    cache.append(7, k[:, 3:9], v[:, 3:9])
    cache.append(7, k[:, 9:], v[:, 9:])
    assert cache.block_table(7) == [0, 3, 4] and cache.block_table("req-2") == [1, 2]  # handed out in order
    assert cache.length(7) == 10 and len(cache) == 2 and cache.seq_ids == [7, "req-2"]
    k7, v7 = cache.gather(7)
    assert k7.shape == (1, 2, 10, 3)
    assert torch.equal(k7[0], k) and torch.equal(v7[0], v)
    assert torch.equal(pool.k[3, :, 1], k[:, 5])  # token 5: block table[5 // 4] = 3, position 5 % 4 = 1
    kb, vb, mask = cache.gather_batch(["req-2", 7])
    assert kb.shape == (2, 2, 10, 3) and torch.equal(mask, padding_mask([5, 10]))
    assert torch.equal(kb[0, :, :5], k[:, :5]) and torch.equal(kb[1], k) and torch.equal(vb[1], v)
    assert not kb[0, :, 5:].any() and not vb[0, :, 5:].any()  # the padding is zeros, masked out
    assert cache.held_bytes() == 5 * pool.bytes_per_block
    assert cache.used_bytes() == 15 * pool.bytes_per_token
    assert cache.waste_bytes() == (2 + 3) * pool.bytes_per_token  # the empty ends of the two last blocks
    assert pool.num_used == 5 and pool.num_free == 3
    cache.free(7)
    assert pool.num_free == 6 and cache.block_table("req-2") == [1, 2]
    assert cache.add_sequence(8) == 0
    cache.append(8, k[:, :5], v[:, :5])
    assert cache.block_table(8) == [0, 3]  # free releases 4, 3, 0: the block freed last (0) comes back first
    assert "blocks used=4" in repr(cache) and "free=4" in repr(pool)
    empty_k, _ = (cache.add_sequence(9), cache.gather(9))[1]
    assert empty_k.shape == (1, 2, 0, 3)


def test_fork_shares_a_prefix_and_reference_counts_it():
    pool = BlockPool(8, 4, 1, 2, dtype=torch.float64)
    cache = PagedKVCache(pool)
    cache.add_sequence(0)
    k = randn(1, 10, 2, seed=3)
    cache.append(0, k, -k)
    cache.fork(0, 1)  # all 10 tokens
    cache.fork(0, 2, num_tokens=4)  # the first block only
    cache.fork(0, 3, num_tokens=0)
    assert cache.block_table(1) == [0, 1, 2] and cache.block_table(2) == [0] and cache.block_table(3) == []
    assert [pool.ref_count(b) for b in (0, 1, 2)] == [3, 2, 2] and pool.num_used == 3
    assert cache.length(2) == 4 and torch.equal(cache.gather(2)[0][0], k[:, :4])
    cache.append(1, k[:, :1], k[:, :1])  # into the shared, partly filled block 2: copied first
    assert cache.num_copies == 1 and cache.block_table(1) == [0, 1, 3] and pool.ref_count(2) == 1
    assert torch.equal(cache.gather(1)[0][0], torch.cat([k, k[:, :1]], dim=1))
    assert torch.equal(cache.gather(0)[0][0], k)  # the parent did not see the child's write
    cache.append(2, k[:, :1], k[:, :1])  # block 0 is full: a new block, no copy
    assert cache.num_copies == 1 and cache.block_table(2) == [0, 4]
    for s in (0, 1, 2, 3):
        cache.free(s)
    assert pool.num_free == 8 and all(pool.ref_count(b) == 0 for b in range(8))


@pytest.mark.parametrize("free_parent_first", [True, False])
def test_a_fork_that_takes_part_of_a_cached_block_copies_it_before_writing(free_parent_first):
    """A child forked mid-way through a cached prompt block must not write into it, even once it is the
    block's only reader: the block's hash names the parent's tokens, and a later request with the parent's
    prompt reads it."""
    pool = BlockPool(8, 4, 1, 2, dtype=torch.float64)
    cache = PagedKVCache(pool)
    prompt = list(range(9))  # two full blocks (hashed once written) and one token of a third
    cache.add_sequence("parent", prompt)
    k = randn(1, 9, 2, seed=5)
    cache.append("parent", k, -k)
    shared = cache.block_table("parent")[1]
    assert pool.is_cached(shared) and not pool.is_cached(cache.block_table("parent")[2])
    cache.fork("parent", "child", num_tokens=6)  # block 0 whole, 2 of block 1's 4 tokens
    if free_parent_first:
        cache.free("parent")
        assert pool.ref_count(shared) == 1  # the child is its only reader now
    seven = torch.full((1, 2, 2), 7.0, dtype=torch.float64)
    cache.append("child", seven, seven)
    assert cache.num_copies == 1 and cache.block_table("child")[1] != shared
    assert torch.equal(cache.gather("child")[0][0], torch.cat([k[:, :6], seven], dim=1))
    if not free_parent_first:
        cache.free("parent")
    found = cache.add_sequence("again", prompt)  # the parent's prompt once more: both full blocks found
    assert found == 8 and cache.block_table("again")[:2] == [cache.block_table("child")[0], shared]
    assert torch.equal(cache.gather("again")[0][0], k[:, :8])  # the parent's values, not the child's 7s


# ----------------------------------------------------------------------------- errors


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        BlockPool(4, 0, 1, 2)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got -4"):
        BlockPool(4, -4, 1, 2)
    with pytest.raises(TypeError, match="block_size must be an int, got float"):
        BlockPool(4, 4.0, 1, 2)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        BlockPool(4, 4, 1, 2, dtype="float32")
    with pytest.raises(TypeError, match="floating-point"):
        BlockPool(4, 4, 1, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="pool must be a BlockPool, got int"):
        PagedKVCache(4)
    pool = BlockPool(3, 4, 2, 3, dtype=torch.float64)
    cache = PagedKVCache(pool)
    cache.add_sequence(0)
    k = randn(2, 20, 3)
    cache.append(0, k[:, :5], k[:, :5])
    with pytest.raises(OutOfBlocksError, match=r"seq_id 0 \(5 tokens cached\) needs 2 more block\(s\) for 8 new "
                                               r"tokens, but 1 of 3 blocks of 4 tokens are free") as info:
        cache.append(0, k[:, 5:13], k[:, 5:13])
    assert isinstance(info.value, ValueError) and (info.value.needed, info.value.free) == (2, 1)
    assert cache.length(0) == 5 and pool.num_free == 1  # nothing changed
    cache.add_sequence(1)
    with pytest.raises(OutOfBlocksError, match="needs 5 more block"):  # longer than the whole pool
        cache.append(1, k, k)
    cache.fork(0, 2)
    cache.append(1, k[:, :4], k[:, :4])  # the last free block
    with pytest.raises(OutOfBlocksError, match=r"\(1 of them a copy-on-write of a shared or cached block\)"):
        cache.append(2, k[:, :1], k[:, :1])
    cache.free(0)
    for bad, name in ((0, "0"), ("gone", "'gone'")):
        with pytest.raises(ValueError, match=rf"seq_id {name} is not in the cache \(never added, or freed\)"):
            cache.append(bad, k[:, :1], k[:, :1])  # writing to a freed (or unknown) sequence
    with pytest.raises(ValueError, match="seq_id 0 is not in the cache"):
        cache.gather(0)
    with pytest.raises(ValueError, match="seq_id 0 is not in the cache"):
        cache.free(0)
    with pytest.raises(ValueError, match="seq_id 1 is already in the cache"):
        cache.add_sequence(1)
    with pytest.raises(TypeError, match="seq_id must be an int or a str, got float"):
        cache.add_sequence(1.0)
    with pytest.raises(TypeError, match="seq_id must be an int or a str, got bool"):
        cache.length(True)
    with pytest.raises(ValueError, match=r"num_tokens must be an int in \[0, 4\], got 5"):
        cache.fork(1, 3, num_tokens=5)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        cache.append(1, [1.0], k[:, :1])
    with pytest.raises(ValueError, match=r"k and v must both be \(Hkv, T_new, D\) = \(2, T_new, 3\) for this pool, "
                                         r"got \(1, 2, 1, 3\) and \(1, 2, 1, 3\)"):
        cache.append(1, k[None, :, :1], k[None, :, :1])
    with pytest.raises(ValueError, match=r"got \(2, 1, 3\) and \(2, 2, 3\)"):
        cache.append(1, k[:, :1], k[:, :2])
    with pytest.raises(TypeError, match="the pool holds torch.float64"):
        cache.append(1, k[:, :1].float(), k[:, :1].float())
    with pytest.raises(TypeError, match="seq_ids must be a sequence of seq ids, got str"):
        cache.gather_batch("1")
    with pytest.raises(ValueError, match="seq_ids is empty"):
        cache.gather_batch([])
    with pytest.raises(TypeError, match="prompt_ids must hold ints, got float"):
        cache.add_sequence(5, [1.0, 2.0])
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        cache.add_sequence(5, [])
    with pytest.raises(TypeError, match="prompt_ids must be a 1-d integer tensor"):
        cache.add_sequence(5, torch.ones(3))
    with pytest.raises(ValueError, match="block 1 is free"):
        BlockPool(2, 4, 1, 1).release(1)
    with pytest.raises(ValueError, match=r"block must be an int in \[0, 1\], got 2"):
        BlockPool(2, 4, 1, 1).ref_count(2)
    with pytest.raises(OutOfBlocksError, match="1 needed, 0 free of 1"):
        small = BlockPool(1, 4, 1, 1)
        small.allocate()
        small.allocate()
    assert 5 not in cache  # a refused add_sequence adds nothing


def test_prompt_blocks_are_found_once_written():
    cache = PagedKVCache(BlockPool(8, 4, 1, 2))
    k = torch.ones(1, 5, 2)
    assert cache.add_sequence("a", [1, 2, 3, 4, 5]) == 0
    assert cache.add_sequence("b", torch.tensor([1, 2, 3, 4, 5])) == 0  # "a" has not written the prompt yet
    cache.append("a", k, k)
    assert cache.add_sequence("c", (1, 2, 3, 4, 5)) == 4 and cache.block_table("c") == cache.block_table("a")[:1]
    assert cache.add_sequence("d", [9, 2, 3, 4, 5]) == 0  # another first block


# ----------------------------------------------------------------------------- the simulation


def _stream(num_requests, prompt_len_range, output_len_range, batch_size, share_fraction, shared_prompt_len, seed):
    """The requests simulate_requests draws (as its docstring says) and when each starts."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(num_requests):
        common = rng.random() < share_fraction
        p, o = rng.randint(*prompt_len_range), rng.randint(*output_len_range)
        reqs.append((shared_prompt_len if common else p, o))
    slots, starts = [0] * min(batch_size, num_requests), []
    for _, o in reqs:
        starts.append(heapq.heappop(slots))
        heapq.heappush(slots, starts[-1] + o)
    return reqs, starts


@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_the_simulation_matches_a_step_by_step_count(block_size):
    kw = dict(prompt_len_range=(3, 40), output_len_range=(1, 30), batch_size=4, shared_prompt_len=20, seed=3)
    s = simulate_requests(30, block_size=block_size, max_len=80, share_fraction=0.0, **kw)
    reqs, starts = _stream(30, kw["prompt_len_range"], kw["output_len_range"], 4, 0.0, 20, 3)
    steps = max(st + o for st, (_, o) in zip(starts, reqs))
    held, used, running = [0] * steps, [0] * steps, [0] * steps
    for st, (p, o) in zip(starts, reqs):
        for j in range(o):  # step st + j: the request holds p + j tokens
            held[st + j] += math.ceil((p + j) / block_size) * block_size
            used[st + j] += p + j
            running[st + j] += 1
    assert s["steps"] == steps
    assert s["peak_held"] == max(held)
    assert s["mean_held"] == pytest.approx(sum(held) / steps, rel=1e-12)
    assert s["mean_used"] == pytest.approx(sum(used) / steps, rel=1e-12)
    assert s["mean_running"] == pytest.approx(sum(running) / steps, rel=1e-12)
    assert s["mean_preallocated"] == pytest.approx(80 * sum(running) / steps, rel=1e-12)
    assert s["peak_preallocated"] == 4 * 80
    if block_size == 1:
        assert s["waste_fraction"] == 0 and s["mean_held"] == pytest.approx(s["mean_used"])
    assert s["shared_requests"] == 0 and s["saved_blocks_mean"] == 0 and s["mean_held_shared"] == s["mean_held"]


def test_the_default_stream_holds_less_than_preallocation_and_sharing_saves_blocks():
    rows = [simulate_requests(block_size=b) for b in (8, 16, 32, 64, 128)]
    assert rows[1] == simulate_requests(block_size=16)  # deterministic for the seed
    assert simulate_requests(block_size=16, seed=1) != rows[1]
    for row in rows:
        b = row["block_size"]
        assert row["mean_held"] < 0.5 * row["mean_preallocated"] and row["peak_held"] < row["peak_preallocated"]
        assert abs(row["waste_per_request"] - (b - 1) / 2) < 0.1 * b  # half a block per request, on average
        assert 0 < row["shared_requests"] <= 400 and row["saved_blocks_mean"] > 0
        assert row["mean_held_shared"] < row["mean_held"] and row["peak_held_shared"] < row["peak_held"]
        assert row["hit_tokens"] == row["shared_requests"] * (199 // b * b)  # full blocks, the last token recomputed
    assert [r["mean_used"] for r in rows] == [rows[0]["mean_used"]] * 5  # one stream for every block size
    waste = [r["waste_fraction"] for r in rows]
    assert waste == sorted(waste) and waste[0] < 0.01 < 0.1 < waste[-1]


def test_the_simulation_checks_its_arguments():
    with pytest.raises(ValueError, match="max_len=100 is shorter than the longest request"):
        simulate_requests(5, prompt_len_range=(10, 60), output_len_range=(10, 60), max_len=100)
    with pytest.raises(ValueError, match="a prompt of 200 and 60 output tokens cache 259"):
        simulate_requests(5, prompt_len_range=(10, 60), output_len_range=(10, 60), max_len=250)
    simulate_requests(5, prompt_len_range=(10, 60), output_len_range=(10, 60), max_len=250, share_fraction=0.0)
    with pytest.raises(ValueError, match=r"prompt_len_range must have low <= high, got \(5, 2\)"):
        simulate_requests(5, prompt_len_range=(5, 2))
    with pytest.raises(TypeError, match="output_len_range must be a \\(low, high\\) pair"):
        simulate_requests(5, output_len_range=7)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        simulate_requests(5, block_size=0)
    with pytest.raises(ValueError, match=r"share_fraction must be in \[0, 1\], got 1.5"):
        simulate_requests(5, share_fraction=1.5)
    with pytest.raises(TypeError, match="num_requests must be an int"):
        simulate_requests(5.0)
