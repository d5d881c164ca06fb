"""attnbook.configs' 2026 models (CONFIGS_2026): their layer patterns against transformers' config classes, their
KV caches against hand computations, and the four new kinds of layer against the caches that tiny Gemma 4,
DeepSeek-V3.2 and DeepSeek-V4 models fill in transformers."""

import dataclasses

import pytest
import torch

from attnbook.configs import (
    ALL_LAYER_KINDS,
    CONFIGS,
    CONFIGS_2026,
    DEEPSEEK_V3,
    DEEPSEEK_V4_FLASH,
    DEEPSEEK_V32,
    GEMMA_4_31B,
    GEMMA_4_E4B,
    KIMI_LINEAR_48B,
    LAYER_KIND_LABELS,
    LAYER_KINDS,
    QWEN3_5_35B,
    AttentionConfig,
    get_config,
    kv_cache_by_layer,
)

KiB, MiB, GiB = 2**10, 2**20, 2**30


def total(rows):
    return sum(r.bytes for r in rows)


def by_kind(rows):
    return {r.kind: r for r in rows}


def _transformers():
    return pytest.importorskip("transformers", reason="transformers (test-only) checks the configs and caches")


def test_the_2026_configs_and_their_sources():
    assert [c.num_layers for c in CONFIGS_2026.values()] == [61, 43, 60, 42, 27, 40]
    assert not set(CONFIGS) & set(CONFIGS_2026)
    for key, cfg in CONFIGS_2026.items():
        assert get_config(key) is cfg
        assert cfg.source == f"https://huggingface.co/{cfg.repo}/blob/main/config.json"
        assert len(cfg.verified) > 80
    # chapter 12's six keep the four kinds the KV budget explorer draws
    assert all(set(c.layer_types) <= set(LAYER_KINDS) for c in CONFIGS.values())
    assert set(LAYER_KIND_LABELS) == set(ALL_LAYER_KINDS)


def test_layer_counts():
    assert (DEEPSEEK_V4_FLASH.count("sliding"), DEEPSEEK_V4_FLASH.count("csa"), DEEPSEEK_V4_FLASH.count("hca")) == (2, 21, 20)
    assert DEEPSEEK_V4_FLASH.layer_types[:5] == ("sliding", "sliding", "csa", "hca", "csa")
    assert (GEMMA_4_E4B.count("sliding"), GEMMA_4_E4B.count("full"), GEMMA_4_E4B.count("shared")) == (20, 4, 18)
    assert (GEMMA_4_31B.count("sliding"), GEMMA_4_31B.count("full")) == (50, 10)
    assert (KIMI_LINEAR_48B.count("linear"), KIMI_LINEAR_48B.count("mla")) == (20, 7)
    assert (QWEN3_5_35B.count("linear"), QWEN3_5_35B.count("full")) == (30, 10)
    assert DEEPSEEK_V32.count("sparse_mla") == 61


def test_by_hand():
    S = 2**20
    # DeepSeek-V3.2: V3's 576-number latent plus a 128-number indexer key, per token and layer
    assert total(kv_cache_by_layer("deepseek-v3.2", S)) == 61 * S * (512 + 64 + 128) * 2
    assert total(kv_cache_by_layer("deepseek-v3.2", S)) / total(kv_cache_by_layer(DEEPSEEK_V3, S)) == 704 / 576
    # DeepSeek-V4-Flash: one 512-number vector (keys are values) per token; window 128; 1 in 4 and 1 in 128 kept
    rows = by_kind(kv_cache_by_layer("deepseek-v4-flash", S))
    assert rows["sliding"].bytes == 2 * 128 * 512 * 2
    assert rows["csa"].tokens == 128 + S // 4 and rows["hca"].tokens == 128 + S // 128
    assert rows["csa"].bytes == 21 * (128 * 512 * 2 + (S // 4) * (512 + 128) * 2)
    assert rows["hca"].bytes == 20 * (128 * 512 * 2 + (S // 128) * 512 * 2)
    # Gemma 4: global layers with 512-dim heads (4 of them in 31B), local ones with 256-dim; shared layers hold 0
    rows = by_kind(kv_cache_by_layer("gemma-4-31b", S))
    assert rows["full"].bytes == 10 * S * 2 * 4 * 512 * 2 and rows["sliding"].bytes == 50 * 1024 * 2 * 16 * 256 * 2
    rows = by_kind(kv_cache_by_layer("gemma-4-e4b", S))
    assert rows["shared"].bytes == 0 and rows["shared"].num_layers == 18
    assert rows["full"].bytes == 4 * S * 2 * 2 * 512 * 2 and rows["sliding"].bytes == 20 * 512 * 2 * 2 * 256 * 2
    unshared = dataclasses.replace(GEMMA_4_E4B, layer_types=tuple(
        "sliding" if (i + 1) % 6 else "full" for i in range(42)))
    assert total(kv_cache_by_layer(unshared, S)) / total(kv_cache_by_layer(GEMMA_4_E4B, S)) == pytest.approx(7 / 4, rel=1e-3)
    # Kimi Linear: 7 MLA layers grow, 20 KDA layers hold 32 heads of 128 x 128 in float32 and a conv cache
    rows = by_kind(kv_cache_by_layer("kimi-linear-48b-a3b", S))
    assert rows["mla"].bytes == 7 * S * 576 * 2
    assert rows["linear"].bytes == 20 * (32 * 128 * 128 * 4 + 3 * 32 * 128 * 4 * 2)
    assert kv_cache_by_layer("kimi-linear-48b-a3b", 1)[1] == rows["linear"]


def test_errors():
    base = dict(name="bad", repo="", source="", num_heads=2, num_kv_heads=1, head_dim=4, max_position_embeddings=8)
    with pytest.raises(ValueError, match="bad: sparse_mla layers need index_head_dim"):
        AttentionConfig(layer_types=("sparse_mla",), kv_lora_rank=4, qk_rope_head_dim=2, **base)
    with pytest.raises(ValueError, match="bad: csa layers need csa_compress_rate"):
        AttentionConfig(layer_types=("csa",), sliding_window=4, index_head_dim=2, **base)
    with pytest.raises(ValueError, match="bad: hca layers need sliding_window"):
        AttentionConfig(layer_types=("hca",), hca_compress_rate=4, **base)
    with pytest.raises(ValueError, match="layer 0 cannot be one"):
        AttentionConfig(layer_types=("shared", "full"), **base)
    with pytest.raises(TypeError, match="keys_are_values must be a bool, got 1"):
        AttentionConfig(layer_types=("full",), keys_are_values=1, **base)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad: global_head_dim must be an int >= 1, got 0"):
        AttentionConfig(layer_types=("full",), global_head_dim=0, **base)
    with pytest.raises(ValueError, match="unknown config 'gemma-5'.*deepseek-v4-flash"):
        get_config("gemma-5")


# ------------------------------------------------------------------ against transformers


def test_layer_patterns_are_transformers_configs():
    T = _transformers()
    v4 = T.DeepseekV4Config(compress_ratios=[0, 0] + [4, 128] * 20 + [4, 0])  # the Flash-Base field, MTP slot last
    kinds = {"sliding_attention": "sliding", "compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}
    assert tuple(kinds[t] for t in v4.layer_types) == DEEPSEEK_V4_FLASH.layer_types
    assert (v4.num_attention_heads, v4.num_key_value_heads, v4.head_dim, v4.sliding_window, v4.index_head_dim,
            v4.qk_rope_head_dim, v4.max_position_embeddings) == (64, 1, 512, 128, 128, 64, 1048576)
    assert v4.compress_rates == {"compressed_sparse_attention": DEEPSEEK_V4_FLASH.csa_compress_rate,
                                 "heavily_compressed_attention": DEEPSEEK_V4_FLASH.hca_compress_rate}
    v32 = T.DeepseekV32Config()
    assert (v32.num_hidden_layers, v32.kv_lora_rank, v32.qk_rope_head_dim, v32.index_head_dim) == (61, 512, 64, 128)
    for cfg, kw in ((GEMMA_4_E4B, dict(num_hidden_layers=42, num_key_value_heads=2, num_kv_shared_layers=18,
                                       hidden_size_per_layer_input=256)),
                    (GEMMA_4_31B, dict(num_hidden_layers=60, num_key_value_heads=16, num_global_key_value_heads=4,
                                       attention_k_eq_v=True, sliding_window=1024, hidden_size_per_layer_input=0))):
        g = T.Gemma4TextConfig(layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * (kw["num_hidden_layers"] // 6),
                               **kw)
        ours = tuple("shared" if mode == "reuse" else {"sliding_attention": "sliding", "full_attention": "full"}[t]
                     for t, mode in zip(g.layer_types, g.kv_sharing_modes, strict=True))
        assert ours == cfg.layer_types
        full = [i for i, t in enumerate(g.layer_types) if t == "full_attention"]
        assert {(g.per_layer_config[i].head_dim, g.per_layer_config[i].num_key_value_heads) for i in full} == {
            (cfg.global_head_dim, cfg.global_num_kv_heads)}
        local = g.layer_types.index("sliding_attention")
        assert (g.per_layer_config[local].head_dim, g.per_layer_config[local].num_key_value_heads,
                g.sliding_window) == (cfg.head_dim, cfg.num_kv_heads, cfg.sliding_window)
    kimi = T.KimiLinearConfig(linear_attn_config={
        "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4})
    assert tuple({"full_attention": "mla", "linear_attention": "linear"}[t] for t in kimi.layer_types) == \
        KIMI_LINEAR_48B.layer_types
    assert (kimi.kv_lora_rank, kimi.qk_rope_head_dim, kimi.linear_num_heads, kimi.linear_head_dim) == (512, 64, 32, 128)
    q = T.Qwen3_5MoeTextConfig()
    assert tuple({"full_attention": "full", "linear_attention": "linear"}[t] for t in q.layer_types) == \
        QWEN3_5_35B.layer_types
    for field in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                  "linear_conv_kernel_dim", "head_dim", "max_position_embeddings"):
        assert getattr(q, field) == getattr(QWEN3_5_35B, field), field
    assert (q.num_attention_heads, q.num_key_value_heads) == (QWEN3_5_35B.num_heads, QWEN3_5_35B.num_kv_heads)


def _layer_bytes(layer, dedupe: bool = False) -> int:
    """Bytes one transformers cache layer holds: its tensors, the tensors of its dict-valued state, each storage once
    where ``dedupe`` (DeepSeek-V4 points values at the keys' storage); buffers of unfinished windows left out."""
    tensors = [v for k, v in vars(layer).items() if isinstance(v, torch.Tensor) and k != "_sliding_window_tensor"]
    for k, v in vars(layer).items():
        if isinstance(v, dict) and k == "compressed_kv":
            tensors += [t for t in v.values() if isinstance(t, torch.Tensor)]
    seen, out = set(), 0
    for t in tensors:
        if dedupe and t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out += t.numel() * t.element_size()
    return out


def _run(model, ids, cache) -> None:
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)


def test_gemma4_shared_layers_hold_nothing():
    """A tiny Gemma 4 with its last 2 of 6 layers sharing: transformers gives those layers no cache at all, and
    the others hold what kv_cache_by_layer counts (its DynamicCache keeps window - 1 tokens between steps)."""
    T = _transformers()
    torch.manual_seed(0)
    g = T.Gemma4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=6,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8, global_head_dim=16,
                           sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 3,
                           num_kv_shared_layers=2, hidden_size_per_layer_input=4, vocab_size_per_layer_input=64)
    g._attn_implementation = "eager"
    model = T.Gemma4TextModel(g).eval().to(torch.bfloat16)
    cache = T.DynamicCache(config=g)
    _run(model, torch.randint(0, 64, (2, 10)), cache)
    cfg = AttentionConfig(name="tiny gemma 4", repo="", source="", num_heads=2, num_kv_heads=1, head_dim=8,
                          global_head_dim=16, max_position_embeddings=64, sliding_window=4,
                          layer_types=("sliding", "full") * 2 + ("shared",) * 2)
    rows = by_kind(kv_cache_by_layer(cfg, 10, batch=2))
    one_token = 2 * 1 * 8 * 2 * 2  # batch 2, K and V, one head of 8, bf16
    got = [_layer_bytes(layer) for layer in cache.layers]
    assert got == [rows["sliding"].bytes // 2 - one_token, rows["full"].bytes // 2] * 2 + [0, 0]


def test_deepseek_v32_caches_latent_and_indexer_key():
    T = _transformers()
    torch.manual_seed(0)
    d = T.DeepseekV32Config(vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=2,
                            num_experts_per_tok=1, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=8,
                            qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1,
                            index_topk=4, index_head_dim=8, index_n_heads=2)
    d._attn_implementation = "eager"
    model = T.DeepseekV32Model(d).eval().to(torch.bfloat16)
    cache = T.DynamicCache(config=d)
    _run(model, torch.randint(0, 64, (2, 10)), cache)
    cfg = AttentionConfig(name="tiny v3.2", repo="", source="", layer_types=("sparse_mla",) * 2, num_heads=4,
                          num_kv_heads=4, head_dim=12, max_position_embeddings=64, kv_lora_rank=16,
                          qk_rope_head_dim=4, index_head_dim=8)
    assert [_layer_bytes(layer) for layer in cache.layers] == [2 * 10 * (16 + 4 + 8) * 2] * 2
    assert sum(_layer_bytes(layer) for layer in cache.layers) == total(kv_cache_by_layer(cfg, 10, batch=2))


@pytest.mark.parametrize("S", [10, 13])
def test_deepseek_v4_caches_window_and_compressed_entries(S):
    """A tiny DeepSeek-V4 (window 4, rates 2 and 4): each compressing layer holds the window's K=V vectors once and
    S // rate compressed entries (plus, for CSA, the indexer's keys), as counted."""
    T = _transformers()
    torch.manual_seed(0)
    v = T.DeepseekV4Config(vocab_size=64, hidden_size=32, moe_intermediate_size=8, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=8,
                           n_routed_experts=2, num_experts_per_tok=1, sliding_window=4, o_groups=2, o_lora_rank=8,
                           index_n_heads=2, index_head_dim=8, index_topk=2, partial_rotary_factor=0.25, hc_mult=2,
                           compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
                           layer_types=["sliding_attention", "compressed_sparse_attention",
                                        "heavily_compressed_attention"])
    v._attn_implementation = "eager"
    model = T.DeepseekV4Model(v).eval().to(torch.bfloat16)
    cache = T.DynamicCache(config=v)
    _run(model, torch.randint(0, 64, (2, S)), cache)
    cfg = AttentionConfig(name="tiny v4", repo="", source="", layer_types=("sliding", "csa", "hca"), num_heads=4,
                          num_kv_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=4,
                          index_head_dim=8, csa_compress_rate=2, hca_compress_rate=4, keys_are_values=True)
    rows = by_kind(kv_cache_by_layer(cfg, S, batch=2))
    one_token = 2 * 16 * 2  # batch 2, one 16-number vector, bf16 (DynamicCache keeps window - 1 between steps)
    assert cache.layers[1].keys.data_ptr() == cache.layers[1].values.data_ptr()
    got = [_layer_bytes(layer, dedupe=True) for layer in cache.layers]
    assert got[1:] == [rows["csa"].bytes - one_token, rows["hca"].bytes - one_token]
    # the sliding-only layer is a plain DynamicSlidingWindowLayer, which keeps its K=V twice: counted once here
    assert _layer_bytes(cache.layers[0]) == 2 * (rows["sliding"].bytes - one_token)
