"""attnbook.scaled_dot_product_attention against PyTorch's reference, and its properties."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnbook
from attnbook import causal_mask, padding_mask, scaled_dot_product_attention
from attnbook.core import check_scale, fully_masked_rows, masked_softmax


def _rand(*shape, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(requires_grad)


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(1, 9), S=st.integers(1, 9),
    D=st.integers(1, 16), Dv=st.integers(1, 8), seed=st.integers(0, 10_000),
    mask_kind=st.sampled_from(["none", "bool", "float", "causal"]),
    dtype=st.sampled_from([torch.float64, torch.float32]),
)
def test_equals_torch_sdpa(B, H, T, S, D, Dv, seed, mask_kind, dtype):
    q = _rand(B, H, T, D, dtype=dtype, seed=seed)
    k = _rand(B, H, S, D, dtype=dtype, seed=seed + 1)
    v = _rand(B, H, S, Dv, dtype=dtype, seed=seed + 2)
    g = torch.Generator().manual_seed(seed)
    if mask_kind == "none":
        mask = None
    elif mask_kind == "bool":
        mask = torch.rand(B, 1, T, S, generator=g) > 0.3
        mask[..., 0] = True  # keep every row attending somewhere (torch's rows would be NaN otherwise)
    elif mask_kind == "float":
        mask = torch.randn(1, H, T, S, generator=g, dtype=dtype)
    else:
        mask = causal_mask(T, S)
    out, w = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    assert w.shape == (B, H, T, S)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T, dtype=dtype), atol=tol, rtol=0)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_gradients_equal_torch(mask_kind):
    q = _rand(2, 3, 6, 8, seed=1, requires_grad=True)
    k = _rand(2, 3, 5, 8, seed=2, requires_grad=True)
    v = _rand(2, 3, 5, 4, seed=3, requires_grad=True)
    mask = {"none": None, "bool": causal_mask(6, 5), "float": _rand(6, 5, seed=4)}[mask_kind]
    grad_out = _rand(2, 3, 6, 4, seed=5)
    ours = torch.autograd.grad(scaled_dot_product_attention(q, k, v, mask)[0], (q, k, v), grad_out)
    ref = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), grad_out)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_gradcheck():
    q = _rand(1, 2, 3, 4, seed=1, requires_grad=True)
    k = _rand(1, 2, 5, 4, seed=2, requires_grad=True)
    v = _rand(1, 2, 5, 3, seed=3, requires_grad=True)
    mask = causal_mask(3, 5, offset=2)
    assert torch.autograd.gradcheck(lambda a, b, c: scaled_dot_product_attention(a, b, c, mask)[0], (q, k, v))


def test_scale_and_default_scale():
    q, k, v = _rand(4, 8, seed=1), _rand(6, 8, seed=2), _rand(6, 2, seed=3)
    out, _ = scaled_dot_product_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3))
    _, w = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(w, torch.softmax(q @ k.T / math.sqrt(8), -1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_with_masks_stays_finite(dtype):
    q, k, v = (_rand(2, 2, 8, 16, seed=s).to(dtype) for s in (1, 2, 3))
    mask = causal_mask(8) & padding_mask([8, 5])  # (B, 1, T, S)
    mask[1, 0, 6] = False  # one row of batch 1 with every key blocked
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    ref, w64 = scaled_dot_product_attention(*(t.double() for t in (q, k, v)), mask)
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)
    assert (w[mask.expand_as(w).logical_not()] == 0).all()


def test_literal_minus_1e9_overflows_float16_but_finfo_min_does_not():
    # why the package never writes -1e9: in float16 it becomes -inf
    assert torch.tensor(-1e9, dtype=torch.float16).isinf()
    assert torch.isfinite(torch.tensor(torch.finfo(torch.float16).min, dtype=torch.float16))


@pytest.mark.parametrize("mask_dtype", ["bool", "float"])
def test_fully_masked_rows_give_zeros_not_nan(mask_dtype):
    q, k, v = _rand(1, 1, 3, 4, seed=1, requires_grad=True), _rand(1, 1, 5, 4, seed=2), _rand(1, 1, 5, 2, seed=3)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    if mask_dtype == "float":
        mask = torch.zeros(3, 5, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[0, 0, 1], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(w[0, 0, 1], torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(w[0, 0, [0, 2]].sum(-1), torch.ones(2, dtype=torch.float64))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[0, 0, 1], torch.zeros(4, dtype=torch.float64))


def test_causal_mask_no_future_leak_via_gradients():
    T = 7
    x = _rand(1, T, 8, seed=4, requires_grad=True)
    out, _ = scaled_dot_product_attention(x, x, x, causal_mask(T))
    for t in range(T):
        (g,) = torch.autograd.grad(out[0, t].sum(), x, retain_graph=True)
        assert torch.all(g[0, t + 1:] == 0), f"output {t} depends on a later input"
        assert g[0, : t + 1].abs().sum() > 0


def test_permutation_equivariance_without_positions():
    x = _rand(2, 6, 8, seed=7)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(0))
    out, w = scaled_dot_product_attention(x, x, x)
    out_p, w_p = scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    torch.testing.assert_close(w_p, w[:, perm][:, :, perm])


def test_dropout_returns_the_weights_it_used():
    torch.manual_seed(0)
    q, k, v = _rand(1, 4, 8, seed=1), _rand(1, 6, 8, seed=2), _rand(1, 6, 3, seed=3)
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(out, w @ v)
    assert (w == 0).any()  # some weights were dropped
    kept = w[w > 0]
    _, w0 = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(kept, 2 * w0[w > 0])  # survivors scaled by 1 / (1 - p)


def test_errors_name_the_shapes():
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 3)
    with pytest.raises(ValueError, match=r"q is \(2, 5, 8\).*k is \(2, 7, 4\)"):
        scaled_dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match=r"k is \(2, 7, 8\).*v is \(2, 6, 3\)"):
        scaled_dot_product_attention(q, k, v[:, :6])
    with pytest.raises(ValueError, match=r"mask of shape \(5, 6\).*\(2, 5, 7\)"):
        scaled_dot_product_attention(q, k, v, torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask.bool"):
        scaled_dot_product_attention(q, k, v, torch.ones(5, 7, dtype=torch.long))
    with pytest.raises(TypeError, match="floating-point"):
        scaled_dot_product_attention(q.long(), k, v)
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="leading"):
        scaled_dot_product_attention(torch.randn(3, 5, 8), k, v)


def test_default_device_is_usable():
    dev = attnbook.default_device()
    assert isinstance(dev, torch.device)
    torch.zeros(1, device=dev)
    if not torch.cuda.is_available():
        assert dev.type in ("cpu", "mps")


# ----------------------------------------------------------------------------- masked_softmax, check_scale


def _reference_softmax(scores, mask):
    """The convention written out: blocked scores filled with finfo.min, softmax in float64, rows with no
    allowed key set to zero."""
    s = scores.double().masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(s, dim=-1) * mask.any(dim=-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("inplace", [False, True])
def test_masked_softmax_is_the_convention_written_out(dtype, inplace):
    scores = _rand(2, 3, 7, 9, seed=1).mul(3).to(dtype)
    mask = torch.rand(2, 1, 7, 9, generator=torch.Generator().manual_seed(2)) > 0.5  # (B, 1, T, S) broadcast
    mask[0, 0, 3] = False  # a row with no key
    mask[1, 0, 5] = False
    mask[1, 0, 5, 8] = True  # a row with one key
    before = scores.clone()
    w = masked_softmax(scores, mask, inplace=inplace)
    assert w.dtype == dtype and w.shape == scores.shape
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(w.double(), _reference_softmax(before, mask.expand_as(scores)), atol=tol, rtol=tol)
    assert (w[mask.expand_as(w).logical_not()] == 0).all()  # blocked: exactly zero
    assert torch.equal(w[0, :, 3], torch.zeros(3, 9, dtype=dtype))
    if not inplace:
        assert torch.equal(scores, before)  # the caller's scores are untouched


def test_masked_softmax_half_precision_computes_in_float32():
    # the float32 softmax rounded once to float16 (exp() and the sum in float16 would round at every step)
    scores = torch.tensor([[0.0, 0.001, 0.002, 10.0]], dtype=torch.float16)
    w = masked_softmax(scores)
    ref = torch.softmax(scores.float(), dim=-1).to(torch.float16)
    assert torch.equal(w, ref)


def test_masked_softmax_fully_masked_rows_have_zero_finite_gradients():
    for mask_kind in ("bool", "float"):
        scores = _rand(2, 4, 5, seed=3, requires_grad=True)
        mask = torch.ones(4, 5, dtype=torch.bool)
        mask[1] = False
        if mask_kind == "float":
            mask = torch.zeros(4, 5, dtype=torch.float64).masked_fill(~mask, float("-inf"))
        w = masked_softmax(scores, mask)
        assert torch.equal(w[:, 1], torch.zeros(2, 5, dtype=torch.float64))
        w.pow(2).sum().backward()
        assert torch.isfinite(scores.grad).all() and torch.equal(scores.grad[:, 1], torch.zeros(2, 5, dtype=torch.float64))


def test_masked_softmax_gradient_equals_the_reference():
    scores = _rand(3, 6, 6, seed=4, requires_grad=True)
    mask = causal_mask(6)
    (g,) = torch.autograd.grad(masked_softmax(scores, mask).sin().sum(), scores)
    (ref,) = torch.autograd.grad(_reference_softmax(scores, mask.expand(3, 6, 6)).sin().sum(), scores)
    torch.testing.assert_close(g, ref)
    assert torch.autograd.gradcheck(lambda s: masked_softmax(s, mask), (scores,))


def test_masked_softmax_float_mask_is_added_and_huge_scores_stay_finite():
    scores = _rand(2, 5, 6, seed=5)
    bias = _rand(5, 6, seed=6)
    torch.testing.assert_close(masked_softmax(scores, bias), torch.softmax(scores + bias, dim=-1))
    huge = torch.full((1, 3), -1e35, dtype=torch.float32)  # + finfo.min rounds to -inf: still weight 0
    w = masked_softmax(huge, torch.tensor([True, False, True]))
    torch.testing.assert_close(w, torch.tensor([[0.5, 0.0, 0.5]]))
    assert torch.equal(masked_softmax(scores, torch.tensor(False)), torch.zeros_like(scores))  # 0-d mask


def test_masked_softmax_off_the_cpu_always_zeroes_the_rows():
    # off the CPU the check for fully masked rows is skipped (it would wait for the device): the zeroing pass
    # always runs; "meta" tensors (shapes only) run that path here
    mask = causal_mask(5, 6, offset=-1)  # (T, S), row 0 allows no key
    for dtype in (torch.float32, torch.float16):
        w = masked_softmax(torch.empty(2, 5, 6, dtype=dtype, device="meta"), mask.to("meta"))
        assert w.device.type == "meta" and w.shape == (2, 5, 6) and w.dtype == dtype
    w = masked_softmax(torch.empty(2, 5, 6, device="meta"), torch.zeros(5, 6, device="meta"))
    assert w.device.type == "meta" and w.shape == (2, 5, 6)


def test_masked_softmax_refuses_bad_input():
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        masked_softmax([[1.0, 2.0]])
    with pytest.raises(TypeError, match="floating-point"):
        masked_softmax(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 3\)"):
        masked_softmax(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask.bool"):
        masked_softmax(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.long))


def test_fully_masked_rows():
    mask = torch.tensor([[True, False], [False, False], [False, True]])
    assert torch.equal(fully_masked_rows(mask), torch.tensor([[False], [True], [False]]))
    assert torch.equal(fully_masked_rows(causal_mask(3, 4, offset=-1)).flatten(), torch.tensor([True, False, False]))
    assert fully_masked_rows(torch.ones(2, 0, dtype=torch.bool)).tolist() == [[True], [True]]  # no keys at all
    with pytest.raises(TypeError, match="bool"):
        fully_masked_rows(torch.ones(2, 2))


def test_check_scale():
    assert check_scale(None, 16) == 0.25
    assert check_scale(2, 16) == 2.0 and isinstance(check_scale(2, 16), float)
    for bad in (True, "0.5", torch.tensor(0.5)):
        with pytest.raises(TypeError, match="scale must be"):
            check_scale(bad, 16)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="scale must be positive"):
            check_scale(bad, 16)
    with pytest.raises(ValueError, match="scale must be positive, got -1"):
        scaled_dot_product_attention(torch.ones(2, 4), torch.ones(3, 4), torch.ones(3, 2), scale=-1)


def test_core_lists_only_its_own_names():
    import attnbook.core as core

    for name in core.__all__:
        assert getattr(core, name).__module__ == "attnbook.core", f"attnbook.core.__all__ lists {name}, defined elsewhere"
