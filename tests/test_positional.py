"""Tests for attnbook.positional.

Dimension legend: B batch, H heads, T query length, S key length, D head dim, E model dim.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnbook import (
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    causal_mask,
    relative_position_bucket,
    rotary_permutation,
    scaled_dot_product_attention,
    shift_matrix,
    sinusoidal_encoding,
)

F64 = torch.float64


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------
# sinusoidal
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("d_model", [8, 7, 1, 16])
def test_sinusoidal_matches_formula(d_model):
    pe = sinusoidal_encoding(50, d_model, dtype=F64)
    assert pe.shape == (50, d_model)
    for pos in (0, 1, 7, 49):
        for col in range(d_model):
            i = col // 2
            angle = pos / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert pe[pos, col].item() == pytest.approx(expected, abs=1e-12), (pos, col)


def test_sinusoidal_odd_last_column_is_sine_and_base():
    pe = sinusoidal_encoding(10, 5, base=100.0, dtype=F64)
    pos = torch.arange(10, dtype=F64)
    torch.testing.assert_close(pe[:, 4], torch.sin(pos / 100.0 ** (4 / 5)))
    assert pe.dtype == F64
    assert sinusoidal_encoding(3, 4).dtype == torch.get_default_dtype()


def test_sinusoidal_errors():
    with pytest.raises(ValueError, match="d_model must be an int >= 1, got 0"):
        sinusoidal_encoding(4, 0)
    with pytest.raises(TypeError, match="max_len must be an int"):
        sinusoidal_encoding(4.0, 8)
    with pytest.raises(ValueError, match="base must be a number > 1"):
        sinusoidal_encoding(4, 8, base=1.0)


@pytest.mark.parametrize("k", [1, 3, 17, -5, 0])
def test_shift_matrix_moves_positions(k):
    d_model = 12
    pe = sinusoidal_encoding(200, d_model, dtype=F64)
    m = shift_matrix(k, d_model, dtype=F64)
    for pos in (5, 20, 63, 150):
        torch.testing.assert_close(pe[pos] @ m, pe[pos + k], atol=1e-10, rtol=0)
    # all positions at once: PE[k:] = PE[:-k] @ M_k (rows are positions)
    lo = max(0, -k)
    hi = 200 - max(0, k)
    torch.testing.assert_close(pe[lo:hi] @ m, pe[lo + k : hi + k], atol=1e-10, rtol=0)


def test_shift_matrix_is_a_rotation_group():
    m3, m4, m7 = (shift_matrix(k, 10, dtype=F64) for k in (3, 4, 7))
    eye = torch.eye(10, dtype=F64)
    torch.testing.assert_close(m3 @ m3.T, eye)
    torch.testing.assert_close(m3 @ m4, m7)
    torch.testing.assert_close(shift_matrix(-3, 10, dtype=F64), m3.T)
    torch.testing.assert_close(shift_matrix(0, 10, dtype=F64), eye)
    # block diagonal: nothing outside the 2x2 blocks
    block = torch.block_diag(*[torch.ones(2, 2, dtype=F64)] * 5)
    assert torch.all(m7[block == 0] == 0)


def test_shift_matrix_rejects_odd_d_model():
    with pytest.raises(ValueError, match="even d_model, got d_model=7"):
        shift_matrix(2, 7)
    with pytest.raises(TypeError, match="k must be an int"):
        shift_matrix(1.5, 8)


def test_sinusoidal_module_adds_table():
    mod = SinusoidalPositionalEncoding(6, max_len=20)
    x = torch.randn(2, 5, 6)
    torch.testing.assert_close(mod(x), x + sinusoidal_encoding(20, 6)[:5])
    torch.testing.assert_close(mod(x, offset=3), x + sinusoidal_encoding(20, 6)[3:8])
    assert "pe" in dict(mod.named_buffers())
    assert "pe" not in mod.state_dict()  # recomputed, not saved
    assert mod.to(F64)(x.double()).dtype == F64
    with pytest.raises(ValueError, match=r"T=5, offset=16\) do not fit in max_len=20"):
        mod(x, offset=16)
    with pytest.raises(ValueError, match=r"x must be \(B, T, 6\) \(batch-first\), got \(5, 6\)"):
        mod(x[0])


def test_sinusoidal_module_dropout():
    mod = SinusoidalPositionalEncoding(8, max_len=16, dropout=0.5)
    x = torch.zeros(4, 16, 8)
    mod.train()
    assert (mod(x) == 0).float().mean() > 0.3  # dropout zeroes about half the entries
    mod.eval()
    torch.testing.assert_close(mod(x), sinusoidal_encoding(16, 8)[None].expand(4, -1, -1))
    with pytest.raises(ValueError, match="dropout must be in"):
        SinusoidalPositionalEncoding(8, dropout=1.0)


def test_learned_embedding():
    mod = LearnedPositionalEmbedding(6, max_len=10)
    x = torch.randn(3, 4, 6)
    torch.testing.assert_close(mod(x), x + mod.embedding.weight[:4])
    torch.testing.assert_close(mod(x, offset=6), x + mod.embedding.weight[6:10])
    assert mod.embedding.weight.std() < 0.1
    out = mod(x).sum()
    out.backward()
    assert mod.embedding.weight.grad[:4].abs().sum() > 0
    assert mod.embedding.weight.grad[4:].abs().sum() == 0


def test_learned_embedding_too_long():
    mod = LearnedPositionalEmbedding(6, max_len=10)
    with pytest.raises(ValueError, match=r"T=11.*max_len=10"):
        mod(torch.randn(1, 11, 6))
    with pytest.raises(ValueError, match=r"T=4, offset=7.*max_len=10"):
        mod(torch.randn(1, 4, 6), offset=7)


# ---------------------------------------------------------------------------
# attention is permutation equivariant without positions
# ---------------------------------------------------------------------------


def test_permutation_equivariance_and_pe_breaks_it():
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    with torch.no_grad():
        out, weights = mha(x)
        out_p, weights_p = mha(x[:, perm])
        torch.testing.assert_close(out_p, out[:, perm], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights_p, weights[:, :, perm][:, :, :, perm], atol=1e-5, rtol=1e-5)

        pe = SinusoidalPositionalEncoding(16, max_len=7)
        out_pe, _ = mha(pe(x))
        out_pe_p, _ = mha(pe(x[:, perm]))
        assert (out_pe_p - out_pe[:, perm]).abs().max() > 1e-2


# ---------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_preserves_norms(interleaved):
    x = torch.randn(2, 3, 11, 8, dtype=F64)
    y = apply_rotary(x, interleaved=interleaved)
    assert y.shape == x.shape
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    # also pair by pair
    if interleaved:
        pairs_x, pairs_y = x.unflatten(-1, (4, 2)), y.unflatten(-1, (4, 2))
    else:
        pairs_x, pairs_y = x.unflatten(-1, (2, 4)).transpose(-1, -2), y.unflatten(-1, (2, 4)).transpose(-1, -2)
    torch.testing.assert_close(pairs_y.norm(dim=-1), pairs_x.norm(dim=-1))
    # position 0 is the identity
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_scores_depend_only_on_relative_position(interleaved):
    D = 16
    q, k = torch.randn(2, D, dtype=F64)

    def rot(v, pos):
        return apply_rotary(v[None], torch.tensor([pos]), interleaved=interleaved)[0]

    g = torch.Generator().manual_seed(1)
    pairs = torch.randint(0, 500, (40, 2), generator=g).tolist()
    for m, n in pairs:
        score = rot(q, m) @ rot(k, n)
        reference = rot(q, m - n) @ k  # same offset, key at position 0
        assert score.item() == pytest.approx(reference.item(), abs=1e-9), (m, n)
    # and positions do matter: scores change with the offset
    assert abs((rot(q, 5) @ k - rot(q, 0) @ k).item()) > 1e-3


def test_rope_matches_hand_rotation():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=F64).expand(3, 4)  # (T, D)
    pos = torch.arange(3, dtype=F64)
    th0, th1 = pos * 1.0, pos / 100.0  # base^(-2i/D) with D=4: 1, 1/100
    c0, s0, c1, s1 = th0.cos(), th0.sin(), th1.cos(), th1.sin()
    inter = torch.stack([1 * c0 - 2 * s0, 1 * s0 + 2 * c0, 3 * c1 - 4 * s1, 3 * s1 + 4 * c1], dim=-1)
    half = torch.stack([1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 1 * s0 + 3 * c0, 2 * s1 + 4 * c1], dim=-1)
    torch.testing.assert_close(apply_rotary(x, interleaved=True, base=10000.0), inter)
    torch.testing.assert_close(apply_rotary(x, interleaved=False), half)


def test_rope_interleaved_vs_half_split_same_scores():
    B, H, T, D = 2, 3, 9, 12
    q = torch.randn(B, H, T, D, dtype=F64)
    k = torch.randn(B, H, T, D, dtype=F64)
    perm = rotary_permutation(D)
    scores_inter = apply_rotary(q, interleaved=True) @ apply_rotary(k, interleaved=True).transpose(-2, -1)
    scores_half = apply_rotary(q[..., perm]) @ apply_rotary(k[..., perm]).transpose(-2, -1)
    torch.testing.assert_close(scores_half, scores_inter)
    # the rotated vectors themselves are permutations of each other
    torch.testing.assert_close(apply_rotary(q, interleaved=True)[..., perm], apply_rotary(q[..., perm]))
    inv = rotary_permutation(D, inverse=True)
    torch.testing.assert_close(apply_rotary(q[..., inv], interleaved=True), apply_rotary(q)[..., inv])
    assert perm[inv].tolist() == list(range(D))
    assert perm.tolist() == [0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_positions_offset_equals_slice(interleaved):
    x = torch.randn(2, 4, 20, 8)
    full = apply_rotary(x, interleaved=interleaved)
    new = x[:, :, 13:]
    torch.testing.assert_close(apply_rotary(new, 13 + torch.arange(7), interleaved=interleaved), full[:, :, 13:])
    # per-sequence positions (B, 1, T) broadcast over heads
    pos = torch.stack([torch.arange(3, 10), torch.arange(11, 18)])[:, None, :]  # (B, 1, T)
    windows = torch.stack([x[0, :, 3:10], x[1, :, 11:18]])  # (B, H, 7, D)
    got = apply_rotary(windows, pos, interleaved=interleaved)
    torch.testing.assert_close(got[0], full[0, :, 3:10])
    torch.testing.assert_close(got[1], full[1, :, 11:18])


def test_rope_low_precision_and_base():
    x = torch.randn(1, 2, 6, 8)
    y = apply_rotary(x.to(torch.bfloat16), base=500000.0)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), apply_rotary(x, base=500000.0), atol=3e-2, rtol=3e-2)
    assert not torch.allclose(apply_rotary(x, base=500000.0), apply_rotary(x))


def test_rope_rotated_attention_is_translation_invariant():
    # whole attention with RoPE on q and k: shifting every position by 100 changes nothing
    q, k, v = torch.randn(3, 1, 2, 6, 8, dtype=F64)
    mask = causal_mask(6)
    out0, w0 = scaled_dot_product_attention(apply_rotary(q), apply_rotary(k), v, mask)
    pos = 100 + torch.arange(6)
    out1, w1 = scaled_dot_product_attention(apply_rotary(q, pos), apply_rotary(k, pos), v, mask)
    torch.testing.assert_close(w1, w0)
    torch.testing.assert_close(out1, out0)


def test_rope_errors():
    with pytest.raises(ValueError, match=r"D must be even; got D=7 \(x is \(2, 5, 7\)\)"):
        apply_rotary(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"positions of shape \(4,\) must be \(T,\) = \(5,\)"):
        apply_rotary(torch.randn(2, 5, 8), torch.arange(4))
    with pytest.raises(TypeError, match="floating-point"):
        apply_rotary(torch.ones(2, 5, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="positions must be ints"):
        apply_rotary(torch.randn(5, 8), torch.ones(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="D must be even; got D=5"):
        rotary_permutation(5)


# ---------------------------------------------------------------------------
# ALiBi
# ---------------------------------------------------------------------------


def test_alibi_slopes_power_of_two():
    expected = torch.tensor([2.0**-i for i in range(1, 9)])
    torch.testing.assert_close(alibi_slopes(8), expected, rtol=0, atol=0)
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]), rtol=0, atol=0)
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([2.0**-8]))


def _paper_slopes(h: int) -> list[float]:
    # independent derivation: the power-of-two sequence is a geometric series whose first term
    # and ratio are both 2^(-8/n); the extra heads interpolate, taking every other term of 2n.
    def geometric(n):
        r = 2 ** (-8 / n)
        return [r ** (i + 1) for i in range(n)]

    n = 1
    while n * 2 <= h:
        n *= 2
    return geometric(n) + geometric(2 * n)[::2][: h - n]


def test_alibi_slopes_not_power_of_two():
    # 6 heads: 4 from n=4 (2^-2, 2^-4, 2^-6, 2^-8), then the odd-exponent ones of n=8: 2^-1, 2^-3
    expected6 = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    torch.testing.assert_close(alibi_slopes(6, dtype=F64), torch.tensor(expected6, dtype=F64))
    assert _paper_slopes(6) == pytest.approx(expected6)
    # 12 heads: 2^-1 .. 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    expected12 = [2.0**-i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12, dtype=F64), torch.tensor(expected12, dtype=F64))
    for h in (3, 5, 6, 7, 12, 20, 24):
        torch.testing.assert_close(alibi_slopes(h, dtype=F64), torch.tensor(_paper_slopes(h), dtype=F64))
        assert len(set(alibi_slopes(h).tolist())) == h  # every head gets its own slope


def test_alibi_bias_values():
    bias = alibi_bias(8, 4)
    assert bias.shape == (8, 4, 4)
    slopes = alibi_slopes(8)
    for h in (0, 3, 7):
        for i in range(4):
            for j in range(4):
                if j <= i:
                    assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j))
                else:
                    assert bias[h, i, j].item() == torch.finfo(torch.float32).min
    assert not torch.signbit(bias[:, range(4), range(4)]).any()  # 0.0, not -0.0


def test_alibi_bias_kv_cache_alignment_and_noncausal():
    full = alibi_bias(4, 10)
    torch.testing.assert_close(alibi_bias(4, 3, 10), full[:, 7:])  # the last 3 queries of 10
    sym = alibi_bias(4, 5, causal=False)
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    torch.testing.assert_close(sym, -alibi_slopes(4)[:, None, None] * (i - j).abs().float())
    torch.testing.assert_close(sym, sym.transpose(-1, -2))
    assert alibi_bias(2, 3, 4, dtype=torch.float16).min() == torch.finfo(torch.float16).min
    with pytest.raises(ValueError, match="needs S >= T"):
        alibi_bias(4, 5, 3)
    assert alibi_bias(4, 5, 3, causal=False).shape == (4, 5, 3)


def test_alibi_bias_as_float_mask_matches_pytorch_and_reference():
    B, H, T, D = 2, 4, 6, 8
    q, k, v = torch.randn(3, B, H, T, D, dtype=F64)
    bias = alibi_bias(H, T, dtype=F64)  # (H, T, S) broadcasts with (B, H, T, S)
    out, weights = scaled_dot_product_attention(q, k, v, bias)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    # reference: causal bool mask plus the plain linear penalty
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    penalty = -alibi_slopes(H, dtype=F64)[:, None, None] * (i - j).to(F64)  # (H, T, S)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D) + penalty
    ref_w = scores.masked_fill(~causal_mask(T), float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, ref_w)
    torch.testing.assert_close(out, ref_w @ v)
    # through the module, too
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, T, 16)
    with torch.no_grad():
        out_m, w_m = mha(x, mask=alibi_bias(4, T))
    assert w_m.shape == (2, 4, T, T)
    assert torch.all(w_m.triu(1) == 0)


# ---------------------------------------------------------------------------
# T5 relative position bias
# ---------------------------------------------------------------------------


def test_relative_bucket_known_values():
    rel = torch.tensor([0, -1, -7, -8, -16, -127, -128, -1000, 1, 8, 1000])
    got = relative_position_bucket(rel)  # bidirectional, 32 buckets, max_distance 128
    # half = 16 buckets per direction, 8 exact, then 8 + floor(8 * log(d/8) / log(16))
    assert got.tolist() == [0, 1, 7, 8, 10, 15, 15, 15, 17, 24, 31]
    assert got.dtype == torch.int64


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_bucket_monotone_in_distance(bidirectional):
    d = torch.arange(0, 400)
    before = relative_position_bucket(-d, bidirectional=bidirectional)  # keys before the query
    assert torch.all(before[1:] >= before[:-1])
    assert before[0] == 0
    assert before.max() == (15 if bidirectional else 31)
    # the first half of each direction is exact
    exact = 8 if bidirectional else 16
    assert before[:exact].tolist() == list(range(exact))
    if bidirectional:
        after = relative_position_bucket(d)
        assert torch.all(after[1:] >= after[:-1])
        # +d and -d never share a bucket (except d = 0)
        assert torch.all(after[1:] != before[1:])
        assert set(after[1:].tolist()).isdisjoint(before.tolist())
    else:
        assert torch.all(relative_position_bucket(d, bidirectional=False) == 0)  # future keys all in bucket 0


def test_relative_bucket_errors():
    with pytest.raises(TypeError, match="integer tensor"):
        relative_position_bucket(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="even num_buckets"):
        relative_position_bucket(torch.tensor([1]), num_buckets=31)
    with pytest.raises(ValueError, match="max_distance=4 must exceed"):
        relative_position_bucket(torch.tensor([1]), num_buckets=32, max_distance=4)


def test_relative_position_bias_module():
    H, T, S = 4, 5, 9
    rpb = RelativePositionBias(H)
    bias = rpb(T, S)
    assert bias.shape == (1, H, T, S)
    table = rpb.embedding.weight  # (num_buckets, H)
    q_pos = torch.arange(T) + S - T
    for i in range(T):
        for j in range(S):
            bucket = relative_position_bucket(torch.tensor(j - q_pos[i].item())).item()
            torch.testing.assert_close(bias[0, :, i, j], table[bucket])
    # Toeplitz: depends on j - i only
    square = rpb(T)[0]
    torch.testing.assert_close(square[:, 1:, 1:], square[:, :-1, :-1])
    torch.testing.assert_close(rpb(3, 9), rpb(9)[:, :, 6:])  # queries are the last T positions


def test_relative_position_bias_as_float_mask_and_trainable():
    H, T, D = 3, 6, 4
    rpb = RelativePositionBias(H, num_buckets=8, max_distance=16, bidirectional=False)
    q, k, v = torch.randn(3, 2, H, T, D)
    bias = rpb(T)
    out, _ = scaled_dot_product_attention(q, k, v, bias)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias), atol=1e-6, rtol=1e-5)
    out.sum().backward()
    assert rpb.embedding.weight.grad.abs().sum() > 0
    mha = MultiHeadAttention(12, H)
    out_m, w_m = mha(torch.randn(2, T, 12), mask=rpb(T))
    assert out_m.shape == (2, T, 12) and w_m.shape == (2, H, T, T)


def test_learned_positions_show_their_table_as_weight_like_an_embedding():
    """The toy models and MiniLM use LearnedPositionalEmbedding where they had an nn.Embedding: code that
    read ``.weight`` (chapter 10 prints its shape) still does."""
    learned = LearnedPositionalEmbedding(8, max_len=12)
    assert learned.weight is learned.embedding.weight and learned.weight.shape == (12, 8)
    assert [name for name, _ in learned.named_parameters()] == ["embedding.weight"]  # no second copy
