"""attnbook.MultiHeadAttention against torch.nn.MultiheadAttention, and its properties; the grouped
decoding attention of attnbook.mha against an explicit repeat of the key/value heads."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import attnbook
from attnbook import MultiHeadAttention, causal_mask, merge_heads, padding_mask, split_heads
from attnbook.mha import grouped_decode_attention


def _x(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _torch_mha(E, H, batch_first=True, bias=True, kdim=None, vdim=None, seed=0):
    torch.manual_seed(seed)
    m = nn.MultiheadAttention(E, H, batch_first=batch_first, bias=bias, kdim=kdim, vdim=vdim).double().eval()
    with torch.no_grad():  # non-zero biases so that they are checked too
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "both"])
def test_from_torch_self_attention(batch_first, bias, mask_kind):
    E, H, B, T = 16, 4, 3, 6
    m = _torch_mha(E, H, batch_first, bias)
    ours = MultiHeadAttention.from_torch(m).eval()
    x = _x(B, T, E, seed=1)
    mask = {"none": None, "causal": causal_mask(T), "padding": padding_mask([6, 4, 2]),
            "both": causal_mask(T) & padding_mask([6, 4, 2])}[mask_kind]
    out, w = ours(x, mask=mask)
    xin = x if batch_first else x.transpose(0, 1)
    kw = {}
    if mask is not None:
        blocked = ~mask.expand(B, H, T, T).reshape(B * H, T, T)  # torch: True = blocked, per batch*head
        kw["attn_mask"] = blocked
    ref_out, ref_w = m(xin, xin, xin, average_attn_weights=False, **kw)
    if not batch_first:
        ref_out = ref_out.transpose(0, 1)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_from_torch_cross_attention_with_kdim_vdim_and_grads():
    E, H = 12, 3
    m = _torch_mha(E, H, kdim=7, vdim=5)
    ours = MultiHeadAttention.from_torch(m)
    q, k, v = _x(2, 4, E, seed=1), _x(2, 9, 7, seed=2), _x(2, 9, 5, seed=3)
    out, w = ours(q, k, v)
    ref_out, ref_w = m(q, k, v, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    assert w.shape == (2, H, 4, 9)
    out.sum().backward()
    ref_out.sum().backward()
    torch.testing.assert_close(ours.q_proj.weight.grad, m.q_proj_weight.grad)
    torch.testing.assert_close(ours.v_proj.weight.grad, m.v_proj_weight.grad)


def test_key_padding_mask_matches_torch():
    E, H, B, T = 8, 2, 2, 5
    m = _torch_mha(E, H)
    ours = MultiHeadAttention.from_torch(m)
    x = _x(B, T, E, seed=3)
    lengths = torch.tensor([5, 3])
    kpm = torch.arange(T)[None] >= lengths[:, None]  # torch: True = padding
    ref_out, ref_w = m(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
    out, w = ours(x, mask=padding_mask(lengths))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_cross_attention_uses_its_own_key_and_value_projections():
    # the seed's module projected only `query`; ours must react to key and value
    mha = MultiHeadAttention(8, 2).double()
    q, mem = _x(1, 3, 8, seed=1), _x(1, 5, 8, seed=2)
    out, w = mha(q, mem)  # value defaults to key
    assert w.shape == (1, 2, 3, 5) and out.shape == (1, 3, 8)
    out2, _ = mha(q, mem * 2)
    assert not torch.allclose(out, out2)
    k, v = mha.k_proj(mem), mha.v_proj(mem)
    ref = F.scaled_dot_product_attention(split_heads(mha.q_proj(q), 2), split_heads(k, 2), split_heads(v, 2))
    torch.testing.assert_close(out, mha.out_proj(merge_heads(ref)))


@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "float"])
def test_fast_path_equals_explicit_path(mask_kind):
    mha = MultiHeadAttention(16, 4).double().eval()
    x = _x(2, 6, 16, seed=5)
    mask = {"none": None, "causal": causal_mask(6), "padding": padding_mask([6, 3]),
            "float": _x(1, 4, 6, 6, seed=6)}[mask_kind]
    slow, w = mha(x, mask=mask)
    fast, none = mha(x, mask=mask, need_weights=False)
    assert none is None and w is not None
    torch.testing.assert_close(fast, slow)


def test_fully_masked_query_rows_are_zero_in_both_paths():
    mha = MultiHeadAttention(8, 2, bias=False).double()
    x = _x(1, 4, 8, seed=2)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    for need in (True, False):
        out, _ = mha(x, mask=mask, need_weights=need)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[0, 2], torch.zeros(8, dtype=torch.float64))


def test_split_merge_roundtrip_and_shapes():
    x = _x(2, 5, 12)
    h = split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    torch.testing.assert_close(h[:, 1], x[..., 4:8])
    torch.testing.assert_close(merge_heads(h), x)


def test_permutation_equivariance_and_causal_no_leak():
    mha = MultiHeadAttention(8, 2).double()
    x = _x(1, 6, 8, seed=9, dtype=torch.float64).requires_grad_(True)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    out, _ = mha(x)
    out_p, _ = mha(x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    out_c, _ = mha(x, mask=causal_mask(6))
    for t in range(6):
        (g,) = torch.autograd.grad(out_c[0, t].sum(), x, retain_graph=True)
        assert torch.all(g[0, t + 1:] == 0)


def test_unbatched_input():
    mha = MultiHeadAttention(8, 2).double()
    x = _x(5, 8)
    out, w = mha(x)
    batched, wb = mha(x[None])
    assert out.shape == (5, 8) and w.shape == (2, 5, 5)
    torch.testing.assert_close(out, batched[0])


def test_errors():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(8, 4, num_kv_heads=3)
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query must be \(B, length, 8\).*\(2, 5, 6\)"):
        mha(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 4\)"):
        mha(torch.randn(2, 5, 8), mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(3, 3))


def test_module_trains_on_gpu_like_devices_when_present():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    mha = MultiHeadAttention(8, 2).to(dev)
    x = torch.randn(2, 3, 8, device=dev)
    out, w = mha(x, mask=causal_mask(3, device=dev))
    out.sum().backward()
    assert mha.q_proj.weight.grad is not None and w.device.type == dev


@pytest.mark.parametrize("H, Hkv, T, S", [(8, 2, 1, 50), (8, 8, 3, 7), (6, 1, 4, 9), (32, 8, 1, 64)])
def test_grouped_decode_attention_equals_an_explicit_repeat(H, Hkv, T, S):
    g = torch.Generator().manual_seed(H * 100 + S)
    q = torch.randn(2, H, T, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, Hkv, S, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, Hkv, S, 16, generator=g, dtype=torch.float64)
    G = H // Hkv
    ref, _ = attnbook.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1))
    torch.testing.assert_close(grouped_decode_attention(q, k, v), ref)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, enable_gqa=True), ref)


def test_grouped_decode_attention_refuses_bad_shapes():
    with pytest.raises(ValueError, match="Hkv dividing H"):
        grouped_decode_attention(torch.randn(1, 8, 1, 4), torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4))
    with pytest.raises(ValueError, match="4-d"):
        grouped_decode_attention(torch.randn(8, 1, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))


def test_grouped_decode_attention_wrong_type_is_a_type_error():
    k = v = torch.randn(1, 2, 5, 4)
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor .*got list"):
        grouped_decode_attention([[0.0] * 4], k, v)
    with pytest.raises(TypeError, match="v must be a torch.Tensor"):
        grouped_decode_attention(torch.randn(1, 8, 1, 4), k, None)
    with pytest.raises(TypeError, match="floating-point"):
        grouped_decode_attention(torch.ones(1, 8, 1, 4, dtype=torch.long), k, v)
    with pytest.raises(TypeError, match="share one dtype"):
        grouped_decode_attention(torch.randn(1, 8, 1, 4, dtype=torch.float64), k, v)
    with pytest.raises(ValueError, match=r"k must be a 4-d.*\(2, 5, 4\)"):  # a tensor of the wrong shape stays a ValueError
        grouped_decode_attention(torch.randn(1, 8, 1, 4), k[0], v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grouped_decode_attention_half_precision(dtype):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 8, 1, 16, generator=g), torch.randn(2, 2, 40, 16, generator=g),
               torch.randn(2, 2, 40, 16, generator=g))
    out = grouped_decode_attention(*(t.to(dtype) for t in (q, k, v)))
    ref = grouped_decode_attention(q.double(), k.double(), v.double())
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_weights_path_keeps_the_conventions(dtype):
    # the weights path (need_weights=True) against the float64 module: fully masked rows zero, blocked
    # weights exactly zero, rows summing to one, in every dtype
    mha = MultiHeadAttention(16, 4).double().eval()
    low = MultiHeadAttention(16, 4).to(dtype).eval()
    low.load_state_dict({k_: p.to(dtype) for k_, p in mha.state_dict().items()})
    x = _x(2, 7, 16, seed=11)
    mask = causal_mask(7) & padding_mask([7, 5])  # (B, 1, T, S)
    mask[1, 0, 3] = False  # a query of batch 1 with no key
    out, w = low(x.to(dtype), mask=mask)
    ref_out, ref_w = mha(x, mask=mask)
    assert w.dtype == out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (w[~mask.expand_as(w)] == 0).all() and torch.equal(w[1, :, 3], torch.zeros(4, 7, dtype=dtype))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(w.double(), ref_w, atol=tol, rtol=tol)
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)


def test_an_input_of_another_dtype_or_device_is_named_with_the_modules():
    mha = MultiHeadAttention(8, 2)  # float32 parameters
    x64 = torch.randn(2, 5, 8, dtype=torch.float64)
    # torch alone stops in the matmul ("mat1 and mat2 must have the same dtype"), naming neither input nor module
    with pytest.raises(RuntimeError, match="dtype"):
        F.linear(x64, mha.q_proj.weight)
    with pytest.raises(TypeError, match=r"^query is torch.float64, but MultiHeadAttention's parameters are "
                                        r"torch.float32: cast the input \(query.to\(torch.float32\)\)"):
        mha(x64)
    mem = torch.randn(2, 3, 8, dtype=torch.float16)
    with pytest.raises(TypeError, match=r"^key is torch.float16, value is torch.float16, but"):
        mha(torch.randn(2, 5, 8), mem, mem.clone())
    with pytest.raises(TypeError, match=r"query must be a floating-point tensor \(B, length, 8\), got torch.int64"):
        mha(torch.randint(0, 5, (2, 5, 8)))
    with pytest.raises(ValueError, match=r"^query is on cpu, but MultiHeadAttention's parameters are on meta"):
        MultiHeadAttention(8, 2).to("meta")(torch.randn(2, 5, 8))
    # the advice works: either cast makes the call go through, and the results agree
    out32, _ = mha(x64.float())
    out64, _ = mha.to(torch.float64)(x64)
    assert (out64.float() - out32).abs().max() / out64.abs().max() < 1e-5
