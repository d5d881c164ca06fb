"""attnbook.sparse_attention: DeepSeek Sparse Attention equal to transformers' DeepseekV32Attention with copied
weights (tiny random configs, eager, CPU): padding, lengths below, at and past index_topk, decoding after a prefix
with a position offset; the selection's size; the errors."""

import pytest
import torch

from attnbook import causal_mask
from attnbook.latent import LatentKVCache
from attnbook.sparse_attention import IndexKeyCache, SparseLatentAttention, keys_read

T_ = pytest.importorskip("transformers", reason="transformers (test-only) is the reference")
V32 = pytest.importorskip("transformers.models.deepseek_v32.modeling_deepseek_v32",
                          reason="this transformers has no deepseek_v32")


def _pair(index_topk: int, seed: int = 0):
    torch.manual_seed(seed)
    cfg = T_.DeepseekV32Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=12,
                               kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                               index_n_heads=8, index_head_dim=8, index_topk=index_topk, num_hidden_layers=1,
                               vocab_size=16, intermediate_size=16, moe_intermediate_size=8, n_routed_experts=2,
                               num_experts_per_tok=1, n_group=1, topk_group=1)
    cfg._attn_implementation = "eager"
    hf = V32.DeepseekV32Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():  # transformers leaves some weights at init values (norms at 1): randomise all
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    rope = V32.DeepseekV32RotaryEmbedding(cfg)
    return hf, rope, SparseLatentAttention.from_hf(hf)


def _no_boundary_ties(m, x, allowed, k):
    """ReLU index scores tie at exactly 0; where a tie straddles the top-k boundary the kept key is arbitrary (ours
    and transformers' may differ), so the comparisons first check that none does."""
    B, T, _ = x.shape
    with torch.no_grad():
        pos = torch.arange(T)
        keys = m.indexer.keys(x, pos, *m._index_rope)
        scores = m.indexer.scores(x, m.q_a_layernorm(m.q_a_proj(x)), keys, pos, *m._index_rope)
    if T <= k:
        return True
    top = scores.masked_fill(~allowed, float("-inf")).topk(k + 1, -1).values
    seen = allowed.sum(-1) > k
    return not bool(((top[..., k - 1] == top[..., k]) & seen).any())


def _hf_out(hf, rope, x, allowed):
    """transformers' output for x (B, T, E) under the bool mask `allowed` (B, T, T), eager's additive form."""
    B, T, _ = x.shape
    pos = torch.arange(T)[None].expand(B, T)
    cos_sin = rope(x, pos)
    add = torch.zeros(B, 1, T, T).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
    with torch.no_grad():
        out, _ = hf(x, position_embeddings=cos_sin, attention_mask=add, position_ids=pos)
    return out


@pytest.mark.parametrize("T,topk", [(5, 8), (8, 8), (13, 8), (13, 3)])
def test_equals_transformers_prefill(T, topk):
    hf, rope, ours = _pair(topk)
    x = torch.randn(2, T, 32)
    allowed = causal_mask(T, T)[None].expand(2, T, T)
    assert _no_boundary_ties(ours, x, allowed, topk)
    expected = _hf_out(hf, rope, x, allowed)
    with torch.no_grad():
        got, _, selected = ours(x, mask=causal_mask(T, T), need_selection=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # each query reads min(topk, keys it may see): t + 1 keys up to topk, then topk
    assert keys_read(selected).tolist() == [[min(topk, t + 1) for t in range(T)]] * 2


def test_sparse_differs_from_dense_past_topk():
    """Past index_topk the selection changes the output (the test above is not passing on dense attention)."""
    _, _, ours = _pair(3)
    x = torch.randn(1, 12, 32)
    with torch.no_grad():
        sparse, _, _ = ours(x, mask=causal_mask(12, 12))
        ours.index_topk = 12
        dense, _, _ = ours(x, mask=causal_mask(12, 12))
    assert torch.allclose(sparse[:, :3], dense[:, :3], atol=1e-6)  # the first 3 queries see at most 3 keys
    assert (sparse[:, 3:] - dense[:, 3:]).abs().max() > 1e-3


def test_equals_transformers_with_left_padding():
    hf, rope, ours = _pair(4)
    T = 10
    x = torch.randn(2, T, 32)
    keep = torch.ones(2, T, dtype=torch.bool)
    keep[1, :3] = False  # the second sequence is left-padded by 3
    allowed = causal_mask(T, T)[None] & keep[:, None, :]  # (B, T, T)
    assert _no_boundary_ties(ours, x, allowed, 4)
    expected = _hf_out(hf, rope, x, allowed)
    with torch.no_grad():
        got, _, _ = ours(x, positions=torch.arange(T)[None].expand(2, T), mask=allowed[:, None])
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, 3:], expected[1, 3:], atol=1e-5, rtol=1e-5)  # the real tokens


@pytest.mark.parametrize("prefix", [4, 9])
def test_decoding_after_a_prefix_equals_the_full_sequence(prefix):
    """A prefix, then three tokens one at a time through the caches (positions offset by the cache's length):
    the outputs equal transformers' on the whole sequence at once, and the caches grow by Dc + Dr and Di a token."""
    hf, rope, ours = _pair(5)
    total = prefix + 3
    x = torch.randn(2, total, 32)
    allowed = causal_mask(total, total)[None].expand(2, total, total)
    assert _no_boundary_ties(ours, x, allowed, 5)
    expected = _hf_out(hf, rope, x, allowed)
    cache, index_cache = LatentKVCache(), IndexKeyCache()
    with torch.no_grad():
        first, _, _ = ours(x[:, :prefix], mask=causal_mask(prefix, prefix), cache=cache, index_cache=index_cache)
        steps = [ours(x[:, t : t + 1], cache=cache, index_cache=index_cache)[0] for t in range(prefix, total)]
    got = torch.cat([first, *steps], dim=1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert len(cache) == len(index_cache) == total
    assert index_cache.nbytes == 2 * total * 8 * 4 and cache.nbytes == 2 * total * (16 + 4) * 4


def test_errors():
    _, _, ours = _pair(4)
    x = torch.randn(1, 3, 32)
    with pytest.raises(ValueError, match="pass cache and index_cache together"):
        ours(x, cache=LatentKVCache())
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        ours(x, mask=torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"does not broadcast to \(B, 1, T, S\) = \(1, 1, 3, 3\)"):
        ours(x, mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="x must be \\(B, T, 32\\)"):
        ours(torch.randn(3, 32))
    with pytest.raises(ValueError, match="q_lora_rank is needed"):
        SparseLatentAttention(32, 4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,  # type: ignore[arg-type]
                              qk_rope_head_dim=4, v_head_dim=6, index_num_heads=2, index_head_dim=8, index_topk=4)
    with pytest.raises(ValueError, match="selected must be a bool"):
        keys_read(torch.zeros(1, 1, 2, 2))
    with pytest.raises(TypeError, match="expects a transformers DeepseekV32Attention"):
        SparseLatentAttention.from_hf(torch.nn.Linear(2, 2))
