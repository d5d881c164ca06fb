"""attnbook.triton_attention: the Triton kernels (under Triton's interpreter on a CPU) against PyTorch's SDPA,
chapter 8's flash attention, the course's masks, and the byte counts against what PyTorch writes."""

import functools
import importlib.util
import math
import os

import pytest
import torch
import torch.nn.functional as F

from attnbook import causal_mask, padding_mask, sliding_window_mask
from attnbook.efficient import flash_attention
from attnbook.measure import BytesWrittenCounter
from attnbook.testing import check_attention
from attnbook.triton_attention import (
    INSTALL,
    attention_flops,
    explicit_bytes,
    kernel_bytes,
    key_tile_range,
    tile_sram_bytes,
    triton_attention,
    triton_attention_with_lse,
    triton_available,
)

if importlib.util.find_spec("triton") is None:
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"Triton is not installed, and under CI=true its tests must run: {INSTALL}")
    pytest.skip(f"Triton is not installed ({INSTALL})", allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True, scope="module")
def interpreter():
    """On a CPU the kernels run under Triton's interpreter: the variable is set for this module only."""
    if DEVICE == "cuda":
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    yield
    if old is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = old


def qkv(B=1, H=2, T=40, S=None, D=16, Dv=None, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    S = T if S is None else S
    Dv = D if Dv is None else Dv
    ts = [torch.randn(B, H, n, d, generator=g).to(DEVICE, dtype) for n, d in ((T, D), (S, D), (S, Dv))]
    return [t.requires_grad_(grad) for t in ts]


def reference(q, k, v, mask):
    """SDPA with the course's convention: a query with no allowed key gets zeros."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is None:
        return out
    empty = ~mask.expand(*q.shape[:-2], q.shape[-2], k.shape[-2]).any(-1, keepdim=True)
    return out.masked_fill(empty, 0.0)


def grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


def test_triton_is_importable():
    assert triton_available()


@pytest.mark.parametrize("T,S,D,Dv", [(40, 40, 16, 16), (33, 70, 24, 8), (1, 17, 8, 8), (50, 1, 16, 16)])
def test_forward_and_gradients_equal_sdpa(T, S, D, Dv):
    q, k, v = qkv(B=2, T=T, S=S, D=D, Dv=Dv, grad=True)
    out = triton_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 2, T, Dv)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    g = torch.randn_like(out)
    for a, b in zip(grads(out, (q, k, v), g), grads(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T,S", [(70, 70), (45, 70), (70, 45)])
def test_causal_is_top_left_as_is_causal(T, S):
    q, k, v = qkv(T=T, S=S, grad=True)
    out = triton_attention(q, k, v, causal=True)
    ref = reference(q, k, v, causal_mask(T, S))
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    g = torch.randn_like(out)
    for a, b in zip(grads(out, (q, k, v), g), grads(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_padding_mask_and_fully_masked_rows_give_zeros():
    q, k, v = qkv(B=2, T=37, S=37, grad=True)
    mask = padding_mask([37, 20]) & causal_mask(37)  # (2, 1, 37, 37)
    mask = mask.clone()
    mask[1, 0, 5] = False  # one query with no key at all
    out, lse = triton_attention_with_lse(q, k, v, mask.to(DEVICE))
    assert torch.isfinite(out).all()
    assert (out[1, :, 5] == 0).all() and torch.isinf(lse[1, :, 5]).all()
    torch.testing.assert_close(out, reference(q, k, v, mask.to(DEVICE)), atol=2e-6, rtol=1e-5)
    g = torch.randn_like(out)
    ours = grads(out, (q, k, v), g)
    ref = grads(reference(q, k, v, mask.to(DEVICE)), (q, k, v), g)
    for a, b in zip(ours, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert (ours[1][1, :, 20:] == 0).all()  # padded keys get no gradient


def test_lse_equals_logsumexp_of_the_scores():
    q, k, v = qkv(T=45, S=70)
    _, lse = triton_attention_with_lse(q, k, v)
    ref = torch.logsumexp(q @ k.transpose(-1, -2) / math.sqrt(16), dim=-1)
    torch.testing.assert_close(lse, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window,causal", [(0, False), (9, False), (9, True), (40, False)])
def test_window_skips_tiles_and_equals_the_banded_mask(window, causal):
    q, k, v = qkv(T=100, grad=True)
    out = triton_attention(q, k, v, window=window, causal=causal)
    ref = reference(q, k, v, sliding_window_mask(100, window, causal=causal).to(DEVICE))
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    g = torch.randn_like(out)
    for a, b in zip(grads(out, (q, k, v), g), grads(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_key_tile_range_covers_every_allowed_pair_and_skips_empty_tiles():
    T, S, bm, bn = 100, 100, 32, 16
    for causal in (False, True):
        for window in (None, 0, 7, 30):
            allowed = torch.ones(T, S, dtype=torch.bool)
            if causal:
                allowed &= causal_mask(T)
            if window is not None:
                allowed &= sliding_window_mask(T, window)
            for a in range(0, T, bm):
                lo, hi = key_tile_range(a, bm, bn, S, causal=causal, window=window)
                rows = allowed[a:a + bm]
                assert lo % bn == 0
                assert not rows[:, :lo].any() and not rows[:, hi:].any()  # nothing allowed is skipped
                for c in range(lo, hi, bn):  # every visited tile holds an allowed pair
                    assert rows[:, c:c + bn].any(), (causal, window, a, c)


def test_agrees_with_chapter_8s_flash_attention():
    q, k, v = qkv(T=70, grad=True)
    ours = triton_attention(q, k, v, causal=True)
    theirs = flash_attention(q, k, v, causal=True, block_size=32)
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-5)


def test_tile_sizes_do_not_change_the_result():
    q, k, v = qkv(T=70, S=90)
    outs = [triton_attention(q, k, v, block_m=bm, block_n=bn) for bm, bn in ((16, 16), (32, 64), (64, 16))]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=2e-6, rtol=1e-5)


def test_non_contiguous_inputs():
    g = torch.Generator().manual_seed(0)
    fused = torch.randn(2, 48, 3, 2, 16, generator=g).to(DEVICE)  # (B, T, 3, H, D)
    q, k, v = (t.transpose(1, 2) for t in fused.unbind(2))  # (B, H, T, D) views
    torch.testing.assert_close(triton_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_half_precision(dtype, tol):
    q, k, v = qkv(T=40, dtype=dtype, grad=True)
    out = triton_attention(q, k, v, causal=True)
    assert out.dtype == dtype
    ref = F.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), is_causal=True)
    assert (out.float() - ref).abs().max().item() < tol
    g = torch.randn_like(out)
    ours = grads(out, (q, k, v), g)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    theirs = grads(F.scaled_dot_product_attention(q32, k32, v32, is_causal=True), (q32, k32, v32), g.float())
    for a, b in zip(ours, theirs):
        assert a.dtype == dtype and (a.float() - b).abs().max().item() < 10 * tol


def test_bad_arguments_name_the_values():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="block_m must be a power of two.*48"):
        triton_attention(q, k, v, block_m=48)
    with pytest.raises(ValueError, match="block_n"):
        triton_attention(q, k, v, block_n=8)
    with pytest.raises(TypeError, match="bool mask"):
        triton_attention(q, k, v, torch.zeros(40, 40))
    with pytest.raises(ValueError, match=r"does not broadcast"):
        triton_attention(q, k, v, torch.ones(3, 40, dtype=torch.bool))
    with pytest.raises(ValueError, match="4-D"):
        triton_attention(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="window"):
        triton_attention(q, k, v, window=2.5)  # type: ignore[arg-type]


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter switch is a CPU matter")
def test_cpu_tensors_without_the_interpreter_say_what_to_set(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = qkv(T=8)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        triton_attention(q, k, v)


def test_explicit_byte_count_matches_what_pytorch_writes():
    """explicit_bytes' writes are what the three-kernel explicit attention writes, measured."""
    T, S, D = 48, 80, 16
    q, k, v = qkv(T=T, S=S, D=D)

    def explicit():
        w = torch.softmax(q @ k.transpose(-1, -2) * D**-0.5, dim=-1)  # (B, H, T, S)
        return w @ v

    with torch.no_grad(), BytesWrittenCounter() as counter:
        explicit()
    # aten::_unsafe_view is matmul reshaping its own result (no copy), which the counter's schema rule counts
    measured = sum(n for op, n in counter.by_op.items() if op != "aten::_unsafe_view")
    model = explicit_bytes(T, S, D, num_heads=2, element_size=4)["written"]
    assert measured - model == 2 * T * S * 4  # eager PyTorch's scaling is one more (T, S) table per head


def test_kernel_bytes_from_tile_sizes():
    T = S = 1024
    D = 64
    b = kernel_bytes(T, S, D, block_m=128, block_n=64)
    q_tiles = T // 128
    assert b["read"] == 2 * (T * D + q_tiles * S * 2 * D)
    assert b["written"] == 2 * T * D + 4 * T
    causal = kernel_bytes(T, S, D, block_m=128, block_n=64, causal=True)
    assert causal["read"] < 0.6 * b["read"]
    # K and V are read once per query tile: against explicit attention's four (T, S) passes, about 2 Bq / D
    ratio = explicit_bytes(T, S, D)["total"] / b["total"]
    assert 0.9 * 2 * 128 / D < ratio < 2 * 128 / D
    once = kernel_bytes(T, S, D, block_m=T)["total"]  # one query tile: K and V read once
    assert once == 2 * (2 * T * D + S * 2 * D) + 4 * T
    assert attention_flops(T, S, D) == 4 * T * S * D
    assert attention_flops(4, 4, 1, causal=True) == 2 * 10 * 2
    assert tile_sram_bytes(64, 64, 64) == 2 * (64 * 64 + 64 * 128) + 4 * (64 * 64 + 64 * 64 + 128)


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="check_attention builds CPU tensors: the interpreter's path")
def test_check_attention_holds_every_invariant():
    report = check_attention(functools.partial(triton_attention, block_m=32, block_n=32), dtype=torch.float32,
                             name="triton_attention", verbose=False)
    assert report.ok, report.violated
    assert not report.violated
