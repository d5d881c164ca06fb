"""Tests for attnbook.latent: multi-head latent attention (MLA), its latent cache, absorption, accounting.

Dimension legend: B batch, H heads, T query length, S key length, E model dim, Dn / Dr / Dv the per-head
no-position, RoPE and value widths, Dc the latent width (kv_lora_rank).
"""

from __future__ import annotations

import pytest
import torch

from attnbook import KVCache, StaticKVCache, causal_mask, kv_cache_bytes_per_token
from attnbook.latent import (
    DEEPSEEK_V3_MLA,
    MLA_FORMS,
    LatentKVCache,
    MultiHeadLatentAttention,
    absorb_through_rotated_key,
    mla_cache_bytes_per_token,
    mla_cache_elements_per_token,
    mla_step_cost,
)
from attnbook.measure import tracked_memory
from tests.helpers import max_rel_diff

E, H, DC, DN, DR, DV = 64, 4, 24, 16, 8, 12  # Dc, Dn, Dv and Dc + Dr != Dn + Dr all differ: a mix-up fails
SIZES = dict(kv_lora_rank=DC, qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV)


def _mla(q_lora_rank: int | None = None, dtype: torch.dtype = torch.float32, seed: int = 0,
         **kw: object) -> MultiHeadLatentAttention:
    torch.manual_seed(seed)
    mla = MultiHeadLatentAttention(E, H, q_lora_rank=q_lora_rank, **SIZES, **kw).to(dtype).eval()  # type: ignore[arg-type]
    with torch.no_grad():  # RMSNorm weights start at 1: make them differ, so that a missed one shows
        for norm in (mla.q_a_layernorm, mla.kv_a_layernorm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    return mla


def _x(*shape: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------- Hugging Face reference


@pytest.fixture(scope="module")
def deepseek_v3():
    """transformers' deepseek_v3 modelling module (imported once: it takes seconds)."""
    pytest.importorskip("transformers", reason="the reference DeepseekV3Attention needs transformers")
    import transformers.models.deepseek_v3.modeling_deepseek_v3 as modeling

    return modeling


def _hf(modeling, q_lora_rank: int | None, rope_interleave: bool = True, rope_parameters: dict | None = None,
        attention_bias: bool = False, max_position_embeddings: int = 128):
    config = modeling.DeepseekV3Config(
        hidden_size=E, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora_rank, kv_lora_rank=DC,
        qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV, rope_interleave=rope_interleave,
        attention_bias=attention_bias,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
        num_hidden_layers=1, vocab_size=32, intermediate_size=32, moe_intermediate_size=16, n_routed_experts=4,
        max_position_embeddings=max_position_embeddings,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = modeling.DeepseekV3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for module in attn.modules():
            if hasattr(module, "variance_epsilon"):  # the RMSNorms: weights other than 1
                module.weight.uniform_(0.5, 1.5)
    return attn, modeling.DeepseekV3RotaryEmbedding(config)


def _additive(mask: torch.Tensor, B: int) -> torch.Tensor:
    """Bool (T, S), True = may attend -> Hugging Face's additive float mask (B, 1, T, S)."""
    bias = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)  # (T, S)
    return bias[None, None].expand(B, 1, *mask.shape)


@pytest.mark.parametrize("q_lora_rank, rope_interleave, bias, scale", [(None, True, False, 1.0), (24, True, False, 1.0),
                                                                     (24, False, True, 1.0), (24, True, False, 1e3)])
def test_prefill_equals_hugging_face_deepseek_v3(deepseek_v3, q_lora_rank, rope_interleave, bias, scale):
    attn, rotary = _hf(deepseek_v3, q_lora_rank, rope_interleave, attention_bias=bias)
    with torch.no_grad():
        if bias:  # biases start at zero-ish: make them count
            for lin in (attn.q_a_proj, attn.kv_a_proj_with_mqa, attn.o_proj):
                lin.bias.uniform_(-0.5, 0.5)
        attn.o_proj.weight.mul_(scale)  # scale > 1: large outputs
    mla = MultiHeadLatentAttention.from_hf(attn)
    assert (mla.q_proj is None) == (q_lora_rank is not None) and (mla.o_proj.bias is not None) == bias
    B, T = 2, 20
    x = _x(B, T, E)
    position_ids = torch.arange(T)[None].expand(B, T)  # (B, T)
    mask = causal_mask(T)
    with torch.no_grad():
        ref, ref_w = attn(x, rotary(x, position_ids), _additive(mask, B))
        for absorb in (False, True):
            out, w = mla(x, mask=mask, absorb=absorb, need_weights=True)
            assert max_rel_diff(out, ref) < 1e-5  # relative to the output's size
            assert max_rel_diff(w, ref_w) < 1e-5
    assert ref.abs().max() > 0.1  # a real output, not one that any zero would match
    if scale > 1:  # one float32 step of the largest output exceeds 1e-5: an absolute 1e-5 would fail this
        assert float(ref.abs().max()) * torch.finfo(torch.float32).eps > 1e-5


def test_per_sequence_positions_equal_hugging_face(deepseek_v3):
    attn, rotary = _hf(deepseek_v3, 24)
    mla = MultiHeadLatentAttention.from_hf(attn)
    B, T = 2, 17
    x = _x(B, T, E, seed=2)
    gap = torch.arange(T) + 5 * (torch.arange(T) >= 9)  # 0 .. 8, then 14 .. 21: a gap of 5 positions
    position_ids = torch.stack([torch.arange(T) + 3, gap])  # (B, T)
    mask = causal_mask(T)
    with torch.no_grad():
        ref, _ = attn(x, rotary(x, position_ids), _additive(mask, B))
        out, _ = mla(x, position_ids, mask)
        shifted, _ = mla(x, mask=mask)  # both at 0 .. T-1: the first is the same (RoPE is relative), the second not
    assert max_rel_diff(out, ref) < 1e-5
    assert max_rel_diff(shifted[0], ref[0]) < 1e-5
    assert max_rel_diff(shifted[1, 9:], ref[1, 9:]) > 1e-3


def test_from_hf_refuses_other_modules_and_unknown_rope_types(deepseek_v3):
    with pytest.raises(TypeError, match="DeepseekV3Attention, got Linear"):
        MultiHeadLatentAttention.from_hf(torch.nn.Linear(2, 2))
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
    attn, _ = _hf(deepseek_v3, None, rope_parameters=dynamic)
    with pytest.raises(ValueError, match=r"rope_type'\] = 'dynamic' is not supported; attnbook knows default, linear, yarn"):
        MultiHeadLatentAttention.from_hf(attn)


# transformers 4.57's DeepseekV3Config (Colab's) has no rope_parameters: rope_theta and rope_scaling side by side,
# rope_scaling as DeepSeek-V3's config.json writes it ("type": "yarn"; 4.57 copies it to "rope_type").
_V3_YARN_4X = {"type": "yarn", "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
V4_CASES = {  # name: (the 5.x rope_parameters, the 4.x rope_theta and rope_scaling, max_position_embeddings)
    "default": ({"rope_type": "default", "rope_theta": 10000.0}, {"rope_theta": 10000.0, "rope_scaling": None}, 128),
    "deepseek-v3 yarn": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                          "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                          "mscale": 1.0, "mscale_all_dim": 1.0},
                         {"rope_theta": 10000.0, "rope_scaling": _V3_YARN_4X}, 163840),
    "yarn, original length from max_position_embeddings": (
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0},
        {"rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 4.0}}, 512),
    "linear": ({"rope_type": "linear", "rope_theta": 500.0, "factor": 8.0},
               {"rope_theta": 500.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 128),
}
_V4_COPIED = ("hidden_size", "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
              "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave", "attention_bias",
              "max_position_embeddings")


@pytest.mark.parametrize("name", list(V4_CASES))
def test_from_hf_reads_a_transformers_4x_config(deepseek_v3, name):
    import copy
    import types

    rope_5x, rope_4x, max_positions = V4_CASES[name]
    attn, rotary = _hf(deepseek_v3, 24, rope_parameters=dict(rope_5x), max_position_embeddings=max_positions)
    legacy = copy.copy(attn)  # the same weights, reading a 4.57-shaped config
    legacy.config = types.SimpleNamespace(**{k: getattr(attn.config, k) for k in _V4_COPIED},
                                          **copy.deepcopy(rope_4x))
    new, old = MultiHeadLatentAttention.from_hf(attn), MultiHeadLatentAttention.from_hf(legacy)
    assert torch.equal(old.rope_inv_freq, new.rope_inv_freq)
    assert (old.rope_attention_factor, old.scaling, old.rope_base) == (new.rope_attention_factor, new.scaling,
                                                                       new.rope_base)
    assert old.rope_scaling == new.rope_scaling
    assert (old.rope_scaling or {}).get("rope_type", "default") == rope_5x["rope_type"]
    if "original length" in name:
        assert old.rope_scaling is not None and old.rope_scaling["original_max_position_embeddings"] == 512
    if name == "deepseek-v3 yarn":
        assert old.scaling > 1.8 * old.qk_head_dim ** -0.5  # mscale^2 = 1.874 carried into the softmax scale
    B, T = 2, 12
    x = _x(B, T, E, seed=7)
    position_ids = torch.arange(T)[None].expand(B, T) + 3000  # where the scaled frequencies matter
    mask = causal_mask(T)
    with torch.no_grad():
        ref, _ = attn(x, rotary(x, position_ids), _additive(mask, B))
        out, _ = old(x, position_ids, mask)
    assert max_rel_diff(out, ref) < 2e-5  # float32 at positions ~3000 (measured: 2e-6 at most)


def test_kv_b_proj_rows_go_head_by_head():
    """kv_b_proj's output rows are [head 0's k_nope | head 0's v | head 1's k_nope | ...], not two halves; the
    query's rows [head 0's q_nope | head 0's q_rope | ...] likewise."""
    mla = _mla(24)
    w = mla.kv_b_proj.weight  # (H * (Dn + Dv), Dc)
    w_uk, w_uv = mla.absorbed_weights()  # (H, Dn, Dc), (H, Dv, Dc)
    for h in range(H):
        start = h * (DN + DV)
        assert torch.equal(w_uk[h], w[start : start + DN]) and torch.equal(w_uv[h], w[start + DN : start + DN + DV])
    assert not torch.equal(w_uk.reshape(H * DN, DC), w[: H * DN])  # the first "half" is not W_UK
    c = _x(1, 5, DC, seed=8)
    k_nope, v = mla.expand(c)  # (1, H, 5, Dn), (1, H, 5, Dv)
    torch.testing.assert_close(k_nope, torch.einsum("hnc,bsc->bhsn", w_uk, c))
    torch.testing.assert_close(v, torch.einsum("hvc,bsc->bhsv", w_uv, c))
    x = _x(1, 5, E, seed=9)
    q_nope, _ = mla.queries(x, torch.arange(5))  # (1, H, 5, Dn)
    assert mla.q_b_proj is not None and mla.q_a_proj is not None and mla.q_a_layernorm is not None
    q = mla.q_b_proj(mla.q_a_layernorm(mla.q_a_proj(x)))  # (1, 5, H * (Dn + Dr))
    for h in range(H):
        start = h * (DN + DR)
        torch.testing.assert_close(q_nope[0, h], q[0, :, start : start + DN])


def test_deepseek_v3_constants_are_transformers_defaults(deepseek_v3):
    config = deepseek_v3.DeepseekV3Config()
    for name, value in DEEPSEEK_V3_MLA.items():
        assert getattr(config, name) == value, name


# ----------------------------------------------------------------------------- decoding


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> None:
    """max |a - b| / max |b| < rtol: relative to the output's size."""
    assert max_rel_diff(a, b) < rtol


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_absorbed_decoding_equals_naive_and_full_recomputation(dtype, rtol, q_lora_rank):
    mla = _mla(q_lora_rank, dtype)
    B, prompt, steps = 2, 4, 20
    x = _x(B, prompt + steps, E, seed=3, dtype=dtype)
    caches = {"naive": LatentKVCache(), "absorbed": LatentKVCache(), "static": LatentKVCache(max_len=prompt + steps),
              "expanded": KVCache(), "expanded static": StaticKVCache(prompt + steps)}
    absorb = {"naive": False, "absorbed": True, "static": True, "expanded": False, "expanded static": False}
    with torch.no_grad():
        for name, cache in caches.items():  # the prompt at once
            out, _ = mla(x[:, :prompt], mask=causal_mask(prompt), cache=cache, absorb=absorb[name])
            full, _ = mla(x[:, :prompt], mask=causal_mask(prompt))
            _close(out, full, rtol)
        for t in range(prompt, prompt + steps):  # then one token a step
            full, full_w = mla(x[:, : t + 1], mask=causal_mask(t + 1), need_weights=True)  # (B, t+1, E)
            for name, cache in caches.items():
                out, w = mla(x[:, t : t + 1], cache=cache, absorb=absorb[name], need_weights=True)  # (B, 1, E)
                assert len(cache) == t + 1
                _close(out[:, 0], full[:, -1], rtol)
                _close(w[:, :, 0], full_w[:, :, -1], rtol)
    assert full[:, -1].abs().max() > 0.05
    expanded = caches["expanded"]
    assert isinstance(expanded, KVCache) and expanded.k is not None and expanded.v is not None
    assert expanded.k.shape == (B, H, prompt + steps, DN + DR) and expanded.v.shape == (B, H, prompt + steps, DV)
    assert expanded.nbytes == B * (prompt + steps) * H * (DN + DR + DV) * torch.empty((), dtype=dtype).element_size()


def test_absorbed_path_builds_no_per_head_keys_or_values():
    mla = MultiHeadLatentAttention(E, 8, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16).eval()
    calls = []
    mla.kv_b_proj.register_forward_hook(lambda *args: calls.append(1))
    S = 128
    per_head_keys = 1 * 8 * (S + 1) * 16 * 4  # bytes of (B, H, S + 1, Dn) float32
    largest = {}
    for absorb in (False, True):
        cache = LatentKVCache(max_len=S + 1)
        with torch.no_grad():
            mla(_x(1, S, E), cache=cache)  # prefill (naive: one call)
        calls.clear()
        x = _x(1, 1, E, seed=4)
        largest[absorb] = tracked_memory(lambda x=x, c=cache, a=absorb: mla(x, cache=c, absorb=a))["largest_bytes"]
        assert len(calls) == (0 if absorb else 1)
    assert largest[False] >= per_head_keys  # the naive step expands the whole cache ...
    assert largest[True] < per_head_keys / 8  # ... the absorbed one never holds anything that large


def test_cache_stores_only_latent_and_rope_key():
    mla = _mla()
    B, T = 3, 5
    for dtype, itemsize in ((torch.float32, 4), (torch.float64, 8)):
        cache = LatentKVCache()
        with torch.no_grad():
            mla.to(dtype)(_x(B, T, E, dtype=dtype), mask=causal_mask(T), cache=cache)
            mla(_x(B, 1, E, seed=5, dtype=dtype), cache=cache)
        assert len(cache) == T + 1
        assert cache.nbytes == B * (T + 1) * (DC + DR) * itemsize
        assert cache.c_kv is not None and cache.k_rope is not None
        assert cache.c_kv.shape == (B, T + 1, DC) and cache.k_rope.shape == (B, T + 1, DR)
    plain = KVCache()  # the same layer, keys and values cached after the up-projection: H (Dn + Dr + Dv) a token
    k, v = mla.expand(cache.c_kv)
    plain.append(torch.cat([k, cache.k_rope[:, None].expand(B, H, T + 1, DR)], -1), v)
    assert plain.nbytes / cache.nbytes == H * (DN + DR + DV) / (DC + DR)


def test_static_cache_preallocates_and_truncates():
    cache = LatentKVCache(max_len=6)
    c, r = _x(2, 4, DC), _x(2, 4, DR, seed=2)
    cache.append(c, r)
    assert cache.allocated_bytes == 2 * 6 * (DC + DR) * 4 and cache.nbytes == 2 * 4 * (DC + DR) * 4
    cache.truncate(2)
    c_all, r_all = cache.append(c[:, :1], r[:, :1])
    torch.testing.assert_close(c_all, torch.cat([c[:, :2], c[:, :1]], 1))
    torch.testing.assert_close(r_all, torch.cat([r[:, :2], r[:, :1]], 1))
    with pytest.raises(ValueError, match="the cache is full: max_len=6, it holds 3 tokens and 4 more"):
        cache.append(c, r)


def test_cache_errors():
    cache = LatentKVCache()
    cache.append(_x(2, 3, DC), _x(2, 3, DR))
    with pytest.raises(ValueError, match=r"do not fit the cache's \(B, S, Dc \+ Dr\) = \(2, 3, 24 \+ 8\)"):
        cache.append(_x(2, 1, DC + 1), _x(2, 1, DR))
    with pytest.raises(ValueError, match=r"matching \(B, T\), got \(2, 2, 24\) and \(2, 1, 8\)"):
        cache.append(_x(2, 2, DC), _x(2, 1, DR))
    with pytest.raises(TypeError, match="c_kv must be a torch.Tensor"):
        cache.append([1.0], _x(2, 1, DR))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a LatentKVCache \(the latents\) or a KVCache .* got list"):
        _mla()(_x(1, 1, E), cache=[])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="absorb=True reads latents, but cache is a KVCache"):
        _mla()(_x(1, 1, E), cache=KVCache(), absorb=True)


# ----------------------------------------------------------------------------- why RoPE is decoupled


def test_folding_through_a_rotated_key_is_wrong_except_at_position_zero():
    mla = _mla(24, torch.float64)
    T = 12
    r = absorb_through_rotated_key(mla, _x(2, T, E, seed=6, dtype=torch.float64))
    err = r.score_error_by_key_position  # (T,)
    assert err[0] < 1e-12  # the key at position 0 is not rotated: folding W_UK is exact there
    assert err[1:].min() > 0.05 * r.score_scale  # every later key: wrong by a sizeable part of the scores
    assert r.per_distance_error < 1e-12  # one matrix R_(s-t) W_UK per distance would be right
    assert r.matrix_change_by_distance[0] == 0 and r.matrix_change_by_distance[1:].min() > 0.1
    assert r.output_error_by_position[0] < 1e-12  # query 0 sees only key 0
    assert r.output_error_by_position[1:].min() > 1e-3 and r.output_error > 0.05
    assert r.decoupled_error < 1e-12  # the real layer absorbs exactly


def test_rotated_key_argument_errors():
    with pytest.raises(ValueError, match="T >= 2"):
        absorb_through_rotated_key(_mla(), _x(1, 1, E))
    odd = MultiHeadLatentAttention(E, H, kv_lora_rank=DC, qk_nope_head_dim=15, qk_rope_head_dim=DR, v_head_dim=DV)
    with pytest.raises(ValueError, match="qk_nope_head_dim.*must be even; got 15"):
        absorb_through_rotated_key(odd, _x(1, 4, E))
    with pytest.raises(TypeError, match="mla must be a MultiHeadLatentAttention"):
        absorb_through_rotated_key(torch.nn.Linear(2, 2), _x(1, 4, E))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- accounting


def test_deepseek_v3_cache_accounting_by_hand():
    elements = mla_cache_elements_per_token(DEEPSEEK_V3_MLA)
    assert elements == {
        "mla": 512 + 64,  # 576
        "mha": 128 * 128 * 2,  # 32768: 128 heads x (128 key + 128 value)
        "mha_expanded": 128 * (128 + 64) + 128 * 128,  # 40960
        "gqa": 8 * 128 * 2,  # 2048
        "mqa": 128 * 2,  # 256
    }
    per_layer = mla_cache_bytes_per_token(DEEPSEEK_V3_MLA)
    assert per_layer["mla"] == 1152 and per_layer["mha"] == 65536
    model = mla_cache_bytes_per_token(DEEPSEEK_V3_MLA, torch.bfloat16, all_layers=True)
    assert model["mla"] == 576 * 2 * 61 == 70272
    assert model["mha"] == kv_cache_bytes_per_token(61, 128, 128, torch.bfloat16) == 3997696
    assert model["gqa"] == kv_cache_bytes_per_token(61, 8, 128, torch.bfloat16)
    assert mla_cache_bytes_per_token(DEEPSEEK_V3_MLA, torch.float32)["mla"] == 2304
    assert mla_cache_elements_per_token(DEEPSEEK_V3_MLA, gqa_groups=4)["gqa"] == 1024


def test_accounting_matches_a_layers_cache():
    config = dict(num_attention_heads=H, kv_lora_rank=DC, qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV,
                  num_hidden_layers=1)
    cache = LatentKVCache()
    with torch.no_grad():
        _mla()(_x(1, 1, E), cache=cache)
    assert cache.nbytes == mla_cache_bytes_per_token(config, torch.float32, gqa_groups=2)["mla"]


def test_accounting_errors():
    with pytest.raises(ValueError, match=r"config is missing \['kv_lora_rank'\]"):
        mla_cache_elements_per_token({k: v for k, v in DEEPSEEK_V3_MLA.items() if k != "kv_lora_rank"})
    with pytest.raises(TypeError, match="config must be a mapping"):
        mla_cache_elements_per_token([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"gqa_groups must be an int in \[1, 128\], got 256"):
        mla_cache_elements_per_token(DEEPSEEK_V3_MLA, gqa_groups=256)
    with pytest.raises(TypeError, match="config\\['v_head_dim'\\] must be an int"):
        mla_cache_elements_per_token({**DEEPSEEK_V3_MLA, "v_head_dim": 128.0})
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        mla_cache_bytes_per_token(DEEPSEEK_V3_MLA, "bf16")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- argument checks


def test_constructor_errors():
    with pytest.raises(ValueError, match="kv_lora_rank=80 is larger than d_model=64"):
        MultiHeadLatentAttention(64, 4, kv_lora_rank=80, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
    with pytest.raises(ValueError, match="q_lora_rank=65 is larger than d_model=64"):
        MultiHeadLatentAttention(64, 4, q_lora_rank=65, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8,
                                 v_head_dim=8)
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even .* got 7"):
        MultiHeadLatentAttention(64, 4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=7, v_head_dim=8)
    with pytest.raises(TypeError, match="kv_lora_rank must be an int, got float 8.0"):
        MultiHeadLatentAttention(64, 4, kv_lora_rank=8.0, qk_nope_head_dim=8, qk_rope_head_dim=8,  # type: ignore[arg-type]
                                 v_head_dim=8)
    with pytest.raises(TypeError, match="num_heads must be an int, got bool"):
        MultiHeadLatentAttention(64, True, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
    with pytest.raises(ValueError, match="rope_base must be a number > 1, got 1"):
        MultiHeadLatentAttention(64, 4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                                 rope_base=1)
    with pytest.raises(TypeError, match="rms_norm_eps must be a positive number, got str"):
        MultiHeadLatentAttention(64, 4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                                 rms_norm_eps="1e-6")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rope_interleave must be a bool, got int 1"):
        MultiHeadLatentAttention(64, 4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                                 rope_interleave=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="v_head_dim must be an int >= 1, got 0"):
        MultiHeadLatentAttention(64, 4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=0)


def test_forward_errors():
    mla = _mla()
    with pytest.raises(ValueError, match=r"x must be \(B, T, 64\) \(batch-first\), got \(5, 64\)"):
        mla(_x(5, E))
    with pytest.raises(ValueError, match=r"positions must be \(T,\) = \(5,\) or \(B, T\) = \(2, 5\), got shape \(4,\)"):
        mla(_x(2, 5, E), torch.arange(4))
    with pytest.raises(ValueError, match="does not broadcast to the scores' shape"):
        mla(_x(2, 5, E), mask=causal_mask(4), absorb=True)


def test_module_names_are_hugging_faces():
    names = set(_mla(24).state_dict())
    assert names == {"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
                     "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"}
    assert "q_proj.weight" in _mla(None).state_dict()


# ----------------------------------------------------------------------------- the work of a step


@pytest.mark.parametrize("S, T", [(37, 1), (1, 1), (16, 16), (9, 3)])
@pytest.mark.parametrize("form", MLA_FORMS)
def test_step_cost_counts_what_the_layer_computes(form, S, T):
    """mla_step_cost's multiply-adds = what torch's FlopCounterMode counts in the layer's own forward pass
    (matmuls, einsums, attention), less the projections every form shares (q_proj, kv_a_proj_with_mqa, o_proj)."""
    from torch.utils.flop_counter import FlopCounterMode

    mla = _mla()
    config = dict(num_attention_heads=H, kv_lora_rank=DC, qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV)
    B = 2
    x = _x(B, S, E, seed=5)
    cache: LatentKVCache | KVCache = KVCache() if form == "expanded" else LatentKVCache()
    with torch.no_grad():
        if S > T:
            mla(x[:, : S - T], mask=causal_mask(S - T), cache=cache)  # fill the cache with S - T tokens
        with FlopCounterMode(display=False) as counter:
            mla(x[:, S - T :], mask=causal_mask(T, S, offset=S - T), cache=cache, absorb=form == "absorbed")
    shared = T * E * H * (DN + DR) + T * E * (DC + DR) + T * H * DV * E  # per sequence
    counted = counter.get_total_flops() // 2 - B * shared  # flops = 2 multiply-adds
    cost = mla_step_cost(config, S, form, T=T, batch_size=B, dtype_bytes=4)
    assert cost["macs"] == counted
    held = cache.nbytes
    assert cost["cache_bytes"] == held
    weights = DC * H * (DN + DV) * 4
    built = {"naive": B * S * H * (DN + DR + DV) * 4, "expanded": B * T * H * (DN + DR + DV) * 4, "absorbed": 0}[form]
    assert cost["built_bytes"] == built
    assert cost["bytes_read"] == held + weights + (built if form == "naive" else 0)


def test_step_cost_of_deepseek_v3_decoding_and_prefill():
    S = 32768
    decode = {form: mla_step_cost(DEEPSEEK_V3_MLA, S, form) for form in MLA_FORMS}
    prefill = {form: mla_step_cost(DEEPSEEK_V3_MLA, S, form, T=S) for form in MLA_FORMS}
    # decoding: absorbed does the most arithmetic per cached token but reads the least
    assert decode["absorbed"]["bytes_read"] < decode["expanded"]["bytes_read"] < decode["naive"]["bytes_read"]
    assert decode["expanded"]["macs"] < decode["absorbed"]["macs"] < decode["naive"]["macs"]
    # by hand: 128 heads, (512 + 64 + 512) per cached token in the absorbed scores and sums
    assert decode["absorbed"]["macs"] == 128 * (128 * 512 + S * (576 + 512) + 512 * 128)
    # prefill: the expanded form does less arithmetic than the absorbed one
    assert prefill["expanded"]["macs"] < prefill["absorbed"]["macs"]
    with pytest.raises(ValueError, match=r"form must be one of \('naive', 'expanded', 'absorbed'\), got 'flash'"):
        mla_step_cost(DEEPSEEK_V3_MLA, S, "flash")
    with pytest.raises(ValueError, match="T must be"):
        mla_step_cost(DEEPSEEK_V3_MLA, 4, "naive", T=5)
    with pytest.raises(ValueError, match=r"config is missing \['v_head_dim'\]"):
        mla_step_cost({k: v for k, v in DEEPSEEK_V3_MLA.items() if k != "v_head_dim"}, 4, "naive")
