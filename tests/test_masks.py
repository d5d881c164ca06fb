"""Tests for attnbook.masks.

Dimension legend: B batch, H heads, T query length, S key length, D head dim, E model dim.
Bool masks: True = may attend.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook import (
    MultiHeadAttention,
    causal_mask,
    masks,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from attnbook.masks import (
    combine_masks,
    from_additive,
    from_blocked,
    from_key_padding_mask,
    lengths_from_mask,
    to_additive,
    to_blocked,
)

F64 = torch.float64


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------
# causal
# ---------------------------------------------------------------------------


def test_causal_mask_small():
    m = causal_mask(3)
    assert m.dtype == torch.bool and m.shape == (3, 3)
    assert m.tolist() == [[True, False, False], [True, True, False], [True, True, True]]


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 9), S=st.integers(1, 9), offset=st.integers(-3, 9))
def test_causal_mask_matches_definition(T, S, offset):
    m = causal_mask(T, S, offset=offset)
    assert m.shape == (T, S)
    expected = [[j <= i + offset for j in range(S)] for i in range(T)]
    assert m.tolist() == expected


def test_causal_mask_kv_cache_offset_is_the_last_rows():
    full = causal_mask(10)
    assert torch.equal(causal_mask(3, 10, offset=7), full[7:])
    assert torch.equal(causal_mask(1, 10, offset=9), torch.ones(1, 10, dtype=torch.bool))


def test_causal_mask_same_as_pytorch_is_causal():
    q, k, v = torch.randn(3, 2, 2, 5, 4)
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(5))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_causal_mask_errors():
    with pytest.raises(ValueError, match="T must be an int >= 1, got 0"):
        causal_mask(0)
    with pytest.raises(TypeError, match="S must be an int, got float"):
        causal_mask(3, 4.0)
    with pytest.raises(TypeError, match="T must be an int, got bool"):
        causal_mask(True)


# ---------------------------------------------------------------------------
# padding
# ---------------------------------------------------------------------------


def test_padding_mask_from_lengths():
    m = padding_mask([3, 1, 0])
    assert m.shape == (3, 1, 1, 3) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, True], [True, False, False], [False, False, False]]
    m = padding_mask(torch.tensor([2, 4]), max_len=6)
    assert m.shape == (2, 1, 1, 6)
    assert m[:, 0, 0].sum(-1).tolist() == [2, 4]
    assert torch.equal(lengths_from_mask(m), torch.tensor([2, 4]))
    assert torch.equal(lengths_from_mask(m[:, 0, 0]), torch.tensor([2, 4]))


def test_padding_mask_broadcasts_over_heads_and_queries():
    B, H, T, S = 2, 3, 4, 5
    m = padding_mask([5, 2])
    scores = torch.zeros(B, H, T, S)
    assert torch.broadcast_shapes(m.shape, scores.shape) == scores.shape
    _, w = scaled_dot_product_attention(torch.randn(B, H, T, 8), torch.randn(B, H, S, 8), torch.randn(B, H, S, 8), m)
    assert torch.all(w[1, :, :, 2:] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))


def test_padding_mask_errors():
    with pytest.raises(ValueError, match=r"lengths must be >= 0, got \[2, -1\]"):
        padding_mask([2, -1])
    with pytest.raises(ValueError, match="max_len=3 is shorter than the longest length 5"):
        padding_mask([5, 2], max_len=3)
    with pytest.raises(TypeError, match="lengths must be a 1-D sequence of ints.*torch.float32"):
        padding_mask([2.0, 3.0])
    with pytest.raises(TypeError, match="lengths must be a 1-D sequence of ints.*torch.bool"):
        padding_mask([True, False])
    with pytest.raises(TypeError, match=r"got shape \(2, 1\)"):
        padding_mask(torch.tensor([[2], [3]]))


def test_fully_padded_sequence_gives_zeros_not_nan():
    q, k, v = torch.randn(3, 2, 1, 3, 4)
    out, w = scaled_dot_product_attention(q, k, v, padding_mask([3, 0]))
    assert torch.isfinite(out).all()
    assert torch.all(out[1] == 0) and torch.all(w[1] == 0)


# ---------------------------------------------------------------------------
# sliding window
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("T", "S", "window"), [(6, 6, 2), (4, 7, 1), (5, 5, 0), (3, 3, 10)])
def test_sliding_window_matches_definition(T, S, window, causal):
    m = sliding_window_mask(T, window, S, causal=causal)
    assert m.shape == (T, S)
    for i in range(T):
        for j in range(S):
            allowed = 0 <= i - j <= window if causal else abs(i - j) <= window
            assert m[i, j].item() == allowed, (i, j)


def test_sliding_window_relations():
    T = 8
    # causal window = causal mask AND band
    assert torch.equal(sliding_window_mask(T, 3, causal=True), combine_masks(causal_mask(T), sliding_window_mask(T, 3)))
    # a window as wide as the sequence is the causal mask / no mask at all
    assert torch.equal(sliding_window_mask(T, T, causal=True), causal_mask(T))
    assert sliding_window_mask(T, T).all()
    # window 0: only the diagonal
    assert torch.equal(sliding_window_mask(T, 0), torch.eye(T, dtype=torch.bool))
    # every query keeps at least itself, so no row is empty
    assert sliding_window_mask(T, 2, causal=True).any(-1).all()


def test_sliding_window_errors():
    with pytest.raises(ValueError, match="window must be an int >= 0, got -1"):
        sliding_window_mask(4, -1)
    with pytest.raises(TypeError, match="window must be an int, got float 1.5"):
        sliding_window_mask(4, 1.5)


# ---------------------------------------------------------------------------
# combine and conversions
# ---------------------------------------------------------------------------


def test_combine_masks():
    c = causal_mask(4)
    p = padding_mask([4, 2])
    m = combine_masks(c, None, p)
    assert m.shape == (2, 1, 4, 4)
    assert torch.equal(m, c & p)
    assert combine_masks(None, None) is None
    assert combine_masks(c) is c
    with pytest.raises(TypeError, match="combine_masks takes bool masks, got torch.float32"):
        combine_masks(c, c.float())


def test_blocked_round_trip():
    m = torch.rand(3, 4, 5) > 0.5
    assert torch.equal(from_blocked(to_blocked(m)), m)
    assert torch.equal(to_blocked(m), ~m)
    with pytest.raises(TypeError, match="expected a bool mask, got torch.int64"):
        to_blocked(m.long())
    with pytest.raises(TypeError, match="expected a bool mask"):
        from_blocked(m.float())


def test_key_padding_mask_matches_padding_mask():
    lengths = torch.tensor([5, 2, 3])
    kpm = torch.arange(5)[None, :] >= lengths[:, None]  # (B, S), True = padding, as nn.MultiheadAttention
    ours = from_key_padding_mask(kpm)
    assert ours.shape == (3, 1, 1, 5)
    assert torch.equal(ours, padding_mask(lengths))
    assert torch.equal(lengths_from_mask(ours), lengths)
    with pytest.raises(TypeError, match=r"key_padding_mask must be bool \(B, S\), got torch.bool \(3, 1, 5\)"):
        from_key_padding_mask(kpm[:, None])
    with pytest.raises(TypeError, match="torch.int64"):
        from_key_padding_mask(kpm.long())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, F64])
def test_additive_round_trip(dtype):
    m = torch.rand(2, 1, 4, 6) > 0.4
    add = to_additive(m, dtype)
    assert add.dtype == dtype and add.shape == m.shape
    assert torch.all(add[m] == 0)
    assert torch.all(add[~m] == torch.finfo(dtype).min)
    assert torch.isfinite(add).all()
    assert torch.equal(from_additive(add), m)
    add[0, 0, 0, 0] = 7.0  # the result is a fresh tensor, writable per element
    assert add[0, 0, 0, 1].item() in (0.0, torch.finfo(dtype).min)


def test_from_additive_blocking_values():
    x = torch.tensor([0.0, -1.0, -1e4, -1e9, float("-inf"), torch.finfo(torch.float32).min, -3e38, 2.5])
    # only values at most finfo.min / 2 (about -1.7e38 in float32) count as blocked: a classic
    # -1e4 or -1e9 additive mask reads as "may attend" (with a small penalty)
    assert from_additive(x).tolist() == [True, True, True, True, False, False, False, True]
    with pytest.raises(TypeError, match="expected a float mask, got torch.bool"):
        from_additive(x > 0)
    with pytest.raises(TypeError, match="expected a bool mask, got torch.float32"):
        to_additive(x)


def test_lengths_from_mask_errors():
    with pytest.raises(TypeError, match="expected a bool mask"):
        lengths_from_mask(torch.ones(2, 3))


# ---------------------------------------------------------------------------
# one mask, four ways of applying it
# ---------------------------------------------------------------------------


def _mixed_mask(B, T, S):
    """Causal (queries are the last T of S keys) AND key padding; no empty rows."""
    return combine_masks(causal_mask(T, S, offset=S - T), padding_mask([S, S - 1], max_len=S)[:B])


def test_bool_mask_equals_pytorch_and_additive():
    B, H, T, S, D = 2, 3, 4, 6, 8
    q = torch.randn(B, H, T, D, dtype=F64)
    k, v = torch.randn(2, B, H, S, D, dtype=F64)
    mask = _mixed_mask(B, T, S)  # (B, 1, T, S)
    assert mask.any(-1).all()
    out, w = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    out_add, w_add = scaled_dot_product_attention(q, k, v, to_additive(mask, F64))
    torch.testing.assert_close(out_add, out)
    torch.testing.assert_close(w_add, w)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=to_additive(mask, F64)), out)
    assert torch.all(w[~mask.expand_as(w)] == 0)


def test_bool_mask_equals_nn_multihead_attention():
    B, H, T, E = 2, 4, 5, 16
    torch_mha = nn.MultiheadAttention(E, H, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(torch_mha).eval()
    x = torch.randn(B, T, E)
    causal = causal_mask(T)  # (T, S)
    lengths = torch.tensor([5, 3])
    kpm = torch.arange(T)[None, :] >= lengths[:, None]  # (B, S), True = padding
    with torch.no_grad():
        ref_out, ref_w = torch_mha(
            x, x, x, attn_mask=to_blocked(causal), key_padding_mask=kpm, average_attn_weights=False
        )
        out, w = ours(x, mask=combine_masks(causal, from_key_padding_mask(kpm)))
        out2, w2 = ours(x, mask=combine_masks(causal, padding_mask(lengths)))
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(w2, w)


# ---------------------------------------------------------------------------
# why finfo(dtype).min and not -1e9
# ---------------------------------------------------------------------------


def test_float16_literal_minus_1e9_overflows_but_finfo_min_does_not():
    # -1e9 does not fit in float16 (max magnitude 65504): it becomes -inf ...
    assert torch.tensor(-1e9).to(torch.float16).item() == float("-inf")
    assert torch.isinf(torch.full((2,), -1e9).half()).all()
    # ... and a row of -inf scores makes a plain softmax produce NaN
    literal = torch.zeros(3, 4, dtype=torch.float16)
    literal[1] = -1e9  # query 1 may attend nothing
    assert torch.isnan(torch.softmax(literal.float(), dim=-1)[1]).all()
    # to_additive stores the largest finite negative float16 instead, and softmax stays finite
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    mask[2, 2:] = False
    add = to_additive(mask, torch.float16)
    assert add.min().item() == -65504.0
    assert torch.isfinite(add).all()
    q = torch.randn(1, 2, 3, 8, dtype=torch.float16)  # (B, H, T, D)
    k, v = torch.randn(2, 1, 2, 4, 8, dtype=torch.float16)  # (B, H, S, D)
    scores = (q.float() @ k.float().transpose(-1, -2)).to(torch.float16) / 8**0.5 + add
    assert not torch.isnan(torch.softmax(scores.float(), dim=-1)).any()
    out, w = scaled_dot_product_attention(q, k, v, add)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    torch.testing.assert_close(w[..., 2, 2:], torch.zeros(1, 2, 2, dtype=torch.float16))
    # the allowed rows agree with the bool mask
    out_b, w_b = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out[..., [0, 2], :], out_b[..., [0, 2], :])


def test_fully_blocked_row_same_for_bool_and_additive():
    q, k, v = torch.randn(3, 1, 3, 4)
    mask = causal_mask(3)
    mask[1] = False
    _, w_bool = scaled_dot_product_attention(q, k, v, mask)
    _, w_add = scaled_dot_product_attention(q, k, v, to_additive(mask))
    torch.testing.assert_close(w_add, w_bool)


def test_left_padding_and_key_padding_round_trip():
    m = padding_mask([2, 4], left=True)
    assert m.shape == (2, 1, 1, 4)
    assert m[0, 0, 0].tolist() == [False, False, True, True] and m[1, 0, 0].all()
    right = padding_mask([2, 4])
    kpm = masks.to_key_padding_mask(right)
    assert kpm.tolist() == [[False, False, True, True], [False, False, False, False]]
    assert torch.equal(masks.from_key_padding_mask(kpm), right)
    with pytest.raises(ValueError, match=r"\(2, 1, 3, 4\)"):
        masks.to_key_padding_mask(torch.ones(2, 1, 3, 4, dtype=torch.bool))
