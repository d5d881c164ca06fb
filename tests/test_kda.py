"""Tests for attnbook.efficient.kimi_delta_attention, Kimi Linear's Kimi Delta Attention (KDA: the gated delta rule
with one decay per key channel): its recurrent and chunkwise forms agree with each other and with the rule
written as a product of (D, D) matrices; with the same decay in every channel it is the gated delta rule, with no
decay the delta rule; it equals the pure-PyTorch reference functions of Hugging Face transformers' Kimi Linear and,
with a tiny layer's own weights, the core of its KimiLinearDeltaAttention layer; the state carries over between
calls; half precision is computed in float32; bad input names the problem.

Dimension legend: B batch, H heads, T length, D head dim, Dv value head dim, E model dim. Unless said, q and k
are (2, 3, T, 8) and v (2, 3, T, 5), T = 37 (not a multiple of any chunk size tried but 1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbook.efficient import DELTA_METHODS, delta_rule_attention, kimi_delta_attention, l2norm
from tests.helpers import qkv, randn

F64 = torch.float64


def inputs(T: int = 37, *, dtype: torch.dtype = F64, seed: int = 0, B: int = 2, H: int = 3, D: int = 8,
           Dv: int = 5, strength: float = 1.0) -> dict[str, torch.Tensor]:
    """Unit-norm q and k, v, beta in (0, 1), a log decay g < 0 per (batch, head, step, channel) as Kimi Linear's
    forget gate makes it (-softplus of a normal, times ``strength``), an initial state."""
    q, k, v = qkv(B, H, T, D, Dv=Dv, seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 10)
    return {"q": F.normalize(q, dim=-1), "k": F.normalize(k, dim=-1), "v": v,
            "g": -strength * F.softplus(torch.randn(B, H, T, D, generator=gen, dtype=dtype)),
            "beta": torch.rand(B, H, T, generator=gen, dtype=dtype),
            "state": randn(B, H, D, Dv, seed=seed + 20, dtype=dtype)}


def run(x: dict[str, torch.Tensor], **kw):
    """kimi_delta_attention on inputs(...)'s tensors, from its initial state, returning (output, final state)."""
    return kimi_delta_attention(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["state"],
                                output_final_state=True, **kw)


def matrix_form(q, k, v, g, beta, state, scale):
    """S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T, out_t = S_t^T (scale q_t), one
    (batch, head, step) at a time."""
    B, H, T, D = q.shape
    eye = torch.eye(D, dtype=q.dtype)
    outs, states = [], []
    for b in range(B):
        for h in range(H):
            S = state[b, h]  # (D, Dv)
            for t in range(T):
                kt, bt = k[b, h, t][:, None], beta[b, h, t]
                S = (eye - bt * kt @ kt.T) @ torch.diag(g[b, h, t].exp()) @ S + bt * kt @ v[b, h, t][None, :]
                outs.append(S.T @ (scale * q[b, h, t]))
            states.append(S)
    return torch.stack(outs).view(B, H, T, -1), torch.stack(states).view(B, H, D, -1)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: an error relative to the output's size."""
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


# ----------------------------------------------------------------------------- the two forms agree


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_equals_the_rule_as_matrix_products(method):
    x = inputs(T=11, B=1, H=2)
    out, state = run(x, method=method, chunk_size=4)
    ref_out, ref_state = matrix_form(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], 8 ** -0.5)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 15, 16, 17, 32, 37, 64])
@pytest.mark.parametrize("strength", [0.1, 1.0, 8.0])
def test_recurrent_equals_chunkwise_float64(chunk_size, strength):
    """Chunks of 1 to 64 (ragged last chunks, one chunk longer than T), weak to strong decays (strength 8: a
    channel keeps e^-8 per step at the median; 64 such steps would overflow exp(-cum) if the chunk's matrices were
    factored from the chunk's start)."""
    x = inputs(strength=strength)
    ref_out, ref_state = run(x, method="recurrent")
    out, state = run(x, method="chunkwise", chunk_size=chunk_size)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 64])
def test_recurrent_equals_chunkwise_float32(chunk_size):
    x = inputs(T=70, dtype=torch.float32, D=16, Dv=8)
    ref_out, ref_state = run(x, method="recurrent")
    out, state = run(x, method="chunkwise", chunk_size=chunk_size)
    assert rel_err(out, ref_out) < 1e-5 and rel_err(state, ref_state) < 1e-5


def test_very_strong_decays_stay_finite():
    """g = -30 in every channel (alpha ~ 1e-13) over chunks of 64, and g = -inf (forget): 64 steps of -30 are
    e^-1920 from the chunk's start, which exp(-cum) could not hold in float32 or float64; the chunkwise form
    never exponentiates a positive number."""
    for dtype in (torch.float32, F64):
        x = inputs(T=130, dtype=dtype, D=16, Dv=8)
        for g in (torch.full_like(x["g"], -30.0), torch.full_like(x["g"], -torch.inf)):
            x["g"] = g
            ref_out, ref_state = run(x, method="recurrent")
            out, state = run(x, method="chunkwise", chunk_size=64)
            assert out.isfinite().all() and state.isfinite().all()
            assert rel_err(out, ref_out) < 1e-5 and rel_err(state, ref_state) < 1e-5


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_a_single_token(method):
    """T = 1: out = S_1^T (scale q) with S_1 = Diag(alpha) S_0 + k beta (v - (Diag(alpha) S_0)^T k)^T."""
    x = inputs(T=1)
    out, state = run(x, method=method)
    S0 = x["g"][:, :, 0, :, None].exp() * x["state"]  # (B, H, D, Dv)
    k, v, q = x["k"][:, :, 0], x["v"][:, :, 0], x["q"][:, :, 0] * 8 ** -0.5  # (B, H, D or Dv)
    u = x["beta"][:, :, 0, None] * (v - (k[..., None] * S0).sum(-2))  # (B, H, Dv)
    S1 = S0 + k[..., None] * u[..., None, :]  # (B, H, D, Dv)
    torch.testing.assert_close(state, S1, rtol=0, atol=1e-14)
    torch.testing.assert_close(out[:, :, 0], (q[..., None] * S1).sum(-2), rtol=0, atol=1e-14)


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_gradients_of_the_two_forms_agree(method):
    x = {n: t.clone().requires_grad_(True) for n, t in inputs(T=21, B=1, H=2).items()}
    out, state = run(x, method=method, chunk_size=8)
    ((out * randn(*out.shape, seed=3)).sum() + (state * randn(*state.shape, seed=4)).sum()).backward()
    got = {n: t.grad for n, t in x.items()}
    for t in x.values():
        t.grad = None
    other = "recurrent" if method == "chunkwise" else "chunkwise"
    out, state = run(x, method=other, chunk_size=8)
    ((out * randn(*out.shape, seed=3)).sum() + (state * randn(*state.shape, seed=4)).sum()).backward()
    for n, t in x.items():
        assert got[n].isfinite().all(), n
        torch.testing.assert_close(got[n], t.grad, rtol=1e-9, atol=1e-10, msg=f"gradient of {n}")


# ----------------------------------------------------------------------------- its special cases


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_the_same_decay_in_every_channel_is_the_gated_delta_rule(method):
    x = inputs()
    x["g"] = x["g"][..., :1].expand_as(x["g"])  # channel 0's decay everywhere
    out, state = run(x, method=method, chunk_size=16)
    ref_out, ref_state = delta_rule_attention(x["q"], x["k"], x["v"], x["beta"], gate=x["g"][..., 0].exp(),
                                              method=method, chunk_size=16, initial_state=x["state"],
                                              output_final_state=True)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_no_decay_is_the_delta_rule(method):
    """alpha = 1 (g = 0, as a float or a tensor): delta_rule_attention without a gate."""
    x = inputs()
    ref_out, ref_state = delta_rule_attention(x["q"], x["k"], x["v"], x["beta"], method=method, chunk_size=16,
                                              initial_state=x["state"], output_final_state=True)
    for g in (0.0, torch.zeros_like(x["g"])):
        x["g"] = g
        out, state = run(x, method=method, chunk_size=16)
        torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
        torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)


def test_a_channel_that_decays_fully_forgets_only_its_row():
    """g = -inf in channel 0 at the last step: row 0 of the state is forgotten before the write, the other rows
    are what they would be with no decay there."""
    x = inputs(T=6)
    g = x["g"].clone()
    g[:, :, -1, 0] = -torch.inf
    g[:, :, -1, 1:] = 0.0
    _, before = kimi_delta_attention(x["q"][:, :, :-1], x["k"][:, :, :-1], x["v"][:, :, :-1], g[:, :, :-1],
                                     x["beta"][:, :, :-1], initial_state=x["state"], output_final_state=True)
    x["g"] = g
    for method in DELTA_METHODS:
        _, state = run(x, method=method, chunk_size=4)
        kept = before.clone()
        kept[:, :, 0] = 0.0  # row 0 forgotten, the rest untouched
        k, v, b = x["k"][:, :, -1], x["v"][:, :, -1], x["beta"][:, :, -1, None]  # (B, H, D), (B, H, Dv), (B, H, 1)
        u = b * (v - (k[..., None] * kept).sum(-2))  # (B, H, Dv)
        torch.testing.assert_close(state, kept + k[..., None] * u[..., None, :], rtol=0, atol=1e-13)


def test_per_head_and_per_channel_broadcast():
    """g of shape (H, 1, D) (one decay per head and channel, the same at every step) and beta of shape (H, 1)."""
    x = inputs()
    B, H, T, D = x["q"].shape
    g = -torch.linspace(0.05, 2.0, H * D, dtype=F64).view(H, 1, D)
    beta = torch.linspace(0.2, 0.9, H, dtype=F64).view(H, 1)
    for method in DELTA_METHODS:
        out = kimi_delta_attention(x["q"], x["k"], x["v"], g, beta, method=method, chunk_size=16)
        ref = kimi_delta_attention(x["q"], x["k"], x["v"], g.expand(B, H, T, D).clone(),
                                   beta.expand(B, H, T).clone(), method=method, chunk_size=16)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_the_state_carries_over_between_calls(method):
    """A prompt of 29 then three tokens one at a time (what a decoder does): the same outputs and final state as
    one call over the 32 positions."""
    x = inputs(T=32)
    full, full_state = run(x, method=method, chunk_size=8)
    names = ("q", "k", "v", "g", "beta")
    state = x["state"]
    parts = []
    for a, b in ((0, 29), (29, 30), (30, 31), (31, 32)):
        part = {n: x[n][:, :, a:b] for n in names}
        out, state = kimi_delta_attention(*(part[n] for n in names), method=method, chunk_size=8,
                                          initial_state=state, output_final_state=True)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, dim=2), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, full_state, rtol=0, atol=1e-12)


def test_l2norm_option_and_default_scale():
    x = inputs()
    q, k = x["q"] * 3.0, x["k"] * 0.2
    for method in DELTA_METHODS:
        out = kimi_delta_attention(q, k, x["v"], x["g"], x["beta"], method=method, use_qk_l2norm=True)
        ref = kimi_delta_attention(l2norm(q), l2norm(k), x["v"], x["g"], x["beta"], method=method,
                                   scale=8 ** -0.5)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", DELTA_METHODS)
def test_half_precision_inputs_are_computed_in_float32(dtype, method):
    """bfloat16 and float16 inputs: computed in float32 (as fla and transformers), output in the input dtype,
    final state in float32; equal to the float32 computation on the same (rounded) inputs up to the output's
    rounding; a half-precision initial state is accepted too."""
    x = inputs(T=70, dtype=torch.float32, D=16, Dv=8)
    half = {n: t.to(dtype) for n, t in x.items()}
    out, state = run(half, method=method, chunk_size=16, use_qk_l2norm=True)
    assert out.dtype == dtype and state.dtype == torch.float32
    ref, ref_state = run({n: t.float() for n, t in half.items()}, method=method, chunk_size=16, use_qk_l2norm=True)
    assert rel_err(out, ref) <= torch.finfo(dtype).eps  # one rounding of the output to the input dtype
    assert rel_err(state, ref_state) < 1e-6
    again = kimi_delta_attention(half["q"], half["k"], half["v"], half["g"], half["beta"], method=method,
                                 chunk_size=16, use_qk_l2norm=True, initial_state=half["state"].float())
    assert torch.equal(again, out)


# ----------------------------------------------------------------------------- Hugging Face's Kimi Linear


def _kimi_linear():
    pytest.importorskip("transformers", reason="transformers (test-only) is not installed: no Kimi Linear reference")
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear
    except ImportError as e:  # an older transformers without the model
        pytest.skip(f"this transformers has no Kimi Linear ({e})")
    return modeling_kimi_linear


def bthd(t: torch.Tensor) -> torch.Tensor:
    """(B, H, T, ...) -> (B, T, H, ...), transformers' layout."""
    return t.transpose(1, 2).contiguous()


@pytest.mark.parametrize("l2norm_in_kernel", [False, True])
@pytest.mark.parametrize("strength", [1.0, 6.0])
def test_equals_kimi_linear_torch_reference(l2norm_in_kernel, strength):
    """transformers' recurrent_kimi_delta_attention and chunk_kimi_delta_attention (the fallbacks of fla's
    fused_recurrent_kda and chunk_kda): layout (B, T, H, D), g the log of the per-channel decay (B, T, H, D), q
    scaled by 1/sqrt(D) after the optional l2 norm, float32 inside. Same inputs, same outputs and final state,
    both our forms, relative to their size."""
    hf = _kimi_linear()
    x = inputs(T=45, dtype=torch.float32, D=16, Dv=12, strength=strength)
    q, k = x["q"] * 3.0, x["k"] * 0.5  # not unit: the kernel's l2 norm (or none) is what is compared
    if not l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    args = (bthd(q), bthd(k), bthd(x["v"]))
    kw = dict(g=bthd(x["g"]), beta=bthd(x["beta"]), output_final_state=True, use_qk_l2norm_in_kernel=l2norm_in_kernel)
    refs = {"recurrent": hf.recurrent_kimi_delta_attention(*args, initial_state=x["state"].clone(), **kw),
            "chunk": hf.chunk_kimi_delta_attention(*args, chunk_size=16, initial_state=x["state"].clone(), **kw)}
    for method in DELTA_METHODS:
        out, state = kimi_delta_attention(q, k, x["v"], x["g"], x["beta"], method=method, chunk_size=16,
                                          use_qk_l2norm=l2norm_in_kernel, initial_state=x["state"],
                                          output_final_state=True)
        for name, (ref_out, ref_state) in refs.items():
            assert rel_err(out, ref_out.transpose(1, 2)) < 1e-5, (method, name)
            assert rel_err(state, ref_state) < 1e-5, (method, name)


def test_equals_the_core_of_kimi_linears_layer():
    """A tiny KimiLinearDeltaAttention (E = 32, 2 heads of 8, its own random weights): its forward pass equals the
    same layer with kimi_delta_attention as its core, fed from the layer's own projections, short convolution,
    forget gate and beta, and followed by its own gated norm and output projection."""
    hf = _kimi_linear()
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig

    H, D, E, T = 2, 8, 32, 23
    config = KimiLinearConfig(hidden_size=E, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                              linear_attn_config={"num_heads": H, "head_dim": D, "short_conv_kernel_size": 4,
                                                  "kda_layers": [1], "full_attn_layers": []})
    assert config.layer_types == ["linear_attention"] and (config.linear_num_heads, config.linear_head_dim) == (H, D)
    torch.manual_seed(0)
    layer = hf.KimiLinearDeltaAttention(config, 0).float()
    with torch.no_grad():
        for p in layer.parameters():  # A_log and dt_bias are left empty by the constructor
            p.copy_(torch.randn_like(p) * 0.3)
    hidden = randn(2, T, E, seed=5, dtype=torch.float32)  # (B, T, E)
    with torch.no_grad():
        ref = layer(hidden)  # (B, T, E)
        B = hidden.shape[0]
        mixed = torch.cat([layer.q_proj(hidden), layer.k_proj(hidden), layer.v_proj(hidden)], dim=-1)  # (B, T, 3HD)
        conv = F.conv1d(mixed.transpose(1, 2), layer.conv1d.weight, padding=3, groups=3 * H * D)[..., :T]
        q, k, v = F.silu(conv).transpose(1, 2).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        g = layer.forget_gate(hidden).transpose(1, 2)  # (B, H, T, D) log decay
        beta = torch.sigmoid(layer.b_proj(hidden)).transpose(1, 2)  # (B, H, T)
        for method in DELTA_METHODS:
            core = kimi_delta_attention(q, k, v, g, beta, method=method, use_qk_l2norm=True)  # (B, H, T, D)
            gate = layer.g_b_proj(layer.g_a_proj(hidden)).view(B, T, H, D)  # (B, T, H, D)
            out = layer.o_proj(layer.o_norm(core.transpose(1, 2), gate).reshape(B, T, H * D))  # (B, T, E)
            assert rel_err(out, ref) < 1e-5, method


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"chunk_size": 2.0}, TypeError, "chunk_size"),
        ({"method": "parallel"}, ValueError, "method"),
        ({"g": 0.5}, ValueError, r"g must be <= 0"),
        ({"g": torch.full((2, 3, 6, 4), torch.nan, dtype=F64)}, ValueError, r"g must be <= 0"),
        ({"g": torch.zeros(2, 3, 6, dtype=F64)}, ValueError, r"g must .*\(2, 3, 6, 4\).*\(2, 3, 6\)"),
        ({"g": torch.zeros(2, 3, 6, 4, dtype=torch.long)}, TypeError, "g must be a floating-point"),
        ({"g": "0"}, TypeError, "g must be a float"),
        ({"g": True}, TypeError, "g must be a float"),
        ({"beta": 2.5}, ValueError, r"beta must be in \[0.0, 2.0\]"),
        ({"beta": torch.ones(2, 3, 5, dtype=F64)}, ValueError, r"beta must .*\(2, 3, 6\).*\(2, 3, 5\)"),
        ({"beta": None}, TypeError, "beta"),
        ({"initial_state": torch.zeros(2, 3, 4, 4, dtype=F64)}, ValueError, r"initial_state .*\(2, 3, 4, 5\)"),
        ({"initial_state": torch.zeros(2, 3, 4, 5)}, TypeError, "initial_state must have q's dtype"),
        ({"initial_state": [0.0]}, TypeError, "initial_state"),
        ({"use_qk_l2norm": 1}, TypeError, "use_qk_l2norm must be a bool"),
        ({"output_final_state": "yes"}, TypeError, "output_final_state must be a bool"),
        ({"scale": 0.0}, ValueError, "scale"),
    ],
)
def test_bad_input_names_the_problem(kwargs, error, match):
    q, k, v = qkv(2, 3, 6, 4, Dv=5)
    kwargs = {"g": -0.1, "beta": 0.5, **kwargs}
    g, beta = kwargs.pop("g"), kwargs.pop("beta")
    with pytest.raises(error, match=match):
        kimi_delta_attention(q, k, v, g, beta, **kwargs)


def test_bad_shapes():
    q, k, v = qkv(2, 3, 6, 4, S=7, Dv=5)
    with pytest.raises(ValueError, match="same length"):
        kimi_delta_attention(q, k, v, -0.1, 0.5)
    with pytest.raises(ValueError, match="4-D"):
        kimi_delta_attention(q[0], k[0, :, :6], v[0, :, :6], -0.1, 0.5)
