"""attnbook.efficient's registry of variants: the (query, key) pairs each one declares (its ``Pattern``) against
the masks and against what the attention code really weights, the pictures and shares computed without the
(T, T) pattern against pooling and summing it, the inputs the variants are compared on, and their measured
costs. (The explorer that shows them is tested in test_explorers_variants.py.)

Dimension legend: B batch, H heads, T sequence length, D head dim, P side of a picture.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbook import scaled_dot_product_attention, sliding_window_mask
from attnbook.efficient import (
    ALL_PAIRS,
    BIGBIRD_PAIRS,
    LSH_PAIRS,
    REGISTRY,
    SLIDING_WINDOW_PAIRS,
    Pattern,
    attended_pairs,
    attention_call,
    bigbird_pattern,
    block_sparse_attention,
    cost_key,
    lsh_attention,
    lsh_n_buckets,
    make_inputs,
    measure_costs,
    pair_picture,
    pair_share,
    sliding_window_attention,
    variant,
)

PATTERNS = {"all": ALL_PAIRS, "sliding window": SLIDING_WINDOW_PAIRS, "BigBird": BIGBIRD_PAIRS, "LSH": LSH_PAIRS}


def _identity_weights(name: str, T: int, window: int) -> torch.Tensor:
    """Run the variant with the identity as values: output row i is query i's weights (head 0)."""
    q, k, _ = make_inputs(T)
    eye = torch.eye(T).expand(1, 2, T, T)  # (B, H, T, T)
    out = {
        "sliding window": lambda: sliding_window_attention(q, k, eye, window),
        "block sparse": lambda: block_sparse_attention(q, k, eye, window),
        "LSH": lambda: lsh_attention(q, eye, lsh_n_buckets(T, window), window),
    }[name]()
    return out[0, 0]  # (T, T)


def _pooled(pairs: torch.Tensor, P: int) -> torch.Tensor:
    """The share of scored pairs in each of (P, P) cells: block means when P divides T, else
    ``adaptive_avg_pool2d``'s cells (rows floor(i T / P) .. ceil((i + 1) T / P))."""
    T = pairs.shape[0]
    if T % P == 0:
        return pairs.float().view(P, T // P, P, T // P).mean(dim=(1, 3))
    return F.adaptive_avg_pool2d(pairs.float()[None], P)[0]


# ----------------------------------------------------------------------------- each variant declares its pairs


def test_each_variant_declares_its_pattern():
    declared = {name: v.pattern for name, v in REGISTRY.items()}
    assert declared == {"exact": ALL_PAIRS, "pytorch": ALL_PAIRS, "sliding window": SLIDING_WINDOW_PAIRS,
                        "block sparse": BIGBIRD_PAIRS, "linear": None, "performer": None, "LSH": LSH_PAIRS,
                        "flash": ALL_PAIRS}
    for name, v in REGISTRY.items():
        assert v.scores_pairs == (v.pattern is not None)
        assert isinstance(v.pattern, Pattern) or name in ("linear", "performer")


def test_sliding_window_pairs_are_the_mask():
    for T, W in ((64, 4), (256, 16), (100, 7)):
        assert torch.equal(attended_pairs("sliding window", T, W), sliding_window_mask(T, W))
    torch.testing.assert_close(pair_picture("sliding window", 64, 4, resolution=64), sliding_window_mask(64, 4).float())


def test_block_sparse_pairs_are_bigbird():
    assert torch.equal(attended_pairs("block sparse", 128, 16), bigbird_pattern(128, 16))
    assert torch.equal(attended_pairs("block sparse", 100, 16), bigbird_pattern(100, 16))  # a short last block


@pytest.mark.parametrize("name,T,window", [("sliding window", 128, 8), ("block sparse", 128, 16), ("LSH", 256, 16),
                                           ("LSH", 64, 8), ("LSH", 100, 16), ("block sparse", 100, 16)])
def test_pairs_are_the_pairs_the_code_weights(name, T, window):
    weights = _identity_weights(name, T, window)
    assert torch.equal(weights != 0, attended_pairs(name, T, window))
    torch.testing.assert_close(weights.sum(-1), torch.ones(T))


@pytest.mark.parametrize("T, window, seed", [(256, 16, 0), (100, 16, 0), (64, 8, 1), (130, 32, 2)])
def test_lsh_output_is_exact_attention_under_its_declared_pairs(T, window, seed):
    """What the registry's LSH run computes for head 0 of ``make_inputs(T, seed=seed)`` is exact shared-QK
    attention (queries qk, keys qk normalised to unit length) under the mask attended_pairs declares; head 1
    hashes other vectors, so the same mask is not its pattern."""
    q, k, v = make_inputs(T, seed=seed)
    out = attention_call("LSH", q, k, v, window)()  # (1, 2, T, D)
    pairs = attended_pairs("LSH", T, window, seed=seed)
    for h in (0, 1):
        ref, _ = scaled_dot_product_attention(q[:, h], F.normalize(q[:, h], dim=-1), v[:, h], pairs)  # (1, T, D)
        if h == 0:
            torch.testing.assert_close(out[:, 0], ref, atol=1e-6, rtol=1e-5)
        else:
            assert (out[:, 1] - ref).abs().max() > 1e-2
    assert pair_share("LSH", T, window, seed=seed) == pytest.approx(pairs.double().mean().item(), abs=1e-12)


def test_lsh_pairs_depend_on_the_data_and_skip_self():
    a = attended_pairs("LSH", 128, 16, seed=0)
    b = attended_pairs("LSH", 128, 16, seed=1)
    assert not torch.equal(a, b)
    assert not a.diagonal().any()  # every query has someone else in its window
    assert (a.sum(-1) <= 2 * 16).all()


def test_exact_covers_every_pair_and_linear_none():
    for name in ("exact", "flash", "pytorch"):
        assert attended_pairs(name, 32).all()
        assert (pair_picture(name, 4096, resolution=128) == 1).all()
        assert pair_share(name, 32) == 1.0
    for name in ("linear", "performer"):
        assert attended_pairs(name, 32) is None and pair_share(name, 32) is None
        assert pair_picture(name, 256).isnan().all()


# ----------------------------------------------------------------------------- pictures and counts without (T, T)

# (T, window, P): cells of whole positions (P divides T) and not; windows / blocks that divide T and not
SIZES = [(256, 16, 32), (256, 4, 32), (256, 64, 16), (128, 16, 128), (200, 16, 50), (96, 40, 32),
         (100, 7, 30), (130, 16, 64), (97, 8, 32)]


@pytest.mark.parametrize("T, window", sorted({(T, window) for T, window, _ in SIZES}))
@pytest.mark.parametrize("pattern_name", list(PATTERNS))
def test_each_patterns_count_is_the_number_of_its_pairs(pattern_name, T, window):
    pattern = PATTERNS[pattern_name]
    for seed in (0, 3):
        pairs = pattern.pairs(T, window, seed)
        assert pairs.shape == (T, T) and pairs.dtype == torch.bool
        assert pattern.count(T, window, seed) == int(pairs.sum())


@pytest.mark.parametrize("T, window, P", [
    pytest.param(T, window, P, id=f"T{T}-w{window}-P{P}") for T, window, P in SIZES])
@pytest.mark.parametrize("pattern_name", list(PATTERNS))
def test_each_patterns_picture_is_its_pooled_pairs(pattern_name, T, window, P):
    pattern = PATTERNS[pattern_name]
    pairs = pattern.pairs(T, window, 0)
    pic = pattern.picture(T, window, P, 0)
    assert pic.shape == (P, P)
    torch.testing.assert_close(pic, _pooled(pairs, P), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["sliding window", "block sparse", "LSH", "exact", "flash"])
@pytest.mark.parametrize("T,window,R", [(256, 16, 32), (256, 4, 32), (256, 64, 16), (128, 16, 128), (200, 16, 50),
                                        (96, 40, 32), (64, 8, 1000)])
def test_picture_and_share_of_a_variant_are_its_pooled_pairs(name, T, window, R):
    """pair_picture and pair_share compute from the variant's Pattern without the (T, T) mask; they must
    equal pooling and averaging attended_pairs (P = min(resolution, T))."""
    pairs = attended_pairs(name, T, window).float()  # (T, T)
    P = min(R, T)
    pic = pair_picture(name, T, window, resolution=R)
    assert pic.shape == (P, P)
    torch.testing.assert_close(pic, _pooled(pairs, P), atol=1e-6, rtol=0)
    assert pair_share(name, T, window) == pytest.approx(pairs.double().mean().item(), abs=1e-12)
    pic[0, 0] = -1.0
    assert pair_picture(name, T, window, resolution=R)[0, 0] != -1.0  # a copy: the cached picture is safe


def test_unknown_variant_and_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="variant must be one of"):
        attended_pairs("dense", 16)
    with pytest.raises(ValueError, match="'dense'"):
        attention_call("dense", *make_inputs(16))
    with pytest.raises(TypeError, match="variant name must be a str, got int"):
        variant(3)
    with pytest.raises(TypeError, match="T must be an int, got float"):
        attended_pairs("exact", 16.0)
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        pair_share("sliding window", 16, 0)
    with pytest.raises(ValueError, match="resolution must be an int >= 1, got 0"):
        pair_picture("exact", 16, resolution=0)


def test_lsh_bucket_count_is_even_or_one():
    assert lsh_n_buckets(4096, 64) == 64
    assert lsh_n_buckets(64, 64) == 1
    assert lsh_n_buckets(192, 64) == 4


# ----------------------------------------------------------------------------- inputs and costs


def test_make_inputs_sizes_seed_and_dtype():
    q, k, v = make_inputs(10, batch_size=3, num_heads=4, head_dim=6, seed=5)
    assert q.shape == k.shape == v.shape == (3, 4, 10, 6) and q.dtype == torch.get_default_dtype()
    a = make_inputs(10, batch_size=3, num_heads=4, head_dim=6, seed=5)
    assert all(torch.equal(x, y) for x, y in zip((q, k, v), a))  # the same seed, the same tensors
    assert not torch.equal(q, make_inputs(10, batch_size=3, num_heads=4, head_dim=6, seed=6)[0])
    assert not torch.equal(q, k)
    assert make_inputs(10)[0].shape == (1, 2, 10, 32)  # the defaults: B = 1, H = 2, D = 32
    assert make_inputs(4, dtype=torch.float64)[2].dtype == torch.float64
    with pytest.raises(TypeError, match="seq_len must be an int, got float"):
        make_inputs(8.0)
    with pytest.raises(ValueError, match="num_heads must be an int >= 1, got 0"):
        make_inputs(8, num_heads=0)
    with pytest.raises(TypeError, match="head_dim must be an int, got bool"):
        make_inputs(8, head_dim=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'B'"):  # the old names are gone
        make_inputs(8, B=1)


def test_cost_key_keeps_the_window_only_where_it_means_something():
    for name, v in REGISTRY.items():
        assert cost_key(name, 128, 16) == (name, 128, None if v.window is None else 16)
    assert cost_key("sliding window", 64, 8) != cost_key("sliding window", 64, 16)
    assert cost_key("linear", 64, 8) == cost_key("linear", 64, 16)
    with pytest.raises(ValueError, match="variant must be one of"):
        cost_key("dense", 64, 8)


def test_measure_costs_keys_and_values():
    costs = measure_costs(["exact", "sliding window", "linear"], [64, 128], 8, rounds=1)
    assert set(costs) == {("exact", 64, None), ("exact", 128, None), ("sliding window", 64, 8),
                          ("sliding window", 128, 8), ("linear", 64, None), ("linear", 128, None)}
    for c in costs.values():
        assert c["time_s"] > 0 and c["peak_bytes"] > 0 and 0 < c["largest_bytes"] <= c["peak_bytes"]
    assert costs["exact", 128, None]["peak_bytes"] > costs["exact", 64, None]["peak_bytes"]
    with pytest.raises(ValueError, match="variant must be one of"):
        measure_costs(["dense"], [64])


def test_measure_costs_runs_on_inputs_of_the_sizes_given():
    """The tracked memory is the same on every run, so the input sizes show in it: exact attention's largest
    tensor is its (B, H, T, T) float32 weights, and its peak grows in proportion to B * H."""
    T = 64
    base = measure_costs(["exact"], [T], rounds=1)["exact", T, None]
    assert base["largest_bytes"] == 1 * 2 * T * T * 4  # the defaults: B = 1, H = 2
    more = measure_costs(["exact"], [T], rounds=1, batch_size=3, num_heads=4, head_dim=16)["exact", T, None]
    assert more["largest_bytes"] == 3 * 4 * T * T * 4
    assert 5 * base["peak_bytes"] < more["peak_bytes"] <= 6 * base["peak_bytes"]  # the (B, H, T, T) tensors dominate
    no_memory = measure_costs(["exact"], [T], rounds=1, memory=False)["exact", T, None]
    assert set(no_memory) == {"time_s"}
    with pytest.raises(TypeError, match="unexpected keyword argument 'H'"):
        measure_costs(["exact"], [T], H=2)
