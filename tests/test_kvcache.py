"""Grouped-query attention, the KV caches, their size, and the timing of one decoding step over them
(attnbook.kvcache's decode_inputs / measure_decode, which chapter 9's explorer shows)."""

import pytest
import torch
import torch.nn.functional as F

import attnbook
from attnbook import (
    KVCache,
    MultiHeadAttention,
    StaticKVCache,
    apply_rotary,
    causal_mask,
    kv_cache_bytes_per_token,
    merge_heads,
    split_heads,
)
from attnbook.kvcache import BENCH_DIVISOR, decode_inputs, decode_key, kv_cache_bytes, measure_decode
from attnbook.mha import grouped_decode_attention
from tests.helpers import randn, tiny_decoder_only


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_gqa_equals_explicit_repeat_of_kv_heads(num_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 8, num_kv_heads=num_kv_heads).double()
    x = randn(2, 6, 32, seed=1)
    out, w = mha(x, mask=causal_mask(6))
    q = split_heads(mha.q_proj(x), 8)  # (B, 8, T, 4)
    k = split_heads(mha.k_proj(x), num_kv_heads)  # (B, Hkv, T, 4)
    v = split_heads(mha.v_proj(x), num_kv_heads)
    group = 8 // num_kv_heads
    k_rep = torch.stack([k[:, h // group] for h in range(8)], dim=1)  # query head h uses kv head h // group
    v_rep = torch.stack([v[:, h // group] for h in range(8)], dim=1)
    ref = F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=causal_mask(6))
    torch.testing.assert_close(out, mha.out_proj(merge_heads(ref)))
    assert mha.k_proj.weight.shape == (num_kv_heads * 4, 32)
    fast, _ = mha(x, mask=causal_mask(6), need_weights=False)
    torch.testing.assert_close(fast, out)


def test_gqa_with_all_heads_is_the_plain_module():
    torch.manual_seed(0)
    a = MultiHeadAttention(16, 4).double()
    torch.manual_seed(0)
    b = MultiHeadAttention(16, 4, num_kv_heads=4).double()
    x = randn(1, 5, 16)
    torch.testing.assert_close(a(x)[0], b(x)[0])


@pytest.mark.parametrize("num_kv_heads", [1, 4])
def test_incremental_decoding_with_cache_equals_full_causal_pass(num_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads).double().eval()
    x = randn(2, 7, 16, seed=3)
    full, w_full = mha(x, mask=causal_mask(7))
    cache = KVCache()
    prompt, _ = mha(x[:, :3], mask=causal_mask(3), cache=cache)  # a 3-token prompt at once
    steps = [prompt]
    for t in range(3, 7):  # then one token at a time
        out, w = mha(x[:, t:t + 1], cache=cache)
        assert w.shape == (2, 4, 1, t + 1)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert len(cache) == 7 and cache.k.shape == (2, num_kv_heads, 7, 4)
    assert cache.nbytes == 2 * 2 * num_kv_heads * 7 * 4 * 8


def test_cache_memory_formula_and_errors():
    # Llama-2-7B-like: 32 layers, 32 heads of 128, float16 -> 512 KiB per token; GQA with 8 kv heads -> 128 KiB
    assert kv_cache_bytes_per_token(32, 32, 128) == 512 * 1024
    assert kv_cache_bytes_per_token(32, 8, 128) == 128 * 1024
    assert kv_cache_bytes_per_token(32, 1, 128, torch.float32) == 32 * 1024
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="do not fit"):
        cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="self-attention"):
        mha(torch.zeros(1, 1, 8), torch.zeros(1, 2, 8), cache=KVCache())


@pytest.mark.slow
@pytest.mark.parametrize("num_layers", [1, 2])
def test_decoder_only_generation_with_cache_gives_the_same_tokens_and_logits(num_layers):
    from attnbook.tasks import copy_task
    from attnbook.train import fit

    task = copy_task(length=6, num_symbols=6)
    model = tiny_decoder_only(task, d_model=32, num_heads=4, num_layers=num_layers, dim_feedforward=None, max_len=32)
    fit(model, task, steps=60, batch_size=32, lr=3e-3, device="cpu", progress=False)  # enough to emit real tokens
    src, _ = task.batch(16, seed=5, split="test")
    plain, plain_logits = model.generate(src, 7, return_logits=True)
    cached, cached_logits = model.generate(src, 7, use_cache=True, return_logits=True)
    assert torch.equal(plain, cached)
    torch.testing.assert_close(cached_logits, plain_logits, atol=1e-5, rtol=1e-5)
    assert cached_logits.shape[:2] == (16, plain_logits.shape[1]) and plain_logits.shape[1] >= 1


def test_cached_forward_rejects_padding_and_tracks_positions():
    from attnbook.tasks import copy_task

    task = copy_task(length=4, num_symbols=4)
    model = tiny_decoder_only(task, d_model=16, num_heads=2, num_layers=1, dim_feedforward=None, max_len=8).eval()
    caches = model.new_caches()
    ids = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        full = model(ids)
        a = model(ids[:, :2], caches=caches)
        b = model(ids[:, 2:], caches=caches)
    torch.testing.assert_close(torch.cat([a, b], dim=1), full)
    with pytest.raises(ValueError, match="padded"):
        model(torch.tensor([[0]]), caches=caches)
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.tensor([[4] * 6]), caches=caches)


def test_cache_bytes_equal_the_per_token_count():
    for hkv in (32, 8, 1):
        per_token = attnbook.kv_cache_bytes_per_token(32, hkv, 128, torch.float16)
        assert kv_cache_bytes(hkv, 8192) == 8192 * per_token
    assert kv_cache_bytes(8, 8192) == 2**30  # 32 layers x 8 KV heads x 128 x fp16 x K,V x 8k = 1 GiB
    # known sizes of real models' caches (fp16): Llama 2 7B (32 layers, 32 KV heads of 128) 0.5 MiB per token,
    # 2 GiB at its 4k context; Mistral 7B (8 KV heads) 4 GiB at 32k; Llama 2 70B (80 layers, 8 KV heads) 320 KiB
    assert attnbook.kv_cache_bytes_per_token(32, 32, 128, torch.float16) == 2**19
    assert kv_cache_bytes(32, 4096) == 2 * 2**30
    assert kv_cache_bytes(8, 32768) == 4 * 2**30
    assert attnbook.kv_cache_bytes_per_token(80, 8, 128, torch.float16) == 320 * 2**10
    assert kv_cache_bytes(4, 100, batch=3, num_layers=2, head_dim=16, dtype=torch.float32) == 3 * 100 * 2 * 2 * 4 * 16 * 4


def test_cache_bytes_match_a_real_cache():
    m = attnbook.MultiHeadAttention(32, 8, num_kv_heads=2)
    cache = attnbook.KVCache()
    with torch.no_grad():
        m(torch.randn(3, 5, 32), cache=cache)
    expected = kv_cache_bytes(2, 5, batch=3, num_layers=1, head_dim=4, dtype=torch.float32)
    assert cache.nbytes == expected


# ----------------------------------------------------------------------------- the preallocated cache


def _decode(mha, x, cache, prompt_len, rope=False):
    """Outputs (B, T, E) of ``mha`` run on ``x`` (B, T, E) as a prompt of ``prompt_len`` tokens, then one token at
    a time through ``cache``; with ``rope``, queries and keys rotated at their positions (past + arange(new))."""
    outs, T = [], x.shape[1]
    for start, end in [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len, T)]:
        q, k, v = mha.project(x[:, start:end])  # q (B, H, n, D); k, v (B, Hkv, n, D)
        past = len(cache)
        assert past == start
        if rope:
            pos = past + torch.arange(end - start)  # (n,) positions offset by the cache length
            q, k = apply_rotary(q, pos), apply_rotary(k, pos)
        k_all, v_all = cache.append(k, v)  # (B, Hkv, past + n, D)
        mask = causal_mask(end - start, past + end - start, offset=past)  # (n, S): new tokens after the past
        outs.append(mha.attend(q, k_all, v_all, mask)[0])
    return torch.cat(outs, dim=1)


def _uncached(mha, x, rope=False):
    q, k, v = mha.project(x)  # q (B, H, T, D); k, v (B, Hkv, T, D)
    if rope:
        q, k = apply_rotary(q), apply_rotary(k)  # positions 0 .. T-1
    return mha.attend(q, k, v, causal_mask(x.shape[1]))[0]


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("make_cache", [KVCache, lambda: StaticKVCache(12)], ids=["concatenating", "static"])
def test_both_caches_decode_as_the_uncached_pass_with_gqa_and_rope(make_cache, num_kv_heads, rope):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads).double().eval()
    x = randn(2, 10, 32, seed=4)
    with torch.no_grad():
        full = _uncached(mha, x, rope)
        cache = make_cache()
        torch.testing.assert_close(_decode(mha, x, cache, 3, rope), full)
    assert len(cache) == 10 and cache.k.shape == (2, num_kv_heads, 10, 8)
    assert cache.nbytes == 2 * 2 * num_kv_heads * 10 * 8 * 8  # keys and values of the 10 cached tokens
    if rope:  # without the offset (positions restarting at 0 each step) the answer is wrong
        with torch.no_grad():
            q, k, v = mha.project(x)
            wrong = mha.attend(apply_rotary(q, torch.zeros(10)), apply_rotary(k), v, causal_mask(10))[0]
        assert (wrong - full).abs().max() > 1e-3


def test_the_static_cache_writes_in_place_and_rejects_what_does_not_fit():
    cache = StaticKVCache(max_len=6)
    assert len(cache) == 0 and cache.allocated_bytes == 0 and cache.k is None
    k0, v0 = randn(2, 3, 4, 5, seed=1), randn(2, 3, 4, 7, seed=2)  # (B, Hkv, T_new, D) and (B, Hkv, T_new, Dv)
    k_all, v_all = cache.append(k0, v0)
    assert cache.k_buffer.shape == (2, 3, 6, 5) and cache.v_buffer.shape == (2, 3, 6, 7)
    assert cache.allocated_bytes == 2 * 3 * 6 * (5 + 7) * 8 and cache.nbytes == 2 * 3 * 4 * (5 + 7) * 8
    buffer = cache.k_buffer.data_ptr()
    k_all, v_all = cache.append(k0[:, :, :2], v0[:, :, :2])
    assert k_all.data_ptr() == buffer and cache.k_buffer.data_ptr() == buffer  # the same memory: no new tensor
    torch.testing.assert_close(k_all, torch.cat([k0, k0[:, :, :2]], dim=2))
    torch.testing.assert_close(v_all, torch.cat([v0, v0[:, :, :2]], dim=2))
    assert "length=6, max_len=6" in repr(cache)
    with pytest.raises(ValueError, match="the cache is full: max_len=6, it holds 6 tokens and 1 more do not fit"):
        cache.append(k0[:, :, :1], v0[:, :, :1])
    with pytest.raises(ValueError, match="do not fit the cache's"):
        cache.append(randn(2, 2, 1, 5), randn(2, 2, 1, 7))
    with pytest.raises(TypeError, match="the cache holds torch.float64"):
        cache.append(k0[:, :, :1].float(), v0[:, :, :1].float())
    cache.truncate(3)  # rewind: the next append overwrites positions 3..
    assert len(cache) == 3 and cache.k.shape == (2, 3, 3, 5)
    cache.append(k0[:, :, 3:], v0[:, :, 3:])
    torch.testing.assert_close(cache.k, torch.cat([k0[:, :, :3], k0[:, :, 3:]], dim=2))
    cache.reset()
    assert len(cache) == 0 and cache.allocated_bytes > 0  # the buffers are kept for the next sequence
    with pytest.raises(ValueError, match="max_len must be an int >= 1, got 0"):
        StaticKVCache(0)
    with pytest.raises(TypeError, match="max_len must be an int, got float"):
        StaticKVCache(4.0)
    with pytest.raises(ValueError, match=r"length must be an int in \[0, 0\], got 1"):
        cache.truncate(1)
    with pytest.raises(ValueError, match=r"k and v must be \(B, Hkv, T, D\)"):
        cache.append(randn(2, 3, 5), randn(2, 3, 5))


def test_the_concatenating_cache_truncates_and_checks_dtypes():
    cache = KVCache()
    k0 = randn(1, 2, 5, 4)
    cache.append(k0, k0)
    cache.truncate(2)
    assert len(cache) == 2
    torch.testing.assert_close(cache.append(k0[:, :, :1], k0[:, :, :1])[0], torch.cat([k0[:, :, :2], k0[:, :, :1]], 2))
    with pytest.raises(TypeError, match="the cache holds torch.float64"):
        cache.append(k0.float(), k0.float())
    cache.truncate(0)
    assert len(cache) == 0 and cache.k is None


def test_bytes_copied_per_step_grow_with_concatenation_and_stay_flat_in_place():
    from attnbook.kvcache import copied_bytes_per_step

    B, Hkv, D, prompt, steps = 2, 4, 16, 5, 8
    row = B * Hkv * D * 4  # bytes of one token's keys (or values), float32
    concat = copied_bytes_per_step(KVCache(), steps, batch=B, num_kv_heads=Hkv, head_dim=D, prompt_len=prompt)
    static = copied_bytes_per_step(StaticKVCache(prompt + steps), steps, batch=B, num_kv_heads=Hkv, head_dim=D,
                                   prompt_len=prompt)
    # step i grows the cache from prompt + i to prompt + i + 1 tokens: cat copies all of them, keys and values
    assert concat == [2 * (prompt + i + 1) * row for i in range(steps)]
    assert static == [2 * row] * steps  # only the new token's keys and values
    n = 100
    total = sum(copied_bytes_per_step(KVCache(), n, head_dim=8, prompt_len=1))
    assert total == 2 * 8 * 4 * sum(range(2, n + 2))  # quadratic in the generated length: n^2 / 2 tokens
    with pytest.raises(ValueError, match="the cache is full"):
        copied_bytes_per_step(StaticKVCache(4), 4, prompt_len=1)


def test_model_generation_with_a_static_cache():
    from attnbook.tasks import copy_task

    task = copy_task(length=4, num_symbols=5)
    model = tiny_decoder_only(task, d_model=16, num_heads=4, num_layers=2, dim_feedforward=None, max_len=16).eval()
    with torch.no_grad():
        model.head.bias[task.vocab.pad_id] = -100.0  # untrained: never emit PAD (a cached step refuses padding)
    src, _ = task.batch(4, seed=2, split="test")
    plain, plain_logits = model.generate(src, 6, return_logits=True)
    static, static_logits = model.generate(src, 6, use_cache=True, static_cache=True, return_logits=True)
    assert torch.equal(plain, static)
    torch.testing.assert_close(static_logits, plain_logits, atol=1e-5, rtol=1e-5)
    caches = model.new_caches(static=True)
    assert all(isinstance(c, StaticKVCache) and c.max_len == 16 for c in caches)


# ----------------------------------------------------------------------------- timing one decoding step


def test_decode_inputs_shapes_seed_and_dtype():
    q, k, v = decode_inputs(8, 2, 10, 16)
    assert q.shape == (1, 8, 1, 16) and k.shape == v.shape == (1, 2, 10, 16)
    assert q.dtype == k.dtype == torch.float32 and q.device.type == "cpu"
    again = decode_inputs(8, 2, 10, 16)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), again))  # seeded
    assert not torch.equal(q, decode_inputs(8, 2, 10, 16, seed=1)[0]) and not torch.equal(k, v)
    assert decode_inputs(4, 4, 3, 8, dtype=torch.float64)[1].dtype == torch.float64
    assert decode_inputs(4, 1, 3)[0].shape == (1, 4, 1, 128)  # the default head dim: MODEL_7B's
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=8"):
        decode_inputs(8, 3, 10)


def test_measure_decode_times_every_divisor_by_default_largest_first():
    t = measure_decode(8, 128, head_dim=16, rounds=1)
    assert list(t) == [decode_key(8, h, 128 // BENCH_DIVISOR) for h in (8, 4, 2, 1)]
    assert all(s > 0 for s in t.values())
    t = measure_decode(12, 64, head_dim=8, rounds=1)  # 12 has divisors no fraction H/n of KV_CHOICES reaches
    assert list(t) == [decode_key(12, h, 8) for h in (12, 6, 4, 3, 2, 1)]
    t = measure_decode(4, 64, [4], head_dim=8, rounds=1)
    assert set(t) == {decode_key(4, 4, 8)}
    assert set(measure_decode(4, 4, [1], head_dim=8, rounds=1)) == {decode_key(4, 1, 1)}  # at least one key
    with pytest.raises(ValueError, match="must divide"):
        measure_decode(8, 64, [3], rounds=1)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        measure_decode(8, 64.0, rounds=1)
    with pytest.raises(TypeError, match="rounds must be an int"):
        measure_decode(8, 64, [8], rounds=1.0)


def test_measure_decode_times_grouped_decode_attention_and_restores_the_threads(monkeypatch):
    import attnbook.kvcache as kvcache

    seen = []

    def spy(q, k, v):
        seen.append((tuple(q.shape), tuple(k.shape), torch.get_num_threads()))
        return grouped_decode_attention(q, k, v)

    monkeypatch.setattr(kvcache, "grouped_decode_attention", spy)
    before = torch.get_num_threads()
    measure_decode(8, 64, [8, 2], head_dim=4, rounds=1, threads=1)
    assert torch.get_num_threads() == before
    assert {(q, k) for q, k, _ in seen} == {((1, 8, 1, 4), (1, 8, 8, 4)), ((1, 8, 1, 4), (1, 2, 8, 4))}
    assert {n for _, _, n in seen} == {1}  # timed with the threads asked for


def test_decode_key_names_one_timing():
    assert decode_key(32, 8, 512) == (32, 8, 512, "cpu")
    assert decode_key(32, 8, 512, torch.device("cuda")) == decode_key(32, 8, 512, "cuda")
