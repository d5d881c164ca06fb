"""RoPE scaling (linear position interpolation, YaRN) in attnbook.positional, and in the two layers that use
it, LLMAttention and MultiHeadLatentAttention, against transformers on the released models' rope settings.

Dimension legend: B batch, H heads, T query length, S key length, E model dim, D head dim (the rotated
features: Dr for MLA's rope part).

Why two kinds of comparison with the attention modules: transformers computes RoPE's angles in float32
(position * inv_freq, both float32), attnbook in float64. At position 100,000 a float32 angle is only good to
a few thousandths of a radian, so the outputs there differ by ~1e-3 (relative) for rounding alone. The
exact check runs both modules in float64 on the same frequencies (transformers', read from its rotary
embedding) and must agree to rounding; the frequencies themselves are compared with ROPE_INIT_FUNCTIONS
separately (to float32's precision). The end-to-end check in float32, with transformers' own rotary
embedding, is held to the bound that the float32 angle rounding sets.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnbook import apply_rotary, causal_mask
from attnbook.latent import DEEPSEEK_V3_ROPE, MultiHeadLatentAttention
from attnbook.llm_attention import LLMAttention
from attnbook.positional import ROPE_TYPES, rope_frequencies, yarn_mscale, yarn_ramp

# The released configs' rope settings (their config.json; gpt-oss's are also transformers' GptOssConfig defaults)
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
GEMMA3_GLOBAL_ROPE = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}
GEMMA3_LOCAL_ROPE = {"rope_type": "default", "rope_theta": 10_000.0}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return module.eval()


@pytest.fixture(scope="module")
def transformers():
    tf = pytest.importorskip("transformers", reason="the references are transformers' modules")
    from transformers import modeling_rope_utils

    if not hasattr(modeling_rope_utils, "ROPE_INIT_FUNCTIONS") or not hasattr(tf.PretrainedConfig,
                                                                              "standardize_rope_params"):
        pytest.skip("this transformers has no rope_parameters (standardize_rope_params)")
    return tf


def _deepseek_config(tf, rope: dict, Dr: int = 64):
    config = tf.DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=Dr, v_head_dim=12, num_hidden_layers=1, vocab_size=32,
        intermediate_size=32, moe_intermediate_size=16, n_routed_experts=4, max_position_embeddings=163840,
        rope_parameters=dict(rope))
    config._attn_implementation = "eager"
    return config


def _gpt_oss_config(tf, rope: dict | None = None):
    config = tf.GptOssConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             num_hidden_layers=2, vocab_size=32, intermediate_size=32, num_local_experts=2,
                             max_position_embeddings=131072, **({} if rope is None else {"rope_parameters": rope}))
    config._attn_implementation = "eager"
    return config


def _gemma3_config(tf):
    config = tf.Gemma3TextConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                 max_position_embeddings=131072, query_pre_attn_scalar=64,
                                 rope_scaling={"rope_type": "linear", "factor": 8.0})
    config._attn_implementation = "eager"
    return config


# ----------------------------------------------------------------------------- the frequencies


def test_released_settings_are_what_transformers_reads(transformers):
    assert _gpt_oss_config(transformers).rope_parameters == GPT_OSS_ROPE  # gpt-oss's defaults = its release
    gemma = _gemma3_config(transformers).rope_parameters
    assert gemma == {"full_attention": GEMMA3_GLOBAL_ROPE, "sliding_attention": GEMMA3_LOCAL_ROPE}
    config_json = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"}  # DeepSeek-V3's config.json
    deepseek = transformers.DeepseekV3Config(rope_scaling=config_json, rope_theta=10000.0).rope_parameters
    assert {k: v for k, v in deepseek.items() if k != "type"} == DEEPSEEK_V3_ROPE


@pytest.mark.parametrize("name, dim, rope", [
    ("deepseek-v3", 64, DEEPSEEK_V3_ROPE),
    ("gpt-oss", 64, GPT_OSS_ROPE),
    ("gemma-3 global", 128, GEMMA3_GLOBAL_ROPE),
    ("gemma-3 local", 128, GEMMA3_LOCAL_ROPE),
    ("yarn, truncated, own attention_factor", 32, {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                                   "original_max_position_embeddings": 8192, "attention_factor": 0.9}),
    ("yarn, mscale only", 16, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                               "original_max_position_embeddings": 512, "mscale": 0.707}),
])
def test_frequencies_and_attention_factor_equal_transformers(transformers, name, dim, rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _gpt_oss_config(transformers, dict(rope))
    config.head_dim = dim
    init = ROPE_INIT_FUNCTIONS.get(rope["rope_type"])
    if init is None:  # "default" has no entry: the rotary embedding's own function
        theirs = 1.0 / rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        their_factor = 1.0
    else:
        theirs, their_factor = init(config)
    ours, factor = rope_frequencies(dim, rope)
    assert ours.dtype == torch.float64 and ours.shape == (dim // 2,)
    assert float(((ours - theirs.double()).abs() / theirs.double()).max()) < 1e-6  # float32's precision
    assert math.isclose(factor, their_factor, rel_tol=1e-12)


def test_linear_interpolation_is_positions_divided_by_the_factor():
    x = torch.randn(2, 3, 7, 16, dtype=torch.float64)  # (B, H, T, D)
    positions = torch.tensor([0, 1, 7, 4096, 8191, 32768, 131071])
    inv_freq, factor = rope_frequencies(16, {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6})
    assert factor == 1.0
    scaled = apply_rotary(x, positions, inv_freq=inv_freq)
    squeezed = apply_rotary(x, positions / 8.0, base=1e6)  # Chen et al.: positions divided by the factor
    assert _rel(scaled, squeezed) < 1e-12


def test_yarn_ramp_keeps_fast_pairs_and_interpolates_slow_ones():
    dim, base, L = 64, 150000.0, 4096
    ramp = yarn_ramp(dim, base, L, beta_fast=32.0, beta_slow=1.0, truncate=False)  # (D/2,)
    inv_freq, _ = rope_frequencies(dim, {"rope_type": "default", "rope_theta": base})
    rotations = L * inv_freq / (2 * math.pi)  # (D/2,) turns of each pair over the original context
    assert torch.all(ramp[rotations > 32] == 0) and torch.all(ramp[rotations < 1] == 1)
    middle = (rotations <= 32) & (rotations >= 1)
    assert middle.any() and torch.all(ramp[middle] > 0) and torch.all(ramp[middle] < 1)  # untruncated: blended
    assert torch.all(ramp[1:] >= ramp[:-1])  # rises with the pair index (slower pairs)
    scaled, _ = rope_frequencies(dim, GPT_OSS_ROPE)
    assert torch.equal(scaled[ramp == 0], inv_freq[ramp == 0])  # kept as trained
    assert torch.allclose(scaled[ramp == 1], inv_freq[ramp == 1] / 32.0, rtol=1e-14, atol=0)  # interpolated
    truncated = yarn_ramp(dim, base, L, truncate=True)
    assert int((truncated > 0).sum()) >= int((ramp > 0).sum())  # the bounds are rounded outwards


def test_yarn_temperature():
    assert yarn_mscale(1.0) == 1.0 and yarn_mscale(0.5) == 1.0
    assert math.isclose(yarn_mscale(32.0), 0.1 * math.log(32.0) + 1)
    assert round(yarn_mscale(40.0, 1.0) ** 2, 3) == 1.874  # DeepSeek-V3's softmax scale multiplier
    _, factor = rope_frequencies(64, GPT_OSS_ROPE)
    assert math.isclose(factor, yarn_mscale(32.0))
    _, factor = rope_frequencies(64, DEEPSEEK_V3_ROPE)  # mscale / mscale_all_dim = 1: not on cos and sin
    assert factor == 1.0


def test_bad_rope_parameters_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"rope_type'\] = 'ntk' is not supported; attnbook knows default, linear"):
        rope_frequencies(8, {"rope_type": "ntk", "factor": 2.0})
    with pytest.raises(ValueError, match=r"rope_parameters\['factor'\] must be >= 1.0, got 0.5"):
        rope_frequencies(8, {"rope_type": "linear", "factor": 0.5})
    with pytest.raises(ValueError, match=r"'yarn' is missing \['original_max_position_embeddings'\]"):
        rope_frequencies(8, {"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match=r"'linear' is missing \['factor'\]"):
        rope_frequencies(8, {"rope_type": "linear"})
    with pytest.raises(ValueError, match=r"keys \['beta_fast'\] that rope_type 'linear' does not use"):
        rope_frequencies(8, {"rope_type": "linear", "factor": 2.0, "beta_fast": 32})
    with pytest.raises(ValueError, match=r"rope_theta'\] must be a number > 1, got 1"):
        rope_frequencies(8, {"rope_theta": 1})
    with pytest.raises(ValueError, match="beta_fast=1.0 must be >= beta_slow=2.0"):
        yarn_ramp(8, 1e4, 64, beta_fast=1.0, beta_slow=2.0)
    with pytest.raises(ValueError, match="dim must be even; got dim=7"):
        rope_frequencies(7)
    with pytest.raises(TypeError, match="rope_parameters must be a mapping"):
        rope_frequencies(8, [("rope_type", "linear")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"inv_freq must be \(D/2,\) = \(4,\)"):
        apply_rotary(torch.randn(3, 8), inv_freq=torch.ones(3))
    with pytest.raises(ValueError, match="rope_scaling must not hold rope_theta"):
        LLMAttention(16, 2, rope_scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(ValueError, match=r"factor'\] must be >= 1.0"):
        MultiHeadLatentAttention(32, 2, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                                 rope_scaling={"rope_type": "linear", "factor": 0.25})
    assert ROPE_TYPES == ("default", "linear", "yarn")


# ----------------------------------------------------------------------------- the attention modules


def _hf_pair(transformers, kind: str, dtype: torch.dtype):
    """(transformers' attention module, its rotary embedding, our copy, the layer_type argument or None, E)."""
    if kind == "deepseek-v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

        config = _deepseek_config(transformers, DEEPSEEK_V3_ROPE)
        hf = _randomize(DeepseekV3Attention(config, 0), 1).to(dtype)
        return hf, DeepseekV3RotaryEmbedding(config), MultiHeadLatentAttention.from_hf(hf), None, 64
    if kind == "gpt-oss":
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

        config = _gpt_oss_config(transformers)
        hf = _randomize(GptOssAttention(config, 1), 2).to(dtype)  # layer 1: a global layer
        return hf, GptOssRotaryEmbedding(config), LLMAttention.from_hf(hf), None, 32
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention, Gemma3RotaryEmbedding

    config = _gemma3_config(transformers)
    layer = 5 if kind == "gemma-3 global" else 0
    hf = _randomize(Gemma3Attention(config, layer), 3).to(dtype)
    return hf, Gemma3RotaryEmbedding(config), LLMAttention.from_hf(hf), config.layer_types[layer], 32


def _run_ours(ours, x: torch.Tensor, positions: torch.Tensor, absorb: bool = False) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(ours, MultiHeadLatentAttention):
            return ours(x, positions, mask=causal_mask(x.shape[1]), absorb=absorb)[0]
        return ours(x, positions=positions)[0]


KINDS = ["deepseek-v3", "gpt-oss", "gemma-3 global", "gemma-3 local"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("start", [5000, 100_000])
def test_scaled_rope_layers_equal_transformers_in_float64(transformers, kind, start):
    """Far past the original context, with transformers' frequencies on both sides, float64: rounding only."""
    hf, rotary, ours, layer_type, E = _hf_pair(transformers, kind, torch.float64)
    B, T = 2, 7
    positions = torch.arange(start, start + T)  # (T,)
    x = torch.randn(B, T, E, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    their_inv_freq = getattr(rotary, "inv_freq" if layer_type is None else f"{layer_type}_inv_freq").double()
    their_factor = getattr(rotary, "attention_scaling" if layer_type is None else f"{layer_type}_attention_scaling")
    assert ours.rope_inv_freq is not None
    assert float(((ours.rope_inv_freq - their_inv_freq).abs() / their_inv_freq).max()) < 1e-6
    assert math.isclose(ours.rope_attention_factor, their_factor, rel_tol=1e-12)
    # transformers' rotary embedding, in float64: its cos and sin (half-split layout, attention factor included)
    angles = positions.double()[None, :, None] * their_inv_freq  # (1, T, D/2)
    emb = angles if kind == "gpt-oss" else torch.cat([angles, angles], dim=-1)  # gpt-oss: (1, T, D/2); else (1, T, D)
    cos, sin = emb.cos() * their_factor, emb.sin() * their_factor
    additive = torch.zeros(T, T, dtype=torch.float64).masked_fill(~causal_mask(T), torch.finfo(torch.float64).min)
    with torch.no_grad():
        ref, _ = hf(x, (cos.expand(B, T, -1), sin.expand(B, T, -1)), additive[None, None].expand(B, 1, T, T))
    ours.rope_inv_freq = their_inv_freq  # the one thing set by hand: the same float32-rounded frequencies
    assert ref.abs().max() > 0.1
    # 1e-6, not 1e-12: transformers' RMSNorms (DeepSeek's latent norms, Gemma's QK-norm) compute in float32 even
    # for float64 inputs. Still a sharp check: float32 angles alone would be off by ~1e-3 at 100,000.
    tolerance = 1e-12 if kind == "gpt-oss" else 1e-6
    assert _rel(_run_ours(ours, x, positions), ref) < tolerance
    if isinstance(ours, MultiHeadLatentAttention):
        assert _rel(_run_ours(ours, x, positions, absorb=True), ref) < tolerance


@pytest.mark.parametrize("kind", KINDS)
def test_scaled_rope_layers_equal_transformers_end_to_end_in_float32(transformers, kind):
    """transformers' own rotary embedding (float32 angles) against ours (float64 angles): equal near position 0,
    and far out within the bound that float32 angles set (a relative 2^-23 of the largest angle, times a few)."""
    hf, rotary, ours, layer_type, E = _hf_pair(transformers, kind, torch.float32)
    B, T = 2, 7
    x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(5))
    additive = torch.zeros(T, T).masked_fill(~causal_mask(T), torch.finfo(torch.float32).min)[None, None]
    args = () if layer_type is None else (layer_type,)
    errors = {}
    for start in (0, 5000, 100_000):
        positions = torch.arange(start, start + T)
        with torch.no_grad():
            ref, _ = hf(x, rotary(x, positions[None].expand(B, T), *args), additive.expand(B, 1, T, T))
        errors[start] = _rel(_run_ours(ours, x, positions), ref)
        angle_error = (start + T) * float(ours.rope_inv_freq.max()) * 2.0**-23  # float32 rounding of the angles
        assert errors[start] < 1e-5 + 10 * angle_error, (start, errors[start], angle_error)
    assert errors[0] < 1e-5


def test_deepseek_softmax_scale_carries_mscale_squared(transformers):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    config = _deepseek_config(transformers, DEEPSEEK_V3_ROPE)
    hf = DeepseekV3Attention(config, 0)
    ours = MultiHeadLatentAttention.from_hf(hf)
    assert math.isclose(ours.scaling, hf.scaling, rel_tol=1e-12)
    assert math.isclose(ours.scaling, (16 + 64) ** -0.5 * yarn_mscale(40.0, 1.0) ** 2, rel_tol=1e-12)
    assert ours.rope_scaling is not None and ours.rope_scaling["factor"] == 40.0
    plain = MultiHeadLatentAttention(64, 4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=12)
    assert math.isclose(plain.scaling, (16 + 64) ** -0.5)


def test_scaled_rope_decoding_from_each_cache_equals_full_recomputation():
    """YaRN x40 positions past the original context, through the latent cache (naive and absorbed) and the
    expanded one: every step equals the last row of a full causal pass."""
    from attnbook import KVCache
    from attnbook.latent import LatentKVCache

    torch.manual_seed(0)
    yarn = {k: v for k, v in DEEPSEEK_V3_ROPE.items() if k != "rope_theta"}
    mla = MultiHeadLatentAttention(32, 4, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=16,
                                   v_head_dim=8, rope_scaling=yarn).double().eval()
    start, prompt, steps = 6000, 3, 5
    x = torch.randn(2, prompt + steps, 32, dtype=torch.float64)
    positions = torch.arange(start, start + prompt + steps)
    forms = {"naive": (LatentKVCache(), False), "absorbed": (LatentKVCache(), True), "expanded": (KVCache(), False)}
    with torch.no_grad():
        for cache, absorb in forms.values():
            mla(x[:, :prompt], positions[:prompt], mask=causal_mask(prompt), cache=cache, absorb=absorb)
        for t in range(prompt, prompt + steps):
            full, _ = mla(x[:, : t + 1], positions[: t + 1], mask=causal_mask(t + 1))
            for cache, absorb in forms.values():
                step, _ = mla(x[:, t : t + 1], positions[t : t + 1], cache=cache, absorb=absorb)
                assert _rel(step[:, 0], full[:, -1]) < 1e-12
    plain = MultiHeadLatentAttention(32, 4, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=16,
                                     v_head_dim=8).double().eval()
    plain.load_state_dict(mla.state_dict())
    with torch.no_grad():  # the scaling is not a no-op: plain RoPE gives another output at these positions
        assert _rel(plain(x, positions, mask=causal_mask(prompt + steps))[0], full) > 1e-3
