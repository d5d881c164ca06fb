"""Grouped-query attention and the KV cache."""

import pytest
import torch
import torch.nn.functional as F

import attnbook
from attnbook import KVCache, MultiHeadAttention, causal_mask, kv_cache_bytes_per_token, merge_heads, split_heads
from attnbook.kvcache import kv_cache_bytes


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_gqa_equals_explicit_repeat_of_kv_heads(num_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 8, num_kv_heads=num_kv_heads).double()
    x = _x(2, 6, 32, seed=1)
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
    x = _x(1, 5, 16)
    torch.testing.assert_close(a(x)[0], b(x)[0])


@pytest.mark.parametrize("num_kv_heads", [1, 4])
def test_incremental_decoding_with_cache_equals_full_causal_pass(num_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads).double().eval()
    x = _x(2, 7, 16, seed=3)
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
    from attnbook.tasks import DecoderOnlyTransformer, copy_task
    from attnbook.train import fit

    task = copy_task(length=6, num_symbols=6)
    torch.manual_seed(0)
    model = DecoderOnlyTransformer(task.vocab, d_model=32, num_heads=4, num_layers=num_layers, max_len=32)
    fit(model, task, steps=60, batch_size=32, lr=3e-3, device="cpu", progress=False)  # enough to emit real tokens
    src, _ = task.batch(16, seed=5, split="test")
    plain, plain_logits = model.generate(src, 7, return_logits=True)
    cached, cached_logits = model.generate(src, 7, use_cache=True, return_logits=True)
    assert torch.equal(plain, cached)
    torch.testing.assert_close(cached_logits, plain_logits, atol=1e-5, rtol=1e-5)
    assert cached_logits.shape[:2] == (16, plain_logits.shape[1]) and plain_logits.shape[1] >= 1


def test_cached_forward_rejects_padding_and_tracks_positions():
    from attnbook.tasks import DecoderOnlyTransformer, copy_task

    task = copy_task(length=4, num_symbols=4)
    model = DecoderOnlyTransformer(task.vocab, d_model=16, num_heads=2, num_layers=1, max_len=8).eval()
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
