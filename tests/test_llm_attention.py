"""attnbook.llm_attention: the sink softmaxes against their formulas, LLMAttention's switches against explicit
references and properties, equality with Hugging Face's Qwen3, gpt-oss, Qwen3-Next, Gemma 3 and Gemma 2
attention modules (weights copied by from_hf), and layer_masks / layer_rope_bases against what transformers
builds for Gemma 3."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import causal_mask, sliding_window_mask
from attnbook.llm_attention import (
    LAYER_TYPES,
    LLMAttention,
    layer_masks,
    layer_rope_bases,
    layer_rope_parameters,
    softmax_plus_one,
    softmax_with_sink,
)
from attnbook.masks import from_additive
from tests.helpers import max_rel_diff


def _x(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _randomize(module, seed=0, scale=0.3):
    """Random weights everywhere (projections, norms, sinks, biases), so every parameter is checked."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module.eval()


# --------------------------------------------------------------------------- softmax with a sink


def test_softmax_with_sink_is_the_formula():
    scores = _x(2, 3, 5, 7, dtype=torch.float64)  # (B, H, T, S)
    sink = _x(3, seed=1, dtype=torch.float64)  # (H,)
    w = softmax_with_sink(scores, sink)
    e = scores.exp()
    expected = e / (sink.exp()[:, None, None] + e.sum(-1, keepdim=True))
    torch.testing.assert_close(w, expected, rtol=1e-12, atol=1e-12)
    assert bool((w.sum(-1) < 1).all())  # what is missing went to the sink


def test_softmax_plus_one_is_the_formula_and_a_sink_at_zero():
    scores = _x(4, 6, dtype=torch.float64) * 3
    w = softmax_plus_one(scores)
    e = scores.exp()
    torch.testing.assert_close(w, e / (1 + e.sum(-1, keepdim=True)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w, softmax_with_sink(scores, torch.zeros((), dtype=torch.float64)))
    # chapter 9's idle query (every score -8): almost nothing reaches the real tokens
    assert softmax_plus_one(torch.full((6,), -8.0)).sum() < 0.01


def test_a_very_low_sink_is_plain_softmax():
    scores = _x(2, 3, 5, 5)
    torch.testing.assert_close(softmax_with_sink(scores, torch.full((3,), -200.0)), scores.softmax(-1))


def test_sink_softmax_is_stable_for_huge_scores():
    scores = torch.tensor([[1000.0, 999.0, -1000.0]])
    w = softmax_plus_one(scores)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w, torch.softmax(scores, -1), rtol=0, atol=1e-6)  # the 0 logit is negligible


@pytest.mark.parametrize("fn", ["sink", "plus_one"])
def test_sink_softmaxes_follow_the_mask_convention(fn):
    scores = _x(2, 3, 4, 5).requires_grad_()
    mask = causal_mask(4, 5, offset=1)  # (T, S)
    mask = mask.clone()
    mask[2] = False  # query 2 may attend no key
    sink = torch.zeros(3)
    w = softmax_with_sink(scores, sink, mask) if fn == "sink" else softmax_plus_one(scores, mask)
    assert bool((w[..., ~mask] == 0).all())  # blocked keys get nothing
    assert bool((w[:, :, 2] == 0).all())  # a fully blocked row is all zeros, not NaN
    w.sum().backward()
    assert torch.isfinite(scores.grad).all()
    # the allowed keys get what the formula gives over the allowed keys only
    e = scores.detach().exp() * mask
    torch.testing.assert_close(w.detach(), e / (1 + e.sum(-1, keepdim=True)))


def test_sink_softmax_keeps_the_dtype_and_computes_in_float32():
    scores = _x(2, 5, 6).half()
    w = softmax_plus_one(scores)
    assert w.dtype == torch.float16
    torch.testing.assert_close(w.float(), softmax_plus_one(scores.float()), rtol=0, atol=1e-3)


def test_sink_softmax_bad_input():
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        softmax_plus_one([[1.0, 2.0]])
    with pytest.raises(TypeError, match="floating-point"):
        softmax_plus_one(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"one logit per head.*\(2, 3, 4, 5\)"):
        softmax_with_sink(_x(2, 3, 4, 5), torch.zeros(4))
    with pytest.raises(TypeError, match="sink_logits must be a torch.Tensor"):
        softmax_with_sink(_x(2, 3, 4, 5), 0.0)
    with pytest.raises(TypeError, match="mask must be bool"):
        softmax_plus_one(_x(3, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="does not broadcast"):
        softmax_plus_one(_x(3, 4), torch.ones(2, 4, dtype=torch.bool))


# --------------------------------------------------------------------------- LLMAttention


def _reference(m: LLMAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Plain softmax attention written out with F.scaled_dot_product_attention, no RoPE (rope_base=None)."""
    B, T, _ = x.shape
    H, Hkv, D = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q_proj(x).view(B, T, H, D).transpose(1, 2)
    k = m.k_proj(x).view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, 1)
    v = m.v_proj(x).view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=m.scaling)
    return m.o_proj(out.transpose(1, 2).reshape(B, T, H * D))


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("head_dim", [None, 12])
def test_plain_layer_is_causal_grouped_query_attention(num_kv_heads, head_dim):
    torch.manual_seed(0)
    m = LLMAttention(16, 4, num_kv_heads, head_dim, rope_base=None, bias=True).eval()
    x = _x(2, 9, 16)
    out, w = m(x, need_weights=True)
    torch.testing.assert_close(out, _reference(m, x, causal_mask(9)))
    fast, none = m(x)  # the fused kernel when no weights are asked for
    assert none is None
    torch.testing.assert_close(fast, out)
    assert w.shape == (2, 4, 9, 9) and bool((w.triu(1) == 0).all())
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 9))


def test_sliding_window_means_what_hugging_face_means():
    torch.manual_seed(0)
    m = LLMAttention(16, 2, sliding_window=3, rope_base=None).eval()
    _, w = m(_x(1, 10, 16), need_weights=True)
    i, j = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    seen = (i - 3 < j) & (j <= i)  # three keys: the query itself and the two before it
    assert bool((w[0] > 0).eq(seen).all())
    torch.testing.assert_close(m.layer_mask(10), sliding_window_mask(10, 2, causal=True))


@pytest.mark.parametrize("switch", [{}, {"sinks": True}, {"softmax_plus_one": True}, {"output_gate": True},
                                    {"qk_norm": True}, {"attn_logit_softcapping": 2.0}, {"sliding_window": 4}])
def test_every_variant_is_causal_and_a_blocked_row_is_zero(switch):
    torch.manual_seed(0)
    m = _randomize(LLMAttention(16, 4, 2, **switch))
    x = _x(2, 8, 16)
    out, _ = m(x)
    x2 = x.clone()
    x2[:, 5:] = _x(2, 3, 16, seed=9)  # change the future
    out2, _ = m(x2)
    torch.testing.assert_close(out2[:, :5], out[:, :5])
    assert not torch.allclose(out2[:, 5:], out[:, 5:])
    pad = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    pad[1, :, 3] = False  # sequence 1, query 3: nothing to attend
    out3, w3 = m(x, pad, need_weights=True)
    assert torch.isfinite(out3).all() and bool((w3[1, :, 3] == 0).all())
    torch.testing.assert_close(out3[1, 3], m.o_proj.bias if m.o_proj.bias is not None else torch.zeros(16))


def test_sinks_at_zero_are_softmax_plus_one_and_very_low_sinks_are_softmax():
    torch.manual_seed(0)
    plain = _randomize(LLMAttention(16, 4, 2))
    sink = LLMAttention(16, 4, 2, sinks=True)
    plus_one = LLMAttention(16, 4, 2, softmax_plus_one=True)
    for m in (sink, plus_one):
        m.load_state_dict(plain.state_dict(), strict=False)
    x = _x(2, 7, 16)
    torch.testing.assert_close(sink(x)[0], plus_one(x)[0])
    with torch.no_grad():
        sink.sinks.fill_(-1e4)
    torch.testing.assert_close(sink(x)[0], plain(x)[0])


def test_output_gate_multiplies_each_feature_before_o_proj():
    torch.manual_seed(0)
    plain = _randomize(LLMAttention(16, 4))
    gated = LLMAttention(16, 4, output_gate=True)
    gated.load_state_dict(plain.state_dict(), strict=False)
    x = _x(2, 6, 16)
    with torch.no_grad():
        gated.gate_proj.weight.zero_()  # sigmoid(0) = 1/2 everywhere
    torch.testing.assert_close(gated(x)[0], 0.5 * plain(x)[0])
    with torch.no_grad():
        gated.gate_proj.weight.copy_(_x(16, 16, seed=3))
    q, k, v = plain.project(x)
    heads, _ = plain.attend(q, k, v, causal_mask(6))  # (B, H, T, D)
    gate = torch.sigmoid(gated.gate_proj(x)).view(2, 6, 4, 4).transpose(1, 2)  # (B, H, T, D)
    expected = plain.o_proj((heads * gate).transpose(1, 2).reshape(2, 6, 16))
    torch.testing.assert_close(gated(x)[0], expected)


def test_qk_norm_gives_each_head_rms_one_before_rope():
    torch.manual_seed(0)
    m = LLMAttention(16, 4, qk_norm=True, rope_base=None)
    q, k, _ = m.project(_x(2, 5, 16) * 100)
    torch.testing.assert_close(q.pow(2).mean(-1), torch.ones(2, 4, 5), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k.pow(2).mean(-1), torch.ones(2, 4, 5), rtol=1e-4, atol=1e-4)
    # so |logit| <= scaling * |q| * |k| = sqrt(D), however large the input
    logits = m.attention_logits(_x(2, 5, 16) * 1e4)
    assert logits.abs().max() <= math.sqrt(4) + 1e-4


def test_partial_rotary_leaves_the_last_features_and_depends_on_distance_only():
    torch.manual_seed(0)
    m = LLMAttention(16, 2, head_dim=8, partial_rotary_factor=0.5, rope_base=100.0)
    assert m.rotary_dim == 4
    x = _x(1, 2, 6, 8)  # (B, H, T, D)
    r = m.rotate(x)
    torch.testing.assert_close(r[..., 4:], x[..., 4:])
    assert not torch.allclose(r[..., 1:, :4], x[..., 1:, :4])
    h = _x(2, 6, 16)
    torch.testing.assert_close(m.attention_logits(h, torch.arange(6) + 11), m.attention_logits(h), atol=1e-5, rtol=1e-5)


def test_softcapping_bounds_the_scores():
    torch.manual_seed(0)
    capped = _randomize(LLMAttention(16, 2, attn_logit_softcapping=1.0, rope_base=None), scale=3.0)
    _, w = capped(_x(1, 6, 16), need_weights=True)
    # scores in (-1, 1): no weight in a row of t keys can exceed e^2 times another's
    row = w[0, :, 5]
    assert bool((row.max(-1).values / row.min(-1).values <= math.exp(2) + 1e-4).all())


def test_llm_attention_bad_input():
    with pytest.raises(ValueError, match="sliding_window must be an int >= 1, got 0"):
        LLMAttention(16, 4, sliding_window=0)
    with pytest.raises(TypeError, match="sliding_window must be an int"):
        LLMAttention(16, 4, sliding_window=True)
    with pytest.raises(ValueError, match="exclude each other"):
        LLMAttention(16, 4, sinks=True, softmax_plus_one=True)
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        LLMAttention(16, 4, 3)
    with pytest.raises(ValueError, match="pass head_dim"):
        LLMAttention(18, 4)
    with pytest.raises(ValueError, match=r"int\(8 \* 0\.4\) = 3 must be even"):
        LLMAttention(16, 2, head_dim=8, partial_rotary_factor=0.4)
    with pytest.raises(TypeError, match="qk_norm must be a bool"):
        LLMAttention(16, 4, qk_norm=1)
    m = LLMAttention(16, 4)
    with pytest.raises(ValueError, match=r"x must be \(B, T, 16\).*\(2, 5, 8\)"):
        m(torch.zeros(2, 5, 8))
    with pytest.raises(TypeError, match="mask must be bool"):
        m(torch.zeros(2, 5, 16), torch.zeros(5, 5))
    with pytest.raises(TypeError, match="from_hf takes one of"):
        LLMAttention.from_hf(torch.nn.Linear(2, 2))


# --------------------------------------------------------------------------- equal to Hugging Face

B, T = 2, 24


def _hf_case(kind: str, layer: int, rope_parameters: dict | None = None, **config_kw):
    """(module, config, position embeddings (cos, sin) for T positions, layer type): a tiny random
    attention module of each kind, in float32, eager (``rope_parameters`` and ``config_kw`` replace the
    config's defaults)."""
    transformers = pytest.importorskip("transformers", reason="the Hugging Face comparison needs transformers")
    common = dict(vocab_size=32, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  **config_kw)
    plain = {"rope_type": "default", "rope_theta": 1000.0}
    x = torch.zeros(B, T, 32)
    positions = torch.arange(T)[None]
    if kind == "qwen3":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

        config = transformers.Qwen3Config(**common, head_dim=12, rope_parameters=rope_parameters or plain)
        config._attn_implementation = "eager"
        module, rope = Qwen3Attention(config, layer), Qwen3RotaryEmbedding(config)
        cos_sin = rope(x, positions)
    elif kind == "gpt_oss":
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

        config = transformers.GptOssConfig(**common, head_dim=12, sliding_window=5,
                                           rope_parameters=rope_parameters or plain)
        config._attn_implementation = "eager"
        module, rope = GptOssAttention(config, layer), GptOssRotaryEmbedding(config)
        cos_sin = rope(x, positions)
    elif kind == "qwen3_next":
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

        config = transformers.Qwen3NextConfig(**common, head_dim=16, rope_parameters=rope_parameters or {
            "rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25})
        config._attn_implementation = "eager"
        module, rope = Qwen3NextAttention(config, layer), Qwen3NextRotaryEmbedding(config)
        cos_sin = rope(x, positions)
    elif kind in ("gemma3", "gemma2"):
        if kind == "gemma3":
            from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention as Attention
            from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding as Rope

            config_class = transformers.Gemma3TextConfig
        else:
            from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention as Attention
            from transformers.models.gemma2.modeling_gemma2 import Gemma2RotaryEmbedding as Rope

            config_class = transformers.Gemma2Config
        rope_kw = {} if rope_parameters is None else {"rope_parameters": rope_parameters}
        config = config_class(**common, intermediate_size=64, head_dim=12, sliding_window=6,
                              query_pre_attn_scalar=20, attn_logit_softcapping=3.0,
                              layer_types=["sliding_attention", "full_attention"], **rope_kw)
        config._attn_implementation = "eager"
        module, rope = Attention(config, layer), Rope(config)
        cos_sin = rope(x, positions, config.layer_types[layer]) if kind == "gemma3" else rope(x, positions)
    else:
        raise AssertionError(kind)
    layer_type = getattr(config, "layer_types", ["full_attention"] * 2)[layer]
    return _randomize(module, seed=layer + 1), config, cos_sin, layer_type


def _hf_mask(config, layer_type: str, x: torch.Tensor) -> torch.Tensor:
    """The additive (B, 1, T, T) mask the model builds for a layer of that type."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    make = create_sliding_window_causal_mask if layer_type == "sliding_attention" else create_causal_mask
    return make(config=config, inputs_embeds=x, attention_mask=None, cache=None,
                position_ids=torch.arange(x.shape[1])[None])


@pytest.mark.parametrize("kind, layer, scale", [("qwen3", 0, 1.0), ("gpt_oss", 0, 1.0), ("gpt_oss", 1, 1.0),
                                                ("qwen3_next", 1, 1.0), ("gemma3", 0, 1.0), ("gemma3", 1, 1.0),
                                                ("gemma2", 0, 1.0), ("gemma2", 1, 1.0), ("qwen3", 0, 30.0)])
def test_from_hf_equals_the_hugging_face_module(kind, layer, scale):
    module, config, cos_sin, layer_type = _hf_case(kind, layer)
    with torch.no_grad():  # scale > 1: v_proj and o_proj scaled up, so the outputs are large
        module.v_proj.weight.mul_(scale)
        module.o_proj.weight.mul_(scale)
    x = _x(B, T, 32, seed=5)
    hf_mask = _hf_mask(config, layer_type, x)
    with torch.no_grad():
        expected, expected_w = module(x, cos_sin, hf_mask)
    if scale > 1:  # one float32 step of the largest output exceeds 1e-5: an absolute 1e-5 would fail this
        assert float(expected.abs().max()) * torch.finfo(torch.float32).eps > 1e-5
    ours = LLMAttention.from_hf(module).eval()
    out, w = ours(x, need_weights=True)  # its own causal / sliding mask
    assert max_rel_diff(out, expected) < 1e-5
    assert max_rel_diff(w, expected_w) < 1e-5
    out2, _ = ours(x, from_additive(hf_mask))  # Hugging Face's mask, converted: the same
    assert max_rel_diff(out2, expected) < 1e-5
    # what from_hf read
    assert (ours.sliding_window is not None) == (layer_type == "sliding_attention")
    assert (ours.sinks is not None) == (kind == "gpt_oss")
    assert (ours.gate_proj is not None) == (kind == "qwen3_next")
    assert (ours.q_norm is not None) == (kind in ("qwen3", "qwen3_next", "gemma3"))
    assert ours.attn_logit_softcapping == (3.0 if kind == "gemma2" else None)
    if kind.startswith("gemma"):
        assert ours.scaling == 20**-0.5 != ours.head_dim**-0.5
    if kind == "qwen3_next":
        assert ours.rotary_dim == 4


def test_from_hf_refuses_what_it_cannot_copy():
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    config = transformers.GptOssConfig(vocab_size=32, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=8, num_hidden_layers=2,
                                       rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(ValueError, match=r"rope_type'\] = 'dynamic' is not supported"):
        LLMAttention.from_hf(GptOssAttention(config, 0))


# --------------------------------------------------------------------------- transformers 4.x configs

# transformers 4.57 (Colab's) keeps RoPE on the config as separate attributes: rope_theta, rope_scaling (None or
# a dict with rope_type, or the older type, factor, ...), partial_rotary_factor (Qwen3-Next) and
# rope_local_base_freq (Gemma 3's sliding layers, which rotate with plain RoPE of that base: its model's
# rotary_emb_local). Its defaults, from 4.57's config classes: GptOssConfig rope_theta=150000 with the YaRN
# below (max_position_embeddings=131072); Gemma3TextConfig rope_theta=1e6, rope_local_base_freq=1e4,
# rope_scaling=None (the released models: linear x8); Qwen3NextConfig partial_rotary_factor=0.25 with
# "linear_attention" layers; Qwen3Config and Gemma2Config plain RoPE.
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
GEMMA3_LINEAR = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                 "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}
V4_CASES = {  # name: (kind, layer, the 5.x rope_parameters, the 4.x attributes that say the same, config kwargs)
    "qwen3 default": ("qwen3", 0, {"rope_type": "default", "rope_theta": 1000.0},
                      {"rope_theta": 1000.0, "rope_scaling": None}, {}),
    "qwen3 yarn": ("qwen3", 0, {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                "original_max_position_embeddings": 32768},
                   {"rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 32768}},
                   {"max_position_embeddings": 131072}),
    "qwen3 yarn, original length from max_position_embeddings": (
        "qwen3", 0, {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0},
        {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0}}, {"max_position_embeddings": 8192}),
    "gpt-oss yarn, sliding layer": ("gpt_oss", 0, {**GPT_OSS_YARN, "rope_theta": 150000.0},
                                    {"rope_theta": 150000.0, "rope_scaling": GPT_OSS_YARN},
                                    {"max_position_embeddings": 131072}),
    "gpt-oss yarn, global layer": ("gpt_oss", 1, {**GPT_OSS_YARN, "rope_theta": 150000.0},
                                   {"rope_theta": 150000.0, "rope_scaling": GPT_OSS_YARN},
                                   {"max_position_embeddings": 131072}),
    "qwen3-next partial rotary": ("qwen3_next", 1, {"rope_type": "default", "rope_theta": 1000.0,
                                                    "partial_rotary_factor": 0.25},
                                  {"rope_theta": 1000.0, "rope_scaling": None, "partial_rotary_factor": 0.25},
                                  {"layer_types": ["linear_attention", "full_attention"]}),
    "gemma3 linear, local layer": ("gemma3", 0, GEMMA3_LINEAR,
                                   {"rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, {}),
    "gemma3 linear, global layer": ("gemma3", 1, GEMMA3_LINEAR,
                                    {"rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                     "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, {}),
    "gemma2 default": ("gemma2", 0, {"rope_type": "default", "rope_theta": 10000.0}, {"rope_theta": 10000.0}, {}),
}
_V4_COPIED = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "layer_types",
              "sliding_window", "max_position_embeddings", "query_pre_attn_scalar", "attn_logit_softcapping")


def _as_4x(module, config, rope_attributes: dict):
    """``module`` reading a 4.57-shaped config: no ``rope_parameters``, RoPE in ``rope_attributes``, and no
    ``layer_type`` attribute on the module (its layer type comes from ``layer_types[layer_idx]``)."""
    import copy
    import types

    old = types.SimpleNamespace(**{name: getattr(config, name) for name in _V4_COPIED if hasattr(config, name)},
                                **copy.deepcopy(rope_attributes))
    legacy = copy.copy(module)  # shares the weights
    legacy.config = old
    legacy.__dict__.pop("layer_type", None)
    return legacy


@pytest.mark.parametrize("name", list(V4_CASES))
def test_from_hf_reads_transformers_4x_configs(name):
    kind, layer, rope_5x, rope_4x, config_kw = V4_CASES[name]
    module, config, cos_sin, layer_type = _hf_case(kind, layer, rope_parameters=dict(rope_5x), **config_kw)
    assert getattr(config, "rope_parameters", None)  # the 5.x config, for the reference
    legacy = _as_4x(module, config, rope_4x)
    assert not hasattr(legacy.config, "rope_parameters") and not hasattr(legacy, "layer_type")
    new, old = LLMAttention.from_hf(module).eval(), LLMAttention.from_hf(legacy).eval()
    assert new.rope_inv_freq is not None and old.rope_inv_freq is not None
    assert torch.equal(old.rope_inv_freq, new.rope_inv_freq)
    assert old.rope_attention_factor == new.rope_attention_factor
    assert (old.rope_base, old.rotary_dim, old.rope_scaling) == (new.rope_base, new.rotary_dim, new.rope_scaling)
    assert old.sliding_window == new.sliding_window
    # and the copy equals the Hugging Face module itself
    x = _x(B, T, 32, seed=5)
    hf_mask = _hf_mask(config, layer_type, x)
    with torch.no_grad():
        expected, _ = module(x, cos_sin, hf_mask)
    assert max_rel_diff(old(x)[0], expected) < 1e-5
    # what the case exercises
    expected_type = rope_5x.get(layer_type, rope_5x).get("rope_type")
    assert (old.rope_scaling or {}).get("rope_type", "default") == expected_type
    if kind == "qwen3_next":
        assert old.rotary_dim == 4  # a quarter of D = 16
    if kind == "gemma3":
        assert old.rope_base == (1e4 if layer_type == "sliding_attention" else 1e6)
    if "original length" in name:
        assert old.rope_scaling is not None and old.rope_scaling["original_max_position_embeddings"] == 8192


def test_from_hf_names_bad_4x_rope_settings():
    module, config, _, _ = _hf_case("qwen3", 0)
    cases = [
        ({"rope_theta": 1e4, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
         ValueError, r"rope_type'\] = 'dynamic' is not supported"),
        ({"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear"}}, ValueError, r"missing \['factor'\]"),
        ({"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 0.25}}, ValueError, "factor"),
        ({"rope_theta": 1.0}, ValueError, r"rope_base must be > 1 \(or None for no RoPE\), got 1.0"),
        ({"rope_scaling": None}, ValueError, "neither rope_parameters nor rope_theta"),
        ({"rope_theta": 1e4, "rope_scaling": "yarn"}, TypeError, "rope_scaling must be a mapping or None, got str"),
        ({"rope_theta": 1e4, "partial_rotary_factor": 0.1}, ValueError, r"int\(12 \* 0\.1\) = 1 must be even"),
    ]
    for attributes, error, message in cases:
        with pytest.raises(error, match=message):
            LLMAttention.from_hf(_as_4x(module, config, attributes))


# --------------------------------------------------------------------------- local and global layers


def _gemma3_config(**kw):
    transformers = pytest.importorskip("transformers", reason="the Gemma 3 comparison needs transformers")
    config = transformers.Gemma3TextConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, **kw)
    config._attn_implementation = "eager"
    return config


@pytest.mark.parametrize("sliding_window, T", [(4, 12), (1, 6), (16, 12)])
def test_layer_masks_equal_what_transformers_builds_for_gemma3(sliding_window, T):
    config = _gemma3_config(sliding_window=sliding_window)
    assert config.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]  # five local, one global
    x = torch.zeros(2, T, 32)
    theirs = {kind: from_additive(_hf_mask(config, kind, x)) for kind in set(config.layer_types)}  # (B, 1, T, T)
    ours = layer_masks(config.layer_types, T, config.sliding_window)
    assert len(ours) == config.num_hidden_layers
    for kind, mask in zip(config.layer_types, ours):
        assert torch.equal(theirs[kind], mask.expand(2, 1, T, T)), kind
    assert ours[0] is ours[1]  # layers of one type share one tensor
    assert int(ours[0][-1].sum()) == min(sliding_window, T) and int(ours[5][-1].sum()) == T


@pytest.mark.parametrize("local_base, global_base", [(10_000.0, 1_000_000.0), (500.0, 20_000.0)])
def test_layer_rope_bases_read_the_config(local_base, global_base):
    """Read from the config, not assumed: other bases (and a linear x8 on the global layers) come through."""
    config = _gemma3_config(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": global_base}})
    bases = layer_rope_bases(config)
    assert bases == [local_base if kind == "sliding_attention" else global_base for kind in config.layer_types]
    params = layer_rope_parameters(config)
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention, Gemma3RotaryEmbedding

    rotary = Gemma3RotaryEmbedding(config)
    for i, kind in enumerate(config.layer_types[:6]):
        ours = LLMAttention.from_hf(Gemma3Attention(config, i))
        assert ours.rope_base == bases[i] and params[i]["rope_type"] == ("linear" if kind == "full_attention"
                                                                         else "default")
        theirs = getattr(rotary, f"{kind}_inv_freq").double()  # transformers' frequencies for this layer type
        assert ours.rope_inv_freq is not None
        assert ((ours.rope_inv_freq - theirs).abs() / theirs).max() < 1e-6


def test_layer_rope_parameters_of_a_flat_config_and_of_a_config_json():
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    config = transformers.GptOssConfig(vocab_size=32, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=8, num_hidden_layers=4)
    params = layer_rope_parameters(config)  # one flat dict: every layer gets it
    assert len(params) == 4 and all(p == config.rope_parameters for p in params)
    assert layer_rope_bases(config) == [150_000.0] * 4
    config_json = {"layer_types": ["sliding_attention", "full_attention"], "rope_theta": 1_000_000,
                   "rope_local_base_freq": 10_000, "rope_scaling": {"type": "linear", "factor": 8.0}}
    assert layer_rope_parameters(config_json) == [{"rope_type": "default", "rope_theta": 10_000},
                                                  {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000}]


def test_layer_masks_bad_input():
    with pytest.raises(ValueError, match="sliding_window must be an int >= 1, got 0"):
        layer_masks(["sliding_attention"], 8, 0)
    with pytest.raises(ValueError, match=r"layer_types\[1\] = 'chunked_attention'"):
        layer_masks(["full_attention", "chunked_attention"], 8, 4)
    with pytest.raises(ValueError, match="sliding_window must be an int >= 1, got None"):
        layer_masks(["full_attention", "sliding_attention"], 8)
    with pytest.raises(TypeError, match="list of strings"):
        layer_masks("full_attention", 8)
    with pytest.raises(ValueError, match="empty"):
        layer_masks([], 8)
    with pytest.raises(ValueError, match="'linear_attention'"):
        layer_rope_bases({"layer_types": ["linear_attention"], "rope_theta": 1e4})
    with pytest.raises(ValueError, match="neither rope_parameters nor rope_theta"):
        layer_rope_bases({"layer_types": ["full_attention"]})
    with pytest.raises(ValueError, match="no entry for the layer type 'sliding_attention'"):
        layer_rope_parameters({"layer_types": ["sliding_attention"],
                               "rope_parameters": {"full_attention": {"rope_theta": 1e4}}})
    assert LAYER_TYPES == ("full_attention", "sliding_attention")
    assert torch.equal(layer_masks(["full_attention"], 5)[0], causal_mask(5))
