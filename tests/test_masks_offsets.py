"""Mask and score programs whose queries sit offset into the keys: a decoding step (T = 1 against S = 257
cached keys), chunked prefill (a chunk of T new tokens after S - T cached ones), lengths that are not
multiples of the block; each program against a mask or bias built here position by position, FlexAttention
(eager) against SDPA, and the errors a program gives when it is used for sizes it was not built for.
Grouped-query heads through ``eager_flex_attention(enable_gqa=True)`` against SDPA's ``enable_gqa`` and
``repeat_interleave``; ``combine_mask_mods`` / ``union_mask_mods`` against torch's ``and_masks`` / ``or_masks``.

Dimension legend: B batch, H query heads, Hkv key/value heads, T query length, S key length, D head dim.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbook import KVCache, RelativePositionBias, alibi_bias, causal_mask, sliding_window_mask
from attnbook.masks import (
    alibi_score_mod,
    apply_score_mod,
    causal_mask_mod,
    combine_mask_mods,
    dense_mask,
    document_ids,
    document_mask_mod,
    eager_flex_attention,
    flex_available,
    make_block_mask,
    padding_mask_mod,
    prefix_lm_mask_mod,
    relative_position_score_mod,
    sliding_window_mask_mod,
    union_mask_mods,
)
from tests.helpers import qkv

F32 = torch.float32
needs_flex = pytest.mark.skipif(
    not flex_available(),
    reason="FlexAttention needs torch >= 2.5 (torch.nn.attention.flex_attention) with TorchDynamo support")

# (T, S): decode with a cache past two blocks of 128, a chunk of prefill after cached tokens, sizes that are
# not multiples of 16 or 128, a single query and a single key
SIZES = [(1, 257), (37, 165), (16, 100), (5, 5), (1, 1)]


def _by_position(T, S, offset, allowed):
    """Bool (T, S): allowed(p, j) for the query at absolute position p = offset + i and key j."""
    return torch.tensor([[bool(allowed(offset + i, j)) for j in range(S)] for i in range(T)])


def _rel_err(out, ref):
    return ((out - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("T, S", SIZES)
def test_programs_default_to_the_last_T_positions(T, S):
    off, w = S - T, 20
    cases = {
        "causal": (causal_mask_mod(T, S), lambda p, j: j <= p),
        "window causal": (sliding_window_mask_mod(w, T, S, causal=True), lambda p, j: 0 <= p - j <= w),
        "window both ways": (sliding_window_mask_mod(w, T, S), lambda p, j: abs(p - j) <= w),
        "prefix LM": (prefix_lm_mask_mod(3, T, S), lambda p, j: j <= p or j < 3),
    }
    for name, (mod, allowed) in cases.items():
        assert torch.equal(dense_mask(mod, 1, 1, T, S)[0, 0], _by_position(T, S, off, allowed)), name


def test_decode_step_sees_its_window_not_key_zero():
    """The reported defect: one query after 256 cached keys; a window of 8 back allows keys 248..256."""
    got = dense_mask(sliding_window_mask_mod(8, 1, 257, causal=True), 1, 1, 1, 257)[0, 0, 0]
    assert got.nonzero().flatten().tolist() == list(range(248, 257))
    assert torch.equal(got, sliding_window_mask(1, 8, 257, causal=True, offset=256)[0])


@pytest.mark.parametrize("T, S, offset", [(4, 30, 0), (4, 30, 10), (1, 257, 100)])
def test_explicit_offsets(T, S, offset):
    assert torch.equal(dense_mask(causal_mask_mod(T, S, offset=offset), 1, 1, T, S)[0, 0],
                       causal_mask(T, S, offset=offset))
    assert torch.equal(dense_mask(sliding_window_mask_mod(5, T, S, causal=True, offset=offset), 1, 1, T, S)[0, 0],
                       _by_position(T, S, offset, lambda p, j: 0 <= p - j <= 5))


@pytest.mark.parametrize("T", [1, 7, 30])
def test_documents_at_decode_and_chunked_prefill(T):
    ids = document_ids([50, 100, 107])  # (S,) S = 257
    S = ids.numel()
    for causal in (True, False):
        got = dense_mask(document_mask_mod(ids, T, causal=causal), 1, 1, T, S)[0, 0]
        expected = _by_position(T, S, S - T, lambda p, j, causal=causal: ids[p] == ids[j] and (j <= p or not causal))
        assert torch.equal(got, expected)
    for bad in (S - T + 1, -1):
        with pytest.raises(ValueError, match="lie past them"):
            document_mask_mod(ids, T, offset=bad)


@pytest.mark.parametrize("T, S", [(1, 257), (37, 165)])
def test_score_programs_at_an_offset(T, S):
    bias = apply_score_mod(alibi_score_mod(4, T, S), torch.zeros(1, 4, T, S))[0]  # (H, T, S)
    torch.testing.assert_close(bias, alibi_bias(4, T, S, causal=False), rtol=0, atol=1e-5)
    torch.manual_seed(0)
    rpb = RelativePositionBias(4, num_buckets=16, max_distance=64, bidirectional=False)
    with torch.no_grad():
        rpb.embedding.weight.normal_()
        got = apply_score_mod(relative_position_score_mod(rpb, T, S), torch.zeros(1, 4, T, S))
        assert torch.equal(got[0], rpb(T, S)[0])  # rpb(T, S): the queries are the last T of S positions
        # an explicit top-left offset: relative position kv - q
        top = apply_score_mod(relative_position_score_mod(rpb, T, S, offset=0), torch.zeros(1, 4, T, S))
        assert torch.equal(top[0, :, :, :T], rpb(T, T)[0])


def test_a_program_refuses_other_sizes():
    step = causal_mask_mod(1, 80)
    with pytest.raises(ValueError, match=r"built for T=1 queries and S=80 keys, used with T=1 and S=81"):
        dense_mask(step, 1, 1, 1, 81)  # reused one decoding step later
    with pytest.raises(ValueError, match="self-attention program"):
        dense_mask(sliding_window_mask_mod(8, causal=True), 1, 1, 1, 257)
    with pytest.raises(ValueError, match="self-attention program"):
        dense_mask(prefix_lm_mask_mod(4), 1, 1, 3, 9)
    with pytest.raises(ValueError, match="built for"):
        apply_score_mod(alibi_score_mod(2, 1, 80), torch.zeros(1, 2, 1, 81))
    with pytest.raises(ValueError, match="built for"):
        dense_mask(padding_mask_mod([3, 9], 9), 2, 1, 4, 10)
    dense_mask(padding_mask_mod([3, 9], 9), 2, 1, 4, 9)  # any number of queries against its 9 keys
    with pytest.raises(ValueError, match="different sizes"):
        combine_mask_mods(causal_mask_mod(1, 80), causal_mask_mod(1, 81))
    with pytest.raises(ValueError, match="self-attention program"):
        combine_mask_mods(causal_mask_mod(1, 80), sliding_window_mask_mod(8))
    with pytest.raises(ValueError, match="offset needs T and S"):
        sliding_window_mask_mod(8, offset=3)
    with pytest.raises(TypeError, match="offset"):
        causal_mask_mod(4, 9, offset=1.0)


@needs_flex
def test_combinations_are_torchs_and_masks_or_masks():
    from torch.nn.attention.flex_attention import and_masks, create_mask, or_masks

    T, S = 37, 165
    parts = (sliding_window_mask_mod(9, T, S, causal=True), padding_mask_mod([120, 165], S))
    both = combine_mask_mods(*parts)
    either = union_mask_mods(*parts)
    assert torch.equal(dense_mask(both, 2, 1, T, S), create_mask(and_masks(*parts), 2, 1, T, S, device="cpu"))
    assert torch.equal(dense_mask(either, 2, 1, T, S), create_mask(or_masks(*parts), 2, 1, T, S, device="cpu"))
    assert torch.equal(dense_mask(both, 2, 1, T, S), dense_mask(parts[0], 2, 1, T, S) & dense_mask(parts[1], 2, 1, T, S))
    assert torch.equal(dense_mask(either, 2, 1, T, S), dense_mask(parts[0], 2, 1, T, S) | dense_mask(parts[1], 2, 1, T, S))
    with pytest.raises(ValueError, match="built for"):
        dense_mask(both, 2, 1, T + 1, S + 1)


@needs_flex
@pytest.mark.parametrize("T, S", [(1, 257), (37, 165), (1, 1)])
@pytest.mark.parametrize("block_size", [16, 128])
def test_flex_at_an_offset_equals_sdpa(T, S, block_size):
    q, k, v = qkv(2, 3, T, 16, S=S, seed=1, dtype=F32)
    for mod in (causal_mask_mod(T, S), sliding_window_mask_mod(20, T, S, causal=True),
                combine_mask_mods(causal_mask_mod(T, S), padding_mask_mod([S, max(1, S - 40)], S, left=True))):
        mask = dense_mask(mod, 2, 3, T, S)  # (B, H, T, S)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = eager_flex_attention(q, k, v, mask_mod=mod, block_size=block_size)
        assert _rel_err(out, ref) < 1e-5, mod.__name__
    with pytest.raises(ValueError, match="built for"):
        eager_flex_attention(q, k, v, mask_mod=causal_mask_mod(T, S - 1 if S > 1 else 2))


@needs_flex
def test_flex_decoding_loop_equals_the_dense_path():
    """Prefill 250 tokens, then decode 9 steps, one query each; every step builds its block mask for its own
    (T, S) = (1, S) and attends the cache through Flex: equal to SDPA with the dense window mask."""
    B, Hkv, H, D, w = 1, 2, 4, 16, 64
    cache = KVCache()
    g = torch.Generator().manual_seed(0)
    k0, v0 = torch.randn(B, Hkv, 250, D, generator=g), torch.randn(B, Hkv, 250, D, generator=g)
    cache.append(k0, v0)
    for _ in range(9):
        q = torch.randn(B, H, 1, D, generator=g)  # (B, H, 1, D)
        k_all, v_all = cache.append(torch.randn(B, Hkv, 1, D, generator=g), torch.randn(B, Hkv, 1, D, generator=g))
        S = k_all.shape[2]
        mod = sliding_window_mask_mod(w, 1, S, causal=True)
        out = eager_flex_attention(q, k_all, v_all, mask_mod=mod, enable_gqa=True)
        mask = sliding_window_mask(1, w, S, causal=True, offset=S - 1)  # (T, S)
        ref = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
        assert _rel_err(out, ref) < 1e-5
        assert int(mask.sum()) == w + 1


@needs_flex
@pytest.mark.parametrize("H, Hkv", [(8, 2), (6, 1), (4, 4)])
@pytest.mark.parametrize("T, S", [(33, 33), (1, 257)])
def test_enable_gqa_equals_sdpa_and_repeat_interleave(H, Hkv, T, S):
    q = qkv(2, H, T, 16, seed=2, dtype=F32)[0]
    _, k, v = qkv(2, Hkv, S, 16, S=S, seed=3, dtype=F32)
    mod = causal_mask_mod(T, S)
    mask = dense_mask(mod, 1, 1, T, S)[0, 0]  # (T, S)
    out = eager_flex_attention(q, k, v, mask_mod=mod, enable_gqa=True, block_size=16)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    rep = F.scaled_dot_product_attention(q, k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1),
                                         attn_mask=mask)
    assert _rel_err(out, ref) < 1e-5 and _rel_err(out, rep) < 1e-5


@needs_flex
def test_enable_gqa_errors():
    q = qkv(1, 6, 8, 16, dtype=F32)[0]
    _, k, v = qkv(1, 4, 8, 16, dtype=F32)
    with pytest.raises(ValueError, match="Hkv must divide H"):
        eager_flex_attention(q, k, v, enable_gqa=True)
    _, k2, v2 = qkv(1, 2, 8, 16, dtype=F32)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        eager_flex_attention(q, k2, v2)
    with pytest.raises(TypeError, match="enable_gqa"):
        eager_flex_attention(q, k2, v2, enable_gqa=1)


@needs_flex
def test_block_mask_of_a_decode_step():
    """The block mask built for one decoding step has one row of blocks, and with a window of 150 it lists
    only the key blocks the window reaches: keys 849..999, blocks 6 (768..895) and 7 (896..999, ragged)."""
    bm = make_block_mask(sliding_window_mask_mod(150, 1, 1000, causal=True), 1, 1000)
    assert tuple(bm.kv_num_blocks.shape) == (1, 1, 1)
    n = int(bm.kv_num_blocks[0, 0, 0])
    listed = sorted(bm.kv_indices[0, 0, 0, :n].tolist())
    if bm.full_kv_num_blocks is not None:
        m = int(bm.full_kv_num_blocks[0, 0, 0])
        listed = sorted(listed + bm.full_kv_indices[0, 0, 0, :m].tolist())
    assert listed == [6, 7]


def test_flex_available_imports_cpp_extension_first(monkeypatch):
    """FlexAttention's tracing or compiling imports torch.utils.cpp_extension in some torch versions, which on a
    CUDA build without a GPU says "No CUDA runtime is found" once, at import: flex_available (which the package
    calls before any FlexAttention call) imports it first, through measure.torch_benchmark, which drops that line."""
    import sys

    import attnbook.measure

    calls = []
    real = attnbook.measure.torch_benchmark
    monkeypatch.setattr(attnbook.measure, "torch_benchmark", lambda: calls.append(1) or real())
    if flex_available():
        assert calls and "torch.utils.cpp_extension" in sys.modules
