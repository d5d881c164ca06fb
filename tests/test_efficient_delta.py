"""Tests for attnbook.efficient.delta_rule_attention, the (gated) delta rule: its recurrent and chunkwise forms
agree with each other, with the rule written as a matrix product, and with the pure-PyTorch reference in
Hugging Face transformers' Qwen3-Next; a write overwrites (what plain linear attention cannot); the state carries
over from one call to the next; bad input names the problem.

Dimension legend: B batch, H heads, T length, D head dim, Dv value head dim. Unless said, q and k are
(2, 3, T, 8) and v (2, 3, T, 5), T = 37 (not a multiple of any chunk size tried but 1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbook.efficient import (
    DELTA_METHODS,
    delta_rule_attention,
    delta_rule_costs,
    delta_rule_inputs,
    l2norm,
    linear_attention,
)
from tests.helpers import qkv, randn

F64 = torch.float64


def inputs(T: int = 37, *, dtype: torch.dtype = F64, seed: int = 0, B: int = 2, H: int = 3, D: int = 8,
           Dv: int = 5) -> dict[str, torch.Tensor]:
    """Unit-norm q and k, v, beta in (0, 1), gate in (0.5, 1), an initial state: what a gated delta layer feeds."""
    q, k, v = qkv(B, H, T, D, Dv=Dv, seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed + 10)
    return {"q": F.normalize(q, dim=-1), "k": F.normalize(k, dim=-1), "v": v,
            "beta": torch.rand(B, H, T, generator=g, dtype=dtype),
            "gate": 0.5 + 0.5 * torch.rand(B, H, T, generator=g, dtype=dtype),
            "state": randn(B, H, D, Dv, seed=seed + 20, dtype=dtype)}


def matrix_form(q, k, v, beta, gate, state, scale):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, out_t = S_t^T (scale q_t): the rule as a
    product of (D, D) matrices, one (batch, head, step) at a time."""
    B, H, T, D = q.shape
    eye = torch.eye(D, dtype=q.dtype)
    outs, states = [], []
    for b in range(B):
        for h in range(H):
            S = state[b, h]  # (D, Dv)
            for t in range(T):
                kt, a, bt = k[b, h, t][:, None], gate[b, h, t], beta[b, h, t]
                S = a * (eye - bt * kt @ kt.T) @ S + bt * kt @ v[b, h, t][None, :]
                outs.append(S.T @ (scale * q[b, h, t]))
            states.append(S)
    return torch.stack(outs).view(B, H, T, -1), torch.stack(states).view(B, H, D, -1)


# ----------------------------------------------------------------------------- the two forms agree


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64])
def test_recurrent_equals_chunkwise_float64(gated, chunk_size):
    x = inputs()
    gate = x["gate"] if gated else None
    for initial in (None, x["state"]):
        ref, ref_state = delta_rule_attention(x["q"], x["k"], x["v"], x["beta"], gate=gate, method="recurrent",
                                              initial_state=initial, output_final_state=True)
        out, state = delta_rule_attention(x["q"], x["k"], x["v"], x["beta"], gate=gate, chunk_size=chunk_size,
                                          initial_state=initial, output_final_state=True)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-10)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("chunk_size", [3, 16, 64])
def test_recurrent_equals_chunkwise_float32(gated, chunk_size):
    x = inputs(T=100, dtype=torch.float32)
    gate = x["gate"] if gated else None
    ref = delta_rule_attention(x["q"], x["k"], x["v"], x["beta"], gate=gate, method="recurrent",
                               initial_state=x["state"])
    out = delta_rule_attention(x["q"], x["k"], x["v"], x["beta"], gate=gate, chunk_size=chunk_size,
                               initial_state=x["state"])
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_equals_the_rule_as_matrix_products(method):
    """Unnormalised keys, beta up to 2 and a strong gate: the chunkwise algebra is exact, not only for unit keys."""
    q, k, v = qkv(2, 2, 13, 4, Dv=3, seed=3)
    g = torch.Generator().manual_seed(4)
    beta, gate = 2 * torch.rand(2, 2, 13, generator=g, dtype=F64), torch.rand(2, 2, 13, generator=g, dtype=F64)
    state = randn(2, 2, 4, 3, seed=5)
    ref, ref_state = matrix_form(q * 0.5, k * 0.5, v, beta, gate, state, scale=0.7)
    out, out_state = delta_rule_attention(q * 0.5, k * 0.5, v, beta, gate=gate, method=method, chunk_size=5, scale=0.7,
                                          initial_state=state, output_final_state=True)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_state, ref_state, rtol=1e-10, atol=1e-10)


def test_l2norm_option_and_default_scale():
    """use_qk_l2norm=True is the same as normalising q and k first with l2norm; the default scale is 1 / sqrt(D)."""
    q, k, v = qkv(2, 3, 20, 8, Dv=5, seed=7)
    beta = torch.full((2, 3, 20), 0.6, dtype=F64)
    for method in DELTA_METHODS:
        a = delta_rule_attention(q, k, v, beta, use_qk_l2norm=True, method=method)
        b = delta_rule_attention(l2norm(q), l2norm(k), v, 0.6, method=method,
                                 scale=8 ** -0.5)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_gradients_of_the_two_forms_agree(method):
    x = inputs(T=21)
    leaves = {n: x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "gate", "state")}
    out, state = delta_rule_attention(leaves["q"], leaves["k"], leaves["v"], leaves["beta"], gate=leaves["gate"],
                                      method=method, chunk_size=8, initial_state=leaves["state"],
                                      output_final_state=True)
    (out.sin().sum() + state.cos().sum()).backward()
    got = {n: t.grad for n, t in leaves.items()}
    ref_leaves = {n: x[n].clone().requires_grad_() for n in leaves}
    ref_out, ref_state = matrix_form(ref_leaves["q"], ref_leaves["k"], ref_leaves["v"], ref_leaves["beta"],
                                     ref_leaves["gate"], ref_leaves["state"], scale=8 ** -0.5)
    (ref_out.sin().sum() + ref_state.cos().sum()).backward()
    for n, t in ref_leaves.items():
        torch.testing.assert_close(got[n], t.grad, rtol=1e-9, atol=1e-10, msg=f"gradient of {n}")


# ----------------------------------------------------------------------------- Hugging Face's Qwen3-Next


def _qwen3_next():
    pytest.importorskip("transformers", reason="transformers (test-only) is not installed: no Qwen3-Next reference")
    try:
        from transformers.models.qwen3_next import modeling_qwen3_next
    except ImportError as e:  # an older transformers without the model
        pytest.skip(f"this transformers has no Qwen3-Next ({e})")
    return modeling_qwen3_next


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("l2norm_in_kernel", [False, True])
def test_equals_qwen3_next_torch_reference(gated, l2norm_in_kernel):
    """transformers' torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule (the fallbacks of its
    flash-linear-attention kernels): layout (B, T, H, D), g the log of the decay, q scaled by 1/sqrt(D) after the
    optional l2 norm, float32 inside. Same inputs, same outputs and final state, both our forms."""
    hf = _qwen3_next()
    x = inputs(T=45, dtype=torch.float32, D=16, Dv=12)
    q, k = x["q"] * 3.0, x["k"] * 0.5  # not unit: the kernel's l2 norm (or none) is what is compared
    if not l2norm_in_kernel:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    gate = x["gate"] if gated else torch.ones_like(x["gate"])

    def bthd(t):  # (B, H, T, ...) -> (B, T, H, ...)
        return t.transpose(1, 2).contiguous()

    args = (bthd(q), bthd(k), bthd(x["v"]))
    kw = dict(g=bthd(gate.log()), beta=bthd(x["beta"]), initial_state=x["state"].clone(), output_final_state=True,
              use_qk_l2norm_in_kernel=l2norm_in_kernel)
    refs = [hf.torch_recurrent_gated_delta_rule(*args, **kw), hf.torch_chunk_gated_delta_rule(*args, chunk_size=16, **kw)]
    for method in DELTA_METHODS:
        out, state = delta_rule_attention(q, k, x["v"], x["beta"], gate=x["gate"] if gated else None, method=method,
                                          chunk_size=16, use_qk_l2norm=l2norm_in_kernel, initial_state=x["state"],
                                          output_final_state=True)
        for ref_out, ref_state in refs:
            torch.testing.assert_close(out, ref_out.transpose(1, 2), rtol=0, atol=1e-5)
            torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-5)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: an error relative to the output's size."""
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.mark.parametrize("norm", [4e-4, 1e-3, 1.0, 50.0])
def test_l2norm_equals_transformers_and_fla(norm):
    """eps inside the square root, x * rsqrt(sum(x^2) + eps), as transformers' Qwen3-Next l2norm (written to match
    flash-linear-attention's): equal for long and for very short vectors, where F.normalize is not."""
    hf = _qwen3_next()
    x = F.normalize(randn(3, 5, 16, seed=1, dtype=torch.float32), dim=-1) * norm  # rows of length `norm`
    torch.testing.assert_close(l2norm(x), hf.l2norm(x), rtol=1e-6, atol=0)
    if norm < 1e-2:  # short keys: F.normalize makes them unit, the kernels' l2norm does not
        assert (l2norm(x).norm(dim=-1) < 0.8).all() and (F.normalize(x, dim=-1).norm(dim=-1) > 0.99).all()


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_short_keys_match_qwen3_next_with_the_kernel_l2norm(method):
    """Keys of norm 4e-4 (and queries of norm 1e-3): with use_qk_l2norm=True the output equals transformers'
    reference run with use_qk_l2norm_in_kernel=True, relative to the output's size."""
    hf = _qwen3_next()
    x = inputs(T=40, dtype=torch.float32, D=16, Dv=8)
    q, k = x["q"] * 1e-3, x["k"] * 4e-4

    def bthd(t):  # (B, H, T, ...) -> (B, T, H, ...)
        return t.transpose(1, 2).contiguous()

    ref, _ = hf.torch_chunk_gated_delta_rule(bthd(q), bthd(k), bthd(x["v"]), g=bthd(x["gate"].log()),
                                             beta=bthd(x["beta"]), chunk_size=16, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
    out = delta_rule_attention(q, k, x["v"], x["beta"], gate=x["gate"], method=method, chunk_size=16,
                               use_qk_l2norm=True)
    assert rel_err(out, ref.transpose(1, 2)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", DELTA_METHODS)
def test_half_precision_inputs_are_computed_in_float32(dtype, method):
    """bfloat16 and float16 inputs: computed in float32 (as fla and transformers), output in the input dtype,
    final state in float32; equal to the float32 computation on the same (rounded) inputs up to the output's
    rounding; a half-precision initial state is accepted too."""
    x = inputs(T=70, dtype=torch.float32, D=16, Dv=8)
    half = {n: x[n].to(dtype) for n in ("q", "k", "v", "beta", "gate", "state")}
    out, state = delta_rule_attention(half["q"], half["k"], half["v"], half["beta"], gate=half["gate"], method=method,
                                      chunk_size=16, use_qk_l2norm=True, initial_state=half["state"],
                                      output_final_state=True)
    assert out.dtype == dtype and state.dtype == torch.float32
    ref, ref_state = delta_rule_attention(*(half[n].float() for n in ("q", "k", "v", "beta")),
                                          gate=half["gate"].float(), method=method, chunk_size=16, use_qk_l2norm=True,
                                          initial_state=half["state"].float(), output_final_state=True)
    rounding = torch.finfo(dtype).eps  # one rounding of the output to the input dtype
    assert rel_err(out, ref) <= rounding
    assert rel_err(state, ref_state) < 1e-6
    again = delta_rule_attention(half["q"], half["k"], half["v"], half["beta"], gate=half["gate"], method=method,
                                 chunk_size=16, use_qk_l2norm=True, initial_state=half["state"].float())
    assert torch.equal(again, out)


# ----------------------------------------------------------------------------- what the rule does


def test_a_write_overwrites_where_linear_attention_mixes():
    """D orthonormal keys written with beta = 1, then key 3 written again with a new value. Reading key 3 (a step
    with beta = 0 is a pure read) gives exactly the new value and every other key its own value. An additive
    state, S = sum k v^T, gives old + new for key 3; linear attention (elu + 1 features, normalised) gives a
    mixture of all the values for every key."""
    D = 8
    keys = torch.linalg.qr(randn(D, D, seed=1))[0].T  # (D, D) orthonormal rows
    values = randn(D, 3, seed=2)  # (D, Dv)
    new = randn(1, 3, seed=3)  # (1, Dv)
    k = torch.cat([keys, keys[3:4], keys])[None, None]  # (1, 1, 2D + 1, D): D writes, a rewrite, D reads
    v = torch.cat([values, new, torch.zeros(D, 3, dtype=F64)])[None, None]  # (1, 1, 2D + 1, Dv)
    beta = torch.cat([torch.ones(D + 1), torch.zeros(D)]).to(F64)[None, None]  # (1, 1, 2D + 1)
    expected = values.clone()
    expected[3] = new[0]
    for method in DELTA_METHODS:
        out, state = delta_rule_attention(k, k, v, beta, method=method, chunk_size=4, scale=1.0,
                                          output_final_state=True)
        torch.testing.assert_close(out[0, 0, D + 1:], expected, rtol=0, atol=1e-12)  # reads
        torch.testing.assert_close(keys @ state[0, 0], expected, rtol=0, atol=1e-12)  # the final state
    additive = keys.T @ values + keys[3:4].T @ new  # (D, Dv): S = sum k v^T
    torch.testing.assert_close((keys @ additive)[3], values[3] + new[0])
    mixed = linear_attention(keys[None, None], k[:, :, : D + 1], v[:, :, : D + 1])[0, 0]  # (D, Dv)
    assert ((mixed - expected).norm(dim=-1) > 0.3 * expected.norm(dim=-1)).all()


def test_gate_zero_forgets_and_beta_zero_only_reads():
    x = inputs(T=30)
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    for method in DELTA_METHODS:
        # alpha = 0: the state is emptied before each write, so S_t = beta_t k_t v_t^T
        out = delta_rule_attention(q, k, v, beta, gate=0.0, method=method, chunk_size=8, initial_state=x["state"])
        dots = (q * k).sum(-1, keepdim=True) * 8 ** -0.5  # (B, H, T, 1)
        torch.testing.assert_close(out, beta[..., None] * dots * v, rtol=0, atol=1e-12)
        # beta = 0: nothing is written, each step reads the initial state decayed by alpha^(t+1)
        out = delta_rule_attention(q, k, v, 0.0, gate=0.9, method=method, chunk_size=8, initial_state=x["state"],
                                   scale=1.0)
        decay = 0.9 ** torch.arange(1, 31, dtype=F64)[:, None]  # (T, 1)
        torch.testing.assert_close(out, decay * (q @ x["state"]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", DELTA_METHODS)
def test_the_state_carries_over_between_calls(method):
    """Running the first 20 positions, then the other 17 from the returned state, is running all 37: how a
    decoder (one token per call) or a long prefill (piece by piece) uses it."""
    x = inputs()
    whole, whole_state = delta_rule_attention(x["q"], x["k"], x["v"], x["beta"], gate=x["gate"], method=method,
                                              chunk_size=8, initial_state=x["state"], output_final_state=True)
    first, state = delta_rule_attention(x["q"][:, :, :20], x["k"][:, :, :20], x["v"][:, :, :20], x["beta"][..., :20],
                                        gate=x["gate"][..., :20], method=method, chunk_size=8,
                                        initial_state=x["state"], output_final_state=True)
    rest, last_state = delta_rule_attention(x["q"][:, :, 20:], x["k"][:, :, 20:], x["v"][:, :, 20:],
                                            x["beta"][..., 20:], gate=x["gate"][..., 20:], method=method, chunk_size=8,
                                            initial_state=state, output_final_state=True)
    torch.testing.assert_close(torch.cat([first, rest], dim=2), whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(last_state, whole_state, rtol=0, atol=1e-12)


def test_per_head_broadcast_of_beta_and_gate():
    """beta and gate broadcast to (B, H, T): one value per head, (1, H, 1), is the same as the full tensor."""
    x = inputs(T=12)
    per_head = torch.tensor([0.2, 0.5, 0.9], dtype=F64).view(1, 3, 1)
    full = per_head.expand(2, 3, 12)
    a = delta_rule_attention(x["q"], x["k"], x["v"], per_head, gate=per_head)
    b = delta_rule_attention(x["q"], x["k"], x["v"], full.clone(), gate=full.clone(), method="recurrent")
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"chunk_size": 2.0}, TypeError, "chunk_size"),
        ({"method": "parallel"}, ValueError, "method"),
        ({"beta": 2.5}, ValueError, r"beta must be in \[0.0, 2.0\]"),
        ({"beta": -0.1}, ValueError, "beta"),
        ({"beta": torch.ones(2, 3, 5, dtype=F64)}, ValueError, r"beta must .*\(2, 3, 6\).*\(2, 3, 5\)"),
        ({"beta": torch.ones(2, 3, 6, dtype=torch.long)}, TypeError, "beta must be a floating-point"),
        ({"beta": "0.5"}, TypeError, "beta"),
        ({"beta": True}, TypeError, "beta"),
        ({"gate": 1.5}, ValueError, r"gate must be in \[0.0, 1.0\]"),
        ({"gate": torch.full((3,), 0.5, dtype=F64)}, ValueError, "gate must"),
        ({"initial_state": torch.zeros(2, 3, 4, 4, dtype=F64)}, ValueError, r"initial_state .*\(2, 3, 4, 5\)"),
        ({"initial_state": torch.zeros(2, 3, 4, 5)}, TypeError, "initial_state must have q's dtype"),
        ({"initial_state": [0.0]}, TypeError, "initial_state"),
        ({"use_qk_l2norm": 1}, TypeError, "use_qk_l2norm must be a bool"),
        ({"use_qk_l2norm": "yes"}, TypeError, "use_qk_l2norm must be a bool"),
        ({"output_final_state": "yes"}, TypeError, "output_final_state must be a bool"),
        ({"scale": 0.0}, ValueError, "scale"),
    ],
)
def test_bad_input_names_the_problem(kwargs, error, match):
    q, k, v = qkv(2, 3, 6, 4, Dv=5)
    kwargs = {"beta": 0.5, **kwargs}
    beta = kwargs.pop("beta")
    with pytest.raises(error, match=match):
        delta_rule_attention(q, k, v, beta, **kwargs)


def test_bad_shapes():
    q, k, v = qkv(2, 3, 6, 4, S=7, Dv=5)
    with pytest.raises(ValueError, match="same length"):
        delta_rule_attention(q, k, v, 0.5)
    with pytest.raises(ValueError, match="4-D"):
        delta_rule_attention(q[0], k[0, :, :6], v[0, :, :6], 0.5)


# ----------------------------------------------------------------------------- inputs and costs


def test_delta_rule_inputs():
    x = delta_rule_inputs(10, batch_size=2, num_heads=3, head_dim=4, seed=5, dtype=F64)
    assert x["q"].shape == x["k"].shape == x["v"].shape == (2, 3, 10, 4)
    assert x["beta"].shape == x["gate"].shape == (2, 3, 10)
    assert ((x["beta"] > 0) & (x["beta"] < 1) & (x["gate"] > 0) & (x["gate"] < 1)).all()
    again = delta_rule_inputs(10, batch_size=2, num_heads=3, head_dim=4, seed=5, dtype=F64)
    assert all(torch.equal(x[n], again[n]) for n in x)


def test_delta_rule_costs_times_each_method_at_each_length():
    before = torch.get_num_threads()
    costs = delta_rule_costs((8, 16), rounds=1, chunk_size=4, head_dim=4)
    assert set(costs) == {(m, T) for m in DELTA_METHODS for T in (8, 16)}
    assert all(s > 0 for s in costs.values())
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="methods"):
        delta_rule_costs((8,), methods=("parallel",))
