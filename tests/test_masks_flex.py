"""attnbook.masks' FlexAttention programs: every mask_mod evaluated densely equals the package's mask (and
torch's own ``create_mask`` evaluation, and Hugging Face's mask functions), every program run through
``flex_attention`` eagerly on the CPU equals ``attnbook.scaled_dot_product_attention`` with the equivalent
dense mask or bias (fully masked rows included: zeros in both), the block tiles read from
``create_block_mask`` equal a tile-by-tile count of the dense mask, bad input raises the documented errors,
and only torch's "unfused" warning is silenced.

Dimension legend: B batch, H heads, T query length, S key length, D head dim, Bq, Bk tile side.
Eager FlexAttention traces each new program with TorchDynamo (about 0.2 s a program here): the sizes stay
small (T <= 128, tiles of 16 or 32).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from attnbook import (
    RelativePositionBias,
    alibi_bias,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from attnbook.core import masked_softmax
from attnbook.masks import (
    FLEX_BLOCK_SIZE,
    TILE_KINDS,
    alibi_score_mod,
    apply_score_mod,
    block_mask_stats,
    block_tiles,
    causal_mask_mod,
    check_mask_mod,
    combine_mask_mods,
    dense_mask,
    document_ids,
    document_mask,
    document_mask_mod,
    eager_flex_attention,
    flex_available,
    make_block_mask,
    padding_mask_mod,
    prefix_lm_mask,
    prefix_lm_mask_mod,
    relative_position_score_mod,
    silence_unfused_warning,
    sliding_window_mask_mod,
    soft_cap_score_mod,
    union_mask_mods,
)
from tests.helpers import qkv

F32 = torch.float32
TOL = 1e-5  # float32, flex (eager) against attnbook's dense path
needs_flex = pytest.mark.skipif(
    not flex_available(),
    reason="FlexAttention needs torch >= 2.5 (torch.nn.attention.flex_attention) with TorchDynamo support")


def _flex_reference(mask_mod, B, H, T, S):
    """torch's own dense evaluation of a mask_mod (``create_mask``: torch.vmap over scalar indices)."""
    from torch.nn.attention.flex_attention import create_mask

    return create_mask(mask_mod, B, H, T, S, device="cpu")


# ----------------------------------------------------------------------------- dense evaluation


@pytest.mark.parametrize("T, S", [(12, 12), (8, 13), (13, 8)])
def test_causal_programs_are_causal_mask(T, S):
    top = dense_mask(causal_mask_mod(T, S, offset=0), 2, 3, T, S)
    assert torch.equal(top, causal_mask(T, S).expand(2, 3, T, S))
    bottom = dense_mask(causal_mask_mod(T, S), 1, 1, T, S)[0, 0]  # the default: queries are the last T
    assert torch.equal(bottom, causal_mask(T, S, offset=S - T))
    assert bottom[-1].all() and bottom[0].any() == (T <= S)  # more queries than keys: the first see none


@pytest.mark.parametrize("window", [0, 1, 3, 20])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T, S", [(10, 10), (7, 12), (12, 7)])
def test_sliding_window_program_is_sliding_window_mask(window, causal, T, S):
    got = dense_mask(sliding_window_mask_mod(window, T, S, causal=causal, offset=0), 1, 2, T, S)
    assert torch.equal(got, sliding_window_mask(T, window, S, causal=causal).expand(1, 2, T, S))
    got = dense_mask(sliding_window_mask_mod(window, T, S, causal=causal), 1, 2, T, S)  # the last T positions
    assert torch.equal(got, sliding_window_mask(T, window, S, causal=causal, offset=S - T).expand(1, 2, T, S))
    if T == S:
        assert torch.equal(dense_mask(sliding_window_mask_mod(window, causal=causal), 1, 2, T), got)


@pytest.mark.parametrize("left", [False, True])
def test_padding_program_is_padding_mask(left):
    lengths = [5, 0, 9, 3]
    got = dense_mask(padding_mask_mod(lengths, 9, left=left), 4, 2, 6, 9)
    assert torch.equal(got, padding_mask(lengths, 9, left=left).expand(4, 2, 6, 9))
    assert torch.equal(dense_mask(padding_mask_mod(torch.tensor(lengths)), 4, 1, 3, 9),
                       padding_mask(lengths).expand(4, 1, 3, 9))  # max_len defaults to the longest


def test_document_program_is_block_diagonal_causal():
    lengths = [3, 1, 4, 2]
    ids = document_ids(lengths)
    assert ids.tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 3, 3]
    expected = torch.block_diag(*[causal_mask(n) for n in lengths])  # (T, T)
    assert torch.equal(document_mask(ids), expected)
    assert torch.equal(dense_mask(document_mask_mod(ids), 2, 1, 10)[1, 0], expected)
    bidirectional = torch.block_diag(*[torch.ones(n, n, dtype=torch.bool) for n in lengths])
    assert torch.equal(dense_mask(document_mask_mod(ids, causal=False), 1, 1, 10)[0, 0], bidirectional)
    assert torch.equal(document_mask(ids, causal=False), bidirectional)
    # one row of ids per batch element
    ids2 = torch.stack([ids, document_ids([5, 5])])  # (B, T)
    got = dense_mask(document_mask_mod(ids2), 2, 1, 10)
    assert torch.equal(got[0, 0], expected)
    assert torch.equal(got[1, 0], torch.block_diag(causal_mask(5), causal_mask(5)))
    assert torch.equal(document_mask(ids2), got)


@pytest.mark.parametrize("prefix_len", [0, 1, 4, 9])
def test_prefix_lm_program(prefix_len):
    T = 9
    expected = torch.tensor([[j <= i or j < prefix_len for j in range(T)] for i in range(T)])
    assert torch.equal(prefix_lm_mask(T, prefix_len), expected)
    assert torch.equal(dense_mask(prefix_lm_mask_mod(prefix_len), 1, 1, T)[0, 0], expected)
    assert torch.equal(prefix_lm_mask(T, 0), causal_mask(T))
    assert prefix_lm_mask(T, T).all()


def test_combined_programs_are_the_and_of_the_masks():
    mod = combine_mask_mods(causal_mask_mod(8), padding_mask_mod([5, 8], 8))
    expected = causal_mask(8) & padding_mask([5, 8], 8)  # (B, 1, T, S)
    assert torch.equal(dense_mask(mod, 2, 1, 8), expected)
    assert "causal" in mod.__name__ and "padding" in mod.__name__


@needs_flex
@pytest.mark.parametrize("mod", [
    causal_mask_mod(11, 17), causal_mask_mod(11, 17, offset=0), sliding_window_mask_mod(3, 11, 17, causal=True),
    padding_mask_mod([4, 17], 17, left=True), prefix_lm_mask_mod(5, 11, 17),
    document_mask_mod(document_ids([6, 4, 7]), 11),
    combine_mask_mods(causal_mask_mod(11, 17), padding_mask_mod([9, 2], 17)),
    union_mask_mods(sliding_window_mask_mod(2, 11, 17, causal=True), padding_mask_mod([1, 1], 17)),
], ids=lambda m: m.__name__)
def test_dense_mask_is_torchs_create_mask(mod):
    """The broadcasting evaluation gives what torch's vmap over scalar indices gives."""
    assert torch.equal(dense_mask(mod, 2, 1, 11, 17), _flex_reference(mod, 2, 1, 11, 17))


@needs_flex
def test_document_dense_mask_is_torchs_create_mask():
    ids = torch.stack([document_ids([3, 5, 4]), document_ids([6, 6])])
    for mod in (document_mask_mod(ids), document_mask_mod(ids[0], causal=False)):
        assert torch.equal(dense_mask(mod, 2, 1, 12), _flex_reference(mod, 2, 1, 12, 12))


def test_programs_equal_hugging_face_mask_functions():
    mu = pytest.importorskip("transformers.masking_utils", reason="transformers (test-only) has the reference "
                                                                  "mask functions")
    T = 12
    assert torch.equal(dense_mask(mu.causal_mask_function, 1, 1, T), dense_mask(causal_mask_mod(T), 1, 1, T))
    for window in (1, 4):
        # Hugging Face's causal sliding_window W keeps W keys (the query's own included): attnbook's window W - 1
        assert torch.equal(dense_mask(mu.sliding_window_causal_mask_function(window + 1), 1, 1, T),
                           dense_mask(sliding_window_mask_mod(window, causal=True), 1, 1, T))
        assert torch.equal(dense_mask(mu.sliding_window_bidirectional_mask_function(window), 1, 1, T),
                           dense_mask(sliding_window_mask_mod(window), 1, 1, T))
    ids = torch.stack([document_ids([4, 4, 4]), document_ids([7, 5])])  # (B, T)
    hf = mu.and_masks(mu.packed_sequence_mask_function(ids), mu.causal_mask_function)
    assert torch.equal(dense_mask(hf, 2, 1, T), dense_mask(document_mask_mod(ids), 2, 1, T))
    real = padding_mask([9, 12], T)[:, 0, 0, :]  # (B, S)
    assert torch.equal(dense_mask(mu.padding_mask_function(real), 2, 1, T),
                       dense_mask(padding_mask_mod([9, 12], T), 2, 1, T))


# ----------------------------------------------------------------------------- score programs, densely


@pytest.mark.parametrize("num_heads", [1, 4, 6])
@pytest.mark.parametrize("T, S", [(9, 9), (5, 12)])
def test_alibi_program_is_alibi_bias(num_heads, T, S):
    bias = apply_score_mod(alibi_score_mod(num_heads, T, S), torch.zeros(1, num_heads, T, S))  # (1, H, T, S)
    torch.testing.assert_close(bias[0], alibi_bias(num_heads, T, S, causal=False), rtol=0, atol=1e-6)
    causal = dense_mask(causal_mask_mod(T, S), 1, 1, T, S)[0, 0]
    reference = alibi_bias(num_heads, T, S)  # causal: blocked keys hold finfo.min
    assert torch.equal(reference > torch.finfo(F32).min / 2, causal.expand(num_heads, T, S))
    torch.testing.assert_close(bias[0][:, causal], reference[:, causal], rtol=0, atol=1e-6)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("T, S", [(40, 40), (7, 150)])
def test_relative_position_program_is_t5_bias(bidirectional, T, S):
    torch.manual_seed(0)
    rpb = RelativePositionBias(3, num_buckets=16, max_distance=64, bidirectional=bidirectional)
    with torch.no_grad():
        rpb.embedding.weight.normal_()  # visible differences between buckets
    mod = relative_position_score_mod(rpb, T, S)
    bias = apply_score_mod(mod, torch.zeros(2, 3, T, S))
    with torch.no_grad():
        assert torch.equal(bias.detach(), rpb(T, S).expand(2, 3, T, S))
        rpb.embedding.weight.mul_(2.0)  # the table is read at each call: training moves the program's bias
        assert torch.equal(apply_score_mod(mod, torch.zeros(1, 3, T, S)), rpb(T, S))


def test_soft_cap_program_bounds_the_scores():
    scores = torch.linspace(-400, 400, 801, dtype=F32).reshape(1, 1, 1, -1)
    capped = apply_score_mod(soft_cap_score_mod(50), scores)
    assert capped.abs().max() < 50 and torch.equal(capped, 50 * torch.tanh(scores / 50))
    torch.testing.assert_close(capped[..., 400:403], scores[..., 400:403], rtol=1e-3, atol=1e-3)  # ~identity near 0


# ----------------------------------------------------------------------------- flex eagerly against the dense path


def _both(mask=None, score_mod=None, mask_mod=None, *, B=2, H=4, T=64, S=None, D=16, block_size=32, seed=0):
    """(flex eager output, attnbook's dense output) on the same float32 inputs."""
    q, k, v = qkv(B, H, T, D, S=S, seed=seed, dtype=F32)
    flex = eager_flex_attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, block_size=block_size)
    dense, _ = scaled_dot_product_attention(q, k, v, mask)
    return flex, dense


@needs_flex
@pytest.mark.parametrize("T, S, bottom_right", [(64, 64, False), (48, 80, False), (48, 80, True), (80, 48, False)])
def test_flex_causal_equals_dense(T, S, bottom_right):
    mask = causal_mask(T, S, offset=S - T if bottom_right else 0)
    mod = causal_mask_mod(T, S) if bottom_right else causal_mask_mod(T, S, offset=0)
    flex, dense = _both(mask, mask_mod=mod, T=T, S=S, block_size=16)
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


@needs_flex
@pytest.mark.parametrize("causal", [False, True])
def test_flex_sliding_window_equals_dense(causal):
    flex, dense = _both(sliding_window_mask(96, 10, causal=causal),
                        mask_mod=sliding_window_mask_mod(10, causal=causal), T=96, block_size=16)
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


@needs_flex
@pytest.mark.parametrize("left", [False, True])
def test_flex_padding_equals_dense_and_zeroes_fully_masked_rows(left):
    """A length of 0 leaves every query of that batch element without keys; left padding under a causal mask
    leaves the padded queries without keys. FlexAttention gives those rows a zero output (its eager path
    takes a 'safe' softmax; the compiled kernel does the same, measured in bench/bench_flex.py), as attnbook."""
    lengths = [0, 40, 64]
    mask = padding_mask(lengths, 64, left=left) & causal_mask(64)  # (B, 1, T, S)
    mod = combine_mask_mods(padding_mask_mod(lengths, 64, left=left), causal_mask_mod(64))
    flex, dense = _both(mask, mask_mod=mod, B=3, H=2)
    empty = ~mask.any(-1)  # (B, 1, T): query rows with no key
    assert empty[0].all() and (empty[1].any() == left) and not empty[2].any()
    assert torch.isfinite(flex).all()
    rows = empty.expand(3, 2, 64)
    assert torch.equal(flex[rows], torch.zeros_like(flex[rows]))
    assert torch.equal(dense[rows], torch.zeros_like(dense[rows]))
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


@needs_flex
@pytest.mark.parametrize("causal", [True, False])
def test_flex_documents_equal_dense(causal):
    ids = torch.stack([document_ids([20, 12, 32]), document_ids([50, 14])])  # (B, T)
    flex, dense = _both(document_mask(ids, causal=causal), mask_mod=document_mask_mod(ids, causal=causal), B=2)
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


@needs_flex
def test_flex_prefix_lm_equals_dense():
    flex, dense = _both(prefix_lm_mask(64, 23), mask_mod=prefix_lm_mask_mod(23), block_size=16)
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


@needs_flex
@pytest.mark.parametrize("T, S, causal", [(64, 64, True), (32, 96, True), (64, 64, False)])
def test_flex_alibi_equals_dense(T, S, causal):
    mask_mod = causal_mask_mod(T, S) if causal else None
    flex, dense = _both(alibi_bias(4, T, S, causal=causal), alibi_score_mod(4, T, S), mask_mod, T=T, S=S)
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


@needs_flex
@pytest.mark.parametrize("bidirectional", [True, False])
def test_flex_t5_bias_equals_dense(bidirectional):
    torch.manual_seed(0)
    rpb = RelativePositionBias(4, num_buckets=32, max_distance=128, bidirectional=bidirectional)
    with torch.no_grad():
        rpb.embedding.weight.normal_()
        mask_mod = None if bidirectional else causal_mask_mod(64)
        mask = rpb(64) if bidirectional else rpb(64).masked_fill(~causal_mask(64), torch.finfo(F32).min)
        flex, dense = _both(mask, relative_position_score_mod(rpb, 64), mask_mod)
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


@needs_flex
def test_flex_soft_cap_equals_dense_and_gemma2():
    """Soft-capping changes the scores before the softmax: the dense path is attnbook's masked softmax of the
    capped scores, and Hugging Face's Gemma 2 eager attention (which caps, then adds its causal mask)."""
    cap, B, H, T, D = 5.0, 2, 4, 64, 16
    q, k, v = qkv(B, H, T, D, seed=3, dtype=F32)
    q = q * 4  # scores well beyond the cap
    flex = eager_flex_attention(q, k, v, score_mod=soft_cap_score_mod(cap), mask_mod=causal_mask_mod(T))
    scores = (q @ k.transpose(-2, -1)) * D**-0.5  # (B, H, T, S)
    assert scores.abs().max() > 4 * cap
    weights = masked_softmax(apply_score_mod(soft_cap_score_mod(cap), scores), causal_mask(T))
    torch.testing.assert_close(flex, weights @ v, rtol=0, atol=TOL)
    gemma2 = pytest.importorskip("transformers.models.gemma2.modeling_gemma2",
                                 reason="transformers (test-only) has Gemma 2's eager attention")
    module = torch.nn.Module()
    module.num_key_value_groups, module.training, module.head_dim = 1, False, D
    additive = torch.zeros(T, T).masked_fill(~causal_mask(T), torch.finfo(F32).min)  # (T, S)
    out, _ = gemma2.eager_attention_forward(module, q, k, v, additive, scaling=D**-0.5, softcap=cap)
    torch.testing.assert_close(flex, out.transpose(1, 2), rtol=0, atol=TOL)  # HF returns (B, T, H, D)


@needs_flex
def test_eager_flex_attention_is_torchs_flex_attention():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = qkv(1, 2, 64, 16, dtype=F32)
    mod = sliding_window_mask_mod(7)
    with silence_unfused_warning():
        expected = flex_attention(q, k, v, block_mask=create_block_mask(mod, 1, 2, 64, 64, device="cpu",
                                                                         BLOCK_SIZE=16))
    assert torch.equal(eager_flex_attention(q, k, v, mask_mod=mod, block_size=16), expected)


# ----------------------------------------------------------------------------- block masks: tiles counted


def _count_tiles(mask, bs):
    """(skipped, partial, full) tiles of a (T, S) mask, tile by tile (a ragged last tile is never full)."""
    T, S = mask.shape
    counts = [0, 0, 0]
    for r in range(0, T, bs):
        for c in range(0, S, bs):
            tile = mask[r:r + bs, c:c + bs]
            whole = tile.shape == (bs, bs)
            counts[0 if not tile.any() else 2 if (whole and tile.all()) else 1] += 1
    return tuple(counts)


CASES = {
    "sliding window 256, T=1024": (sliding_window_mask_mod(256, causal=True), 1024, 128),
    "sliding window 256, T=2048": (sliding_window_mask_mod(256, causal=True), 2048, 128),
    "sliding window 20, T=100, tiles of 16": (sliding_window_mask_mod(20), 100, 16),
    "documents, T=1024": (document_mask_mod(document_ids([384, 128, 256, 256])), 1024, 128),
    "documents, T=2048": (document_mask_mod(document_ids([768, 256, 512, 512])), 2048, 128),
    "documents, T=200, tiles of 32": (document_mask_mod(document_ids([70, 30, 100])), 200, 32),
    "causal, T=2048": (causal_mask_mod(2048), 2048, 128),
}


@pytest.mark.parametrize("case", list(CASES))
def test_block_tiles_count_the_dense_mask(case):
    mod, T, bs = CASES[case]
    dense = block_mask_stats(mod, T, block_size=bs, method="dense")
    counts = (dense["skipped"], dense["partial"], dense["full"])
    assert counts == _count_tiles(dense_mask(mod, 1, 1, T)[0, 0], bs)
    assert dense["total"] == sum(counts) == (-(-T // bs)) ** 2
    assert dense["skipped_share"] == counts[0] / dense["total"]
    assert dense["method"] == "dense" and dense["tiles"].shape == (1, 1, -(-T // bs), -(-T // bs))


@needs_flex
@pytest.mark.parametrize("case", list(CASES))
def test_create_block_mask_skips_the_tiles_counted(case):
    mod, T, bs = CASES[case]
    flex = block_mask_stats(mod, T, block_size=bs, method="flex")
    dense = block_mask_stats(mod, T, block_size=bs, method="dense")
    assert flex["method"] == "flex"
    assert torch.equal(flex["tiles"], dense["tiles"])
    # torch's own summary: the share of the (padded) score area a kernel does not compute
    block_mask = make_block_mask(mod, T, block_size=bs)
    computed = (flex["partial"] + flex["full"]) * bs * bs
    assert block_mask.sparsity() == pytest.approx(100 * (1 - computed / T**2))


def test_block_stats_of_known_masks():
    causal = block_mask_stats(causal_mask_mod(2048), 2048, method="dense")
    assert (causal["full"], causal["partial"], causal["skipped"]) == (120, 16, 120)  # below, on, above the diagonal
    assert causal["skipped_share"] == 120 / 256
    window = block_mask_stats(sliding_window_mask_mod(256, causal=True), 2048, method="dense")
    # block row r (r >= 2): tile r partial (the diagonal), r - 1 full (distances 1..255 <= 256), r - 2 partial
    # (distances 129..383); rows 0 and 1 lack the tiles before the first
    assert (window["full"], window["partial"], window["skipped"]) == (15, 30, 211)
    assert window["allowed_share"] == pytest.approx(float(sliding_window_mask(2048, 256, causal=True).float().mean()))
    tiles = block_tiles(causal_mask(5, 7), block_size=2)  # (3, 4): ragged last row and column
    assert tiles.tolist() == [[1, 0, 0, 0], [2, 1, 0, 0], [1, 1, 1, 0]]
    assert TILE_KINDS[2] == "full" and FLEX_BLOCK_SIZE == 128


def test_block_stats_without_flex_fall_back_to_the_dense_mask(monkeypatch):
    import attnbook.masks

    monkeypatch.setattr(attnbook.masks, "flex_available", lambda: False)
    st = block_mask_stats(sliding_window_mask_mod(8), 64, block_size=16)
    assert st["method"] == "dense"
    assert (st["skipped"], st["partial"], st["full"]) == _count_tiles(sliding_window_mask(64, 8), 16)
    with pytest.raises(RuntimeError, match="FlexAttention needs torch >= 2.5"):
        make_block_mask(sliding_window_mask_mod(8), 64)


def test_flex_available_is_false_without_the_module(monkeypatch):
    import sys

    import torch._dynamo

    assert flex_available() == (_importable() and torch._dynamo.is_dynamo_supported())
    monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)  # import raises ImportError
    assert flex_available() is False


def _importable() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- errors


def test_block_size_must_be_a_positive_int():
    mod = causal_mask_mod(64)
    for bad in (0, -16):
        with pytest.raises(ValueError, match=f"block_size must be an int >= 1, got {bad}"):
            block_mask_stats(mod, 64, block_size=bad)
        with pytest.raises(ValueError, match="block_size must be an int >= 1"):
            block_tiles(causal_mask(8), bad)
    with pytest.raises(TypeError, match="block_size must be an int, got float 16.0"):
        block_mask_stats(mod, 64, block_size=16.0)
    with pytest.raises(ValueError, match="method must be 'auto', 'flex' or 'dense', got 'sparse'"):
        block_mask_stats(mod, 64, method="sparse")


@needs_flex
def test_flex_paths_check_block_size():
    q, k, v = qkv(1, 1, 16, 8, dtype=F32)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        eager_flex_attention(q, k, v, mask_mod=causal_mask_mod(16), block_size=0)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got -1"):
        make_block_mask(causal_mask_mod(16), 16, block_size=-1)
    with pytest.raises(ValueError, match=r"q must be 4-D \(B, H, len, D\), got shape \(16, 8\)"):
        eager_flex_attention(q[0, 0], k, v)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        eager_flex_attention(q, [1.0], v)


def test_mask_mod_must_return_bool():
    def int_mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx).int()

    with pytest.raises(TypeError, match="mask_mod int_mask must return a bool tensor .*got torch.int32"):
        check_mask_mod(int_mask, 8)
    with pytest.raises(TypeError, match="mask_mod int_mask must return a bool tensor"):
        dense_mask(int_mask, 1, 1, 8)
    with pytest.raises(TypeError, match="mask_mod int_mask must return a bool tensor"):
        block_mask_stats(int_mask, 8, block_size=4)
    with pytest.raises(TypeError, match="mask_mod <lambda> must return a bool tensor .*got bool"):
        check_mask_mod(lambda b, h, q, kv: True, 8)
    with pytest.raises(TypeError, match="mask_mod must be callable"):
        check_mask_mod(causal_mask(8), 8)
    with pytest.raises(ValueError, match=r"mask_mod <lambda> must return one value per \(b, h, q_idx, kv_idx\), got "
                                         r"shape \(1, 1, 8, 9\) for scalar indices"):
        check_mask_mod(lambda b, h, q, kv: torch.ones(1, 1, 8, 9, dtype=torch.bool) & (q >= 0), 8)

    def keys_first(b, h, q_idx, kv_idx):  # right on scalars, wrong on the grids: kv_idx (1, 1, 1, S) -> (S, 1, 1, 1)
        return q_idx >= kv_idx.reshape(kv_idx.shape[::-1])

    with pytest.raises(ValueError, match=r"mask_mod keys_first returned shape \(9, 1, 8, 1\), which does not "
                                         r"broadcast to \(B, H, T, S\) = \(1, 1, 8, 9\)"):
        check_mask_mod(keys_first, 8, 9)
    check_mask_mod(causal_mask_mod(8, 12), 8, 12, B=2, H=3)  # a good program passes

    def python_and(b, h, q_idx, kv_idx):  # fine on FlexAttention's scalars, ambiguous on a grid
        return kv_idx <= q_idx and q_idx - kv_idx <= 3

    assert python_and(*[torch.zeros((), dtype=torch.int32)] * 4).dtype == torch.bool
    with pytest.raises(TypeError, match=r"mask_mod python_and asked for the truth value of a tensor .*`&`, `\|`"):
        check_mask_mod(python_and, 8)
    with pytest.raises(TypeError, match="mask_mod python_and asked for the truth value"):
        dense_mask(python_and, 1, 1, 8)


def test_lengths_and_ids_must_be_ints():
    with pytest.raises(TypeError, match="lengths must hold ints, got torch.float32"):
        padding_mask_mod(torch.tensor([3.0, 4.0]))
    with pytest.raises(TypeError, match=r"lengths must be a sequence of ints or an integer tensor, got list \[3, 4.5\]"):
        padding_mask_mod([3, 4.5])
    with pytest.raises(TypeError, match="lengths must be a sequence of ints"):
        padding_mask_mod([True, False])
    with pytest.raises(TypeError, match="lengths must be a sequence of ints"):
        document_ids([2.0, 3.0])
    with pytest.raises(TypeError, match="document_ids must hold ints, got torch.float32"):
        document_mask_mod(torch.zeros(8))
    with pytest.raises(ValueError, match=r"lengths must be >= 0, got \[3, -1\]"):
        padding_mask_mod([3, -1])
    with pytest.raises(ValueError, match="max_len=3 is shorter than the longest length 5"):
        padding_mask_mod([5, 2], 3)
    with pytest.raises(ValueError, match=r"lengths must be a non-empty 1-D sequence of lengths >= 1, got \[3, 0\]"):
        document_ids([3, 0])
    with pytest.raises(ValueError, match=r"document_ids must be \(T,\) or \(B, T\)"):
        document_mask_mod(torch.zeros(2, 2, 4, dtype=torch.long))


def test_other_arguments_are_checked():
    with pytest.raises(ValueError, match="window must be an int >= 0, got -1"):
        sliding_window_mask_mod(-1)
    with pytest.raises(TypeError, match="T must be an int, got float"):
        causal_mask_mod(8.0)
    with pytest.raises(ValueError, match=r"prefix_len must be an int in \[0, 8\], got 9"):
        prefix_lm_mask(8, 9)
    with pytest.raises(ValueError, match="cap must be a positive finite number, got 0"):
        soft_cap_score_mod(0)
    with pytest.raises(TypeError, match="cap must be a positive number, got str"):
        soft_cap_score_mod("50")
    with pytest.raises(TypeError, match="bias must be an attnbook.RelativePositionBias, got Tensor"):
        relative_position_score_mod(torch.zeros(32, 4), 8)
    with pytest.raises(TypeError, match="score_mod .* must return float scores, got torch.bool"):
        apply_score_mod(lambda s, b, h, q, kv: q >= kv, torch.zeros(1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"scores must be \(B, H, T, S\), got shape \(4, 4\)"):
        apply_score_mod(soft_cap_score_mod(5), torch.zeros(4, 4))
    with pytest.raises(TypeError, match="scores must be a float tensor .*got torch.int64"):
        apply_score_mod(soft_cap_score_mod(5), torch.zeros(1, 1, 4, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="combine_mask_mods takes one or more mask programs"):
        combine_mask_mods(causal_mask_mod(4), "causal")


# ----------------------------------------------------------------------------- the unfused warning


@needs_flex
def test_only_the_unfused_warning_is_silenced(monkeypatch):
    """torch warns once per process that eager flex_attention is unfused; with its once-only record emptied,
    the warning shows outside the context manager, and inside it every warning but that one still shows."""
    import torch.nn.attention.flex_attention as fa

    q, k, v = qkv(1, 1, 16, 8, dtype=F32)

    def warnings_of(fn):
        monkeypatch.setattr(fa, "_WARNINGS_SHOWN", set(), raising=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
        return [str(w.message) for w in caught]

    def unfused(messages):
        return [m for m in messages if m.startswith("flex_attention called without torch.compile()")]

    assert unfused(warnings_of(lambda: fa.flex_attention(q, k, v)))  # the test could fail: torch warns here

    short = "flex_attention called without torch.compile()"

    def quiet():
        with silence_unfused_warning():
            fa.flex_attention(q, k, v)  # torch's UserWarning: silenced
            warnings.warn("another warning", UserWarning, stacklevel=1)  # shown
            warnings.warn(short, RuntimeWarning, stacklevel=1)  # the same words in another category: shown

    shown = warnings_of(quiet)
    assert "another warning" in shown
    assert unfused(shown) == [short]  # only the RuntimeWarning; torch's own longer message is gone
    before = list(warnings.filters)
    with silence_unfused_warning():
        pass
    assert warnings.filters == before  # undone on exit
