"""attnbook.configs: the published configs, the KV cache counted by kind of layer against hand computations,
against attnbook.kvcache's formula, and against transformers' cache classes (StaticCache, DynamicCache, and the
caches that tiny Qwen3-Next and DeepSeek-V3 models fill), plus the errors."""

import dataclasses

import pytest
import torch

import attnbook
from attnbook import kvcache
from attnbook.configs import (
    CONFIGS,
    DEEPSEEK_V3,
    GEMMA_3_27B,
    GPT_OSS_120B,
    LAYER_KIND_LABELS,
    LAYER_KINDS,
    LLAMA_3_8B,
    MISTRAL_7B,
    QWEN3_NEXT_80B,
    AttentionConfig,
    CacheRow,
    format_bytes,
    get_config,
    kv_cache_by_layer,
)

KiB, MiB, GiB = 2**10, 2**20, 2**30


def total(rows):
    return sum(r.bytes for r in rows)


def by_kind(rows):
    return {r.kind: r for r in rows}


# ------------------------------------------------------------------ the configs


def test_the_six_configs_and_their_sources():
    assert [c.num_layers for c in CONFIGS.values()] == [32, 32, 62, 61, 36, 48]
    for key, cfg in CONFIGS.items():
        assert get_config(key) is cfg and get_config(cfg) is cfg
        assert cfg.source == f"https://huggingface.co/{cfg.repo}/blob/main/config.json"
        assert len(cfg.verified) > 80  # every config says how its numbers were checked
        assert set(cfg.layer_types) <= set(LAYER_KINDS)
    assert MISTRAL_7B.sliding_window == 4096 and GPT_OSS_120B.sliding_window == 128
    assert GEMMA_3_27B.sliding_window == 1024
    assert (DEEPSEEK_V3.kv_lora_rank, DEEPSEEK_V3.qk_rope_head_dim) == (512, 64)
    # the 7B-class shape attnbook.kvcache counts with (chapter 9) is Llama's and Mistral's
    for cfg in (LLAMA_3_8B, MISTRAL_7B):
        assert (cfg.num_layers, cfg.head_dim) == (kvcache.MODEL_7B["num_layers"], kvcache.MODEL_7B["head_dim"])


def test_layer_patterns():
    full = [i for i, k in enumerate(GEMMA_3_27B.layer_types) if k == "full"]
    assert full == list(range(5, 62, 6)) and len(full) == 10  # 5 local : 1 global, layers 6, 12, ..., 60 (1-based)
    assert GEMMA_3_27B.count("sliding") == 52
    assert GPT_OSS_120B.layer_types[:4] == ("sliding", "full", "sliding", "full")
    assert GPT_OSS_120B.count("full") == GPT_OSS_120B.count("sliding") == 18
    assert QWEN3_NEXT_80B.layer_types[:4] == ("linear", "linear", "linear", "full")
    assert QWEN3_NEXT_80B.count("linear") == 36 and QWEN3_NEXT_80B.count("full") == 12
    assert DEEPSEEK_V3.count("mla") == 61 and LLAMA_3_8B.count("full") == 32 and MISTRAL_7B.count("sliding") == 32


# ------------------------------------------------------------------ against hand computations


def test_llama_3_8b_is_128_kib_per_token_and_1_gib_at_8k():
    # 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 131072 bytes = 128 KiB per token
    assert total(kv_cache_by_layer("llama-3-8b", 1)) == 32 * 8 * 128 * 2 * 2 == 128 * KiB
    (row,) = kv_cache_by_layer("llama-3-8b", 8192)
    assert row == CacheRow("full", 32, 8192, GiB)
    assert row.label == LAYER_KIND_LABELS["full"] == "global (full attention)"
    assert total(kv_cache_by_layer("llama-3-8b", 8192, batch=4)) == 4 * GiB
    assert total(kv_cache_by_layer("llama-3-8b", 8192, dtype_bytes=1)) == GiB // 2  # an fp8 cache
    assert total(kv_cache_by_layer("llama-3-8b", 8192, dtype_bytes=4)) == 2 * GiB


@pytest.mark.parametrize("S", [1, 100, 4096, 8192, 131072])
def test_full_attention_is_kvcache_formula(S):
    """The plain case is attnbook.kvcache's count (chapter 9), not a second formula."""
    assert total(kv_cache_by_layer("llama-3-8b", S, batch=3)) == kvcache.kv_cache_bytes(
        8, S, batch=3, num_layers=32, head_dim=128, dtype=torch.bfloat16)
    full = by_kind(kv_cache_by_layer("gemma-3-27b", S))["full"]
    assert full.bytes == S * attnbook.kv_cache_bytes_per_token(10, 16, 128, torch.bfloat16)


def test_sliding_layers_cap_at_the_window():
    per_token = 32 * 8 * 128 * 2 * 2
    for S in (1, 1000, 4095, 4096):  # within the window Mistral's cache is a full-attention one
        assert kv_cache_by_layer("mistral-7b-v0.1", S) == [CacheRow("sliding", 32, S, S * per_token)]
    for S in (4097, 8192, 131072):  # past it, 4096 tokens per layer whatever S: 512 MiB
        assert kv_cache_by_layer("mistral-7b-v0.1", S) == [CacheRow("sliding", 32, 4096, 512 * MiB)]
    # Gemma 3 27B: 52 local layers x 1024 tokens x 16 KV heads x 128 x 2 x 2 bytes = 416 MiB past S = 1024
    g = by_kind(kv_cache_by_layer("gemma-3-27b", 32768))
    assert g["sliding"] == CacheRow("sliding", 52, 1024, 52 * 1024 * 16 * 128 * 2 * 2)
    assert g["sliding"].bytes == 416 * MiB
    assert g["full"] == CacheRow("full", 10, 32768, 10 * 32768 * 16 * 128 * 2 * 2) and g["full"].bytes == int(2.5 * GiB)
    assert by_kind(kv_cache_by_layer("gemma-3-27b", 512))["sliding"].tokens == 512
    assert by_kind(kv_cache_by_layer("gemma-3-27b", 131072))["sliding"].bytes == 416 * MiB
    # gpt-oss-120b: 18 local layers of a 128-token window, 4.5 MiB at any S >= 128
    o = by_kind(kv_cache_by_layer("gpt-oss-120b", 131072))
    assert o["sliding"] == CacheRow("sliding", 18, 128, 18 * 128 * 8 * 64 * 2 * 2)
    assert o["sliding"].bytes == int(4.5 * MiB)
    assert o["full"].bytes == 18 * 131072 * 8 * 64 * 2 * 2 == int(4.5 * GiB)


def test_mla_caches_the_latent():
    # one latent of 512 plus one shared rotary key of 64 per token and layer: 576 numbers, 1152 bytes
    (row,) = kv_cache_by_layer("deepseek-v3", 1)
    assert row == CacheRow("mla", 61, 1, 61 * (512 + 64) * 2) and row.bytes == 70272
    assert total(kv_cache_by_layer("deepseek-v3", 131072)) == 131072 * 70272
    # what 128 heads' keys (128 + 64 dims) and values (128 dims) would take instead: 40960 numbers, 71x more
    expanded = 128 * (128 + 64) + 128 * 128
    assert expanded == 40960 and round(expanded / (512 + 64), 1) == 71.1
    assert total(kv_cache_by_layer("deepseek-v3", 4096, batch=2)) == 2 * 4096 * 61 * 576 * 2


def test_linear_state_does_not_grow_with_context():
    # Gated DeltaNet: a (32 value heads x 128 x 128) float32 state and a (2*16*128 + 32*128) x 4 conv cache in bf16
    state = 32 * 128 * 128 * 4
    conv = (2 * 16 * 128 + 32 * 128) * 4 * 2
    assert (state, conv) == (2_097_152, 65_536)
    rows = [by_kind(kv_cache_by_layer("qwen3-next-80b-a3b", S)) for S in (1, 1024, 262144, 10**6)]
    assert all(r["linear"] == CacheRow("linear", 36, None, 36 * (state + conv)) for r in rows)
    assert rows[0]["linear"].bytes == 77_856_768  # 74.25 MiB
    assert [r["full"].bytes for r in rows] == [S * 12 * 2 * 2 * 256 * 2 for S in (1, 1024, 262144, 10**6)]
    # the 12 full-attention layers' cache (24 KiB per token) equals the fixed state at 3168 tokens
    at = by_kind(kv_cache_by_layer("qwen3-next-80b-a3b", 3168))
    assert at["full"].bytes == at["linear"].bytes
    # the state's dtype is its own: bf16 states halve the recurrent part only
    half = by_kind(kv_cache_by_layer("qwen3-next-80b-a3b", 1, state_dtype_bytes=2))["linear"]
    assert half.bytes == 36 * (state // 2 + conv)


def test_rows_come_in_kind_order_and_totals():
    assert [r.kind for r in kv_cache_by_layer("gemma-3-27b", 8192)] == ["full", "sliding"]
    assert [r.kind for r in kv_cache_by_layer("qwen3-next-80b-a3b", 8192)] == ["full", "linear"]
    totals = {k: format_bytes(total(kv_cache_by_layer(k, 131072))) for k in CONFIGS}
    assert totals == {"llama-3-8b": "16 GiB", "mistral-7b-v0.1": "512 MiB", "gemma-3-27b": "10.4 GiB",
                      "deepseek-v3": "8.58 GiB", "gpt-oss-120b": "4.5 GiB", "qwen3-next-80b-a3b": "3.07 GiB"}


def test_a_custom_config():
    tiny = AttentionConfig(name="tiny", repo="none/tiny", source="", layer_types=("sliding", "full", "sliding"),
                           num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4)
    r = by_kind(kv_cache_by_layer(tiny, 10, dtype_bytes=4))
    assert r["sliding"] == CacheRow("sliding", 2, 4, 2 * 4 * 2 * 8 * 2 * 4)
    assert r["full"] == CacheRow("full", 1, 10, 10 * 2 * 8 * 2 * 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.head_dim = 16  # type: ignore[misc]


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 512, 128 * KiB, GiB, 416 * MiB, 70272, int(1023.6 * MiB))] == [
        "0 B", "512 B", "128 KiB", "1 GiB", "416 MiB", "68.6 KiB", "1024 MiB"]


# ------------------------------------------------------------------ errors


def test_errors():
    with pytest.raises(ValueError, match="context_len must be an int >= 1, got 0"):
        kv_cache_by_layer("llama-3-8b", 0)
    with pytest.raises(ValueError, match="context_len"):
        kv_cache_by_layer("llama-3-8b", -5)
    with pytest.raises(TypeError, match="context_len must be an int, got float"):
        kv_cache_by_layer("llama-3-8b", 1024.0)
    with pytest.raises(TypeError, match="context_len must be an int, got bool"):
        kv_cache_by_layer("llama-3-8b", True)
    with pytest.raises(ValueError, match="unknown config 'llama'; known configs: llama-3-8b, mistral-7b-v0.1"):
        kv_cache_by_layer("llama", 1024)
    with pytest.raises(TypeError, match="config must be a name of CONFIGS or an AttentionConfig, got int"):
        kv_cache_by_layer(8, 1024)
    with pytest.raises(ValueError, match=r"dtype_bytes must be one of \[1, 2, 4, 8\]"):
        kv_cache_by_layer("llama-3-8b", 1024, dtype_bytes=3)
    with pytest.raises(TypeError, match="dtype_bytes must be an int, got float"):
        kv_cache_by_layer("llama-3-8b", 1024, dtype_bytes=2.0)
    with pytest.raises(ValueError, match="state_dtype_bytes"):
        kv_cache_by_layer("qwen3-next-80b-a3b", 1024, state_dtype_bytes=0)
    with pytest.raises(ValueError, match="batch must be an int >= 1, got 0"):
        kv_cache_by_layer("llama-3-8b", 1024, batch=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        LLAMA_3_8B.count("global")
    base = dict(name="bad", repo="x/y", source="", num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    with pytest.raises(ValueError, match="bad: sliding layers need sliding_window, which is None"):
        AttentionConfig(layer_types=("sliding",), **base)
    with pytest.raises(ValueError, match=r"bad: unknown layer kinds \['global'\]"):
        AttentionConfig(layer_types=("global",), **base)
    with pytest.raises(TypeError, match="layer_types must be a non-empty tuple"):
        AttentionConfig(layer_types=["full"], **base)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad: mla layers need kv_lora_rank"):
        AttentionConfig(layer_types=("mla",), **base)
    with pytest.raises(ValueError, match="bad: num_kv_heads must be an int >= 1, got 0"):
        AttentionConfig(layer_types=("full",), **{**base, "num_kv_heads": 0})
    with pytest.raises(ValueError, match="n must be >= 0"):
        format_bytes(-1)
    with pytest.raises(TypeError, match="n must be a number of bytes"):
        format_bytes("1 GiB")


# ------------------------------------------------------------------ against transformers' cache classes

_KIND = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear"}


def _transformers():
    return pytest.importorskip("transformers", reason="transformers (test-only) checks the cache classes")


def _cache_bytes(cache) -> list[int]:
    """Bytes each layer of a transformers cache holds: keys and values, or conv and recurrent states."""
    out = []
    for layer in cache.layers:
        tensors = [getattr(layer, name, None) for name in ("keys", "values")]
        for name in ("conv_states", "recurrent_states"):
            tensors += list((getattr(layer, name, None) or {}).values())
        out.append(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)))
    return out


def test_layer_patterns_and_sizes_are_transformers_defaults():
    """transformers derives the same layer_types from the published pattern fields, and its config classes'
    defaults (documented as these checkpoints) carry the same sizes."""
    T = _transformers()
    gemma = T.Gemma3TextConfig(num_hidden_layers=62, sliding_window=1024)  # sliding_window_pattern 6 by default
    assert tuple(_KIND[t] for t in gemma.layer_types) == GEMMA_3_27B.layer_types
    oss = T.GptOssConfig()
    assert tuple(_KIND[t] for t in oss.layer_types) == GPT_OSS_120B.layer_types
    assert (oss.num_attention_heads, oss.num_key_value_heads, oss.head_dim, oss.sliding_window,
            oss.max_position_embeddings) == (64, 8, 64, 128, 131072)
    qn = T.Qwen3NextConfig()
    assert tuple(_KIND[t] for t in qn.layer_types) == QWEN3_NEXT_80B.layer_types
    for field in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                  "linear_conv_kernel_dim", "head_dim"):
        assert getattr(qn, field) == getattr(QWEN3_NEXT_80B, field), field
    assert (qn.num_attention_heads, qn.num_key_value_heads) == (16, 2)
    ds = T.DeepseekV3Config()
    assert (ds.num_hidden_layers, ds.num_attention_heads, ds.kv_lora_rank, ds.qk_rope_head_dim,
            ds.qk_nope_head_dim) == (61, 128, 512, 64, 128)
    mi = T.MistralConfig()
    # (its max_position_embeddings default, 4096 * 32, is not the checkpoint's 32768)
    assert (mi.num_hidden_layers, mi.num_attention_heads, mi.num_key_value_heads, mi.sliding_window,
            mi.hidden_size // mi.num_attention_heads) == (32, 32, 8, 4096, 128)


@pytest.mark.parametrize("which", ["gemma-3-27b", "gpt-oss-120b", "mistral-7b-v0.1"])
@pytest.mark.parametrize("S", [100, 1500, 5000])
def test_sliding_windows_match_transformers_caches(which, S):
    """The real layer pattern and window, with 1 KV head of 2 dims (so a 62-layer cache is small): transformers'
    StaticCache holds exactly what kv_cache_by_layer counts, min(S, window) tokens per sliding layer; the default
    DynamicCache keeps window - 1 of them between steps."""
    T = _transformers()
    cfg = dataclasses.replace(CONFIGS[which], num_kv_heads=1, head_dim=2)
    layer_types = [{"full": "full_attention", "sliding": "sliding_attention"}[k] for k in cfg.layer_types]
    tcfg = T.MistralConfig(num_hidden_layers=cfg.num_layers, num_attention_heads=2, num_key_value_heads=1, head_dim=2,
                           hidden_size=4, sliding_window=cfg.sliding_window, layer_types=layer_types)
    k = torch.zeros(1, 1, S, 2, dtype=torch.bfloat16)  # (B, Hkv, S, D): the prefill's keys (and values) of a layer
    static = T.StaticCache(config=tcfg, max_cache_len=S)
    dynamic = T.DynamicCache(config=tcfg)
    for i in range(cfg.num_layers):
        static.update(k, k, i)
        dynamic.update(k, k, i)
    rows = by_kind(kv_cache_by_layer(cfg, S))
    per_layer = {kind: row.bytes // row.num_layers for kind, row in rows.items()}
    assert _cache_bytes(static) == [per_layer[kind] for kind in cfg.layer_types]
    assert sum(_cache_bytes(static)) == total(rows.values())
    one_token = 2 * 1 * 2 * 2  # K and V, 1 head, 2 dims, bf16
    window = cfg.sliding_window or S
    assert _cache_bytes(dynamic) == [per_layer[kind] - (one_token if kind == "sliding" and S >= window else 0)
                                     for kind in cfg.layer_types]


def _run(model, ids, cache) -> None:
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)


def test_linear_state_matches_a_tiny_qwen3_next(capfd):
    """A tiny Qwen3-Next in bfloat16: the cache it fills holds, per linear layer, exactly the state and conv cache
    counted (float32 state, bf16 conv cache of 4 positions), the same after 3 and 40 tokens."""
    T = _transformers()
    torch.manual_seed(0)
    tcfg = T.Qwen3NextConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
                             linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
                             linear_conv_kernel_dim=4, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
                             shared_expert_intermediate_size=8)
    tcfg._attn_implementation = "eager"
    model = T.Qwen3NextModel(tcfg).eval().to(torch.bfloat16)
    cfg = AttentionConfig(name="tiny qwen3-next", repo="", source="",
                          layer_types=tuple(_KIND[t] for t in tcfg.layer_types), num_heads=4, num_kv_heads=2,
                          head_dim=8, max_position_embeddings=64, linear_num_key_heads=2, linear_num_value_heads=4,
                          linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4)
    for S in (3, 40):
        cache = T.DynamicCache(config=tcfg)
        _run(model, torch.randint(0, 64, (2, S)), cache)
        rows = by_kind(kv_cache_by_layer(cfg, S, batch=2))
        got = _cache_bytes(cache)
        assert [got[i] for i, k in enumerate(cfg.layer_types) if k == "linear"] == [rows["linear"].bytes // 3] * 3
        assert sum(got) == total(rows.values())
    capfd.readouterr()  # transformers' notes that it falls back to PyTorch kernels


def test_mla_matches_a_tiny_deepseek_v3():
    """A tiny DeepSeek-V3 in bfloat16 caches the latent (kv_lora_rank) and the rotary key (qk_rope_head_dim) per
    token and layer, not 4 heads' keys and values: what the MLA row counts."""
    T = _transformers()
    torch.manual_seed(0)
    tcfg = T.DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=32, moe_intermediate_size=8,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=2,
                              num_experts_per_tok=1, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=8,
                              qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1)
    tcfg._attn_implementation = "eager"
    model = T.DeepseekV3Model(tcfg).eval().to(torch.bfloat16)
    cfg = AttentionConfig(name="tiny deepseek", repo="", source="", layer_types=("mla", "mla"), num_heads=4,
                          num_kv_heads=4, head_dim=12, max_position_embeddings=64, kv_lora_rank=16, qk_rope_head_dim=4)
    cache = T.DynamicCache(config=tcfg)
    _run(model, torch.randint(0, 64, (2, 10)), cache)
    assert _cache_bytes(cache) == [2 * 10 * (16 + 4) * 2] * 2
    assert sum(_cache_bytes(cache)) == total(kv_cache_by_layer(cfg, 10, batch=2))


def test_rope_parameters_of_the_released_models():
    from attnbook.configs import ROPE_PARAMETERS
    from attnbook.positional import rope_frequencies

    assert set(ROPE_PARAMETERS) <= set(CONFIGS)
    for key, entry in ROPE_PARAMETERS.items():
        assert entry["max_position_embeddings"] == CONFIGS[key].max_position_embeddings
        for kind in ("full_attention", "sliding_attention"):
            if kind in entry:
                inv_freq, factor = rope_frequencies(entry["rotary_dim"], entry[kind])  # valid settings
                assert inv_freq.shape == (entry["rotary_dim"] // 2,) and factor >= 1.0
        if entry["full_attention"]["rope_type"] == "yarn":  # the extension factor is the context's ratio
            rope = entry["full_attention"]
            assert rope["factor"] * rope["original_max_position_embeddings"] == entry["max_position_embeddings"]
    transformers = pytest.importorskip("transformers")
    if hasattr(transformers, "GptOssConfig") and hasattr(transformers.PretrainedConfig, "standardize_rope_params"):
        assert transformers.GptOssConfig().rope_parameters == ROPE_PARAMETERS["gpt-oss-120b"]["full_attention"]
