"""attnbook.explorers.efficient without a browser: the pair pictures against the masks
and against what the attention code really weights, the variant registry, the
memory tracker and the crossover arithmetic of attnbook.measure, and the
explorer's data, figure and static frames.

Dimension legend: B batch, H heads, T sequence length, D head dim.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnbook.efficient import (
    attention_call,
    bigbird_pattern,
    block_sparse_attention,
    lsh_attention,
    lsh_n_buckets,
    make_inputs,
    sliding_window_attention,
)
from attnbook.explorers import efficient as ee
from attnbook.explorers.base import figure_png
from attnbook.masks import sliding_window_mask
from tests.pixels import assert_blit_matches_full_render, assert_shows_something

SMALL = dict(t_values=(64, 128, 256), windows=(8, 16), static_t=(64, 256), static_windows=(16,), rounds=1, resolution=64)


@pytest.fixture(scope="module")
def explorer():
    return ee.efficient_explorer(**SMALL)


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


def test_sliding_window_pairs_are_the_mask():
    for T, W in ((64, 4), (256, 16), (100, 7)):
        assert torch.equal(ee.attended_pairs("sliding window", T, W), sliding_window_mask(T, W))
    torch.testing.assert_close(ee.pair_picture("sliding window", 64, 4, resolution=64), sliding_window_mask(64, 4).float())


def test_block_sparse_pairs_are_bigbird():
    assert torch.equal(ee.attended_pairs("block sparse", 128, 16), bigbird_pattern(128, 16))


@pytest.mark.parametrize("name,T,window", [("sliding window", 128, 8), ("block sparse", 128, 16), ("LSH", 256, 16),
                                           ("LSH", 64, 8)])
def test_pictured_pairs_are_the_pairs_the_code_weights(name, T, window):
    weights = _identity_weights(name, T, window)
    assert torch.equal(weights != 0, ee.attended_pairs(name, T, window))
    torch.testing.assert_close(weights.sum(-1), torch.ones(T))


def test_lsh_pairs_depend_on_the_data_and_skip_self():
    a = ee.attended_pairs("LSH", 128, 16, seed=0)
    b = ee.attended_pairs("LSH", 128, 16, seed=1)
    assert not torch.equal(a, b)
    assert not a.diagonal().any()  # every query has someone else in its window
    assert (a.sum(-1) <= 2 * 16).all()


def test_exact_covers_every_pair_and_linear_none():
    for name in ("exact", "flash", "pytorch"):
        assert ee.attended_pairs(name, 32).all()
        assert (ee.pair_picture(name, 4096, resolution=128) == 1).all()
    for name in ("linear", "performer"):
        assert ee.attended_pairs(name, 32) is None and ee.pair_share(name, 32) is None
        assert ee.pair_picture(name, 256).isnan().all()


@pytest.mark.parametrize("name", ["sliding window", "block sparse", "LSH", "exact", "flash"])
@pytest.mark.parametrize("T,window,R", [(256, 16, 32), (256, 4, 32), (256, 64, 16), (128, 16, 128), (200, 16, 50),
                                        (96, 40, 32)])
def test_picture_and_share_are_the_pooled_pairs(name, T, window, R):
    """The picture is computed without the (T, T) mask; it must equal pooling the mask."""
    pairs = ee.attended_pairs(name, T, window).float()  # (T, T)
    pic = ee.pair_picture(name, T, window, resolution=R)
    assert pic.shape == (R, R)
    if T % R == 0:
        expected = pairs.view(R, T // R, R, T // R).mean(dim=(1, 3))
    else:
        expected = torch.nn.functional.adaptive_avg_pool2d(pairs[None], R)[0]
    torch.testing.assert_close(pic, expected, atol=1e-6, rtol=0)
    assert ee.pair_share(name, T, window) == pytest.approx(pairs.double().mean().item(), abs=1e-12)


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="variant must be one of"):
        ee.attended_pairs("dense", 16)
    with pytest.raises(ValueError, match="'dense'"):
        attention_call("dense", *make_inputs(16))


def test_lsh_bucket_count_is_even_or_one():
    assert lsh_n_buckets(4096, 64) == 64
    assert lsh_n_buckets(64, 64) == 1
    assert lsh_n_buckets(192, 64) == 4


def test_every_variant_runs_and_the_exact_ones_agree():
    T = 128
    q, k, v = make_inputs(T)
    ref = attention_call("pytorch", q, k, v)()
    for name in ee.VARIANTS:
        out = attention_call(name, q, k, v, 16)()
        assert out.shape == (1, 2, T, 32)
        if name in ("exact", "flash"):
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_measure_costs_keys_and_values():
    costs = ee.measure_costs(["exact", "sliding window", "linear"], [64, 128], 8, rounds=1)
    assert set(costs) == {("exact", 64, None), ("exact", 128, None), ("sliding window", 64, 8),
                          ("sliding window", 128, 8), ("linear", 64, None), ("linear", 128, None)}
    for c in costs.values():
        assert c["time_s"] > 0 and c["peak_bytes"] > 0 and 0 < c["largest_bytes"] <= c["peak_bytes"]
    assert costs["exact", 128, None]["peak_bytes"] > costs["exact", 64, None]["peak_bytes"]


def test_explorer_sliding_window_data_and_figure(explorer):
    d = explorer.update(variant="sliding window", T=64, window=8)
    mask = sliding_window_mask(64, 8)
    torch.testing.assert_close(d["picture"], mask.float())
    assert d["pair_share"] == pytest.approx(mask.float().mean().item())
    image = explorer.figure.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.asarray(image), mask.float().numpy())
    for what in ("time_s", "peak_bytes"):
        assert set(d[what]) == {"variant", "exact", "pytorch"} and all(x > 0 for x in d[what].values())
    assert "sliding window" in explorer.caption_text() and "T = 64" in explorer.caption_text()
    px = assert_shows_something(figure_png(explorer.figure))
    assert px.shape[:2] == explorer.figure.canvas.get_width_height()[::-1]  # the whole figure, at its dpi


def test_explorer_exact_and_linear(explorer):
    d = explorer.update(variant="exact", T=128, window=16)
    assert d["pair_share"] == 1.0 and (d["picture"] == 1).all()
    assert d["time_s"]["variant"] > 0
    d = explorer.update(variant="linear", T=128)
    assert d["pair_share"] is None and d["picture"].isnan().all()
    texts = [t.get_text() for t in explorer.figure.axes[0].texts]
    assert any("no (query, key) score" in t for t in texts)
    assert "no pairs scored" in explorer.caption_text()


def test_explorer_bars_show_the_costs(explorer):
    d = explorer.update(variant="flash", T=256, window=16)
    time_ax, mem_ax = explorer.figure.axes[1], explorer.figure.axes[2]
    lo = 1e-2
    widths = [p.get_width() + lo for p in time_ax.patches]
    expected = [max(d["time_s"][r] * 1e3, lo * 1.0001) for r in ("variant", "exact", "pytorch")]
    np.testing.assert_allclose(widths, expected, rtol=1e-6)
    widths = [p.get_width() + lo for p in mem_ax.patches]
    expected = [max(d["peak_bytes"][r] / 2**20, lo * 1.0001) for r in ("variant", "exact", "pytorch")]
    np.testing.assert_allclose(widths, expected, rtol=1e-6)


def test_explorer_uses_given_measurements_without_measuring(monkeypatch):
    measured = {}
    for name in ee.VARIANTS + ("pytorch",):
        for T in (64, 256):
            measured[ee.cost_key(name, T, 16)] = {"time_s": 0.001 * T, "peak_bytes": 1000 * T}

    def refuse(*args, **kwargs):
        raise AssertionError("measured although the numbers were given")

    monkeypatch.setattr(ee, "measure_costs", refuse)
    ex = ee.efficient_explorer(measured, **SMALL)
    html = ex.static_html()
    assert html.count('class="ab-frame"') == len(ee.VARIANTS) * 2  # one per static (variant, T)
    d = ex.update(variant="LSH", T=256, window=16)
    assert d["time_s"] == {"variant": 0.256, "exact": 0.256, "pytorch": 0.256}
    with pytest.raises(AssertionError, match="measured although"):
        ex.update(T=128)  # not given: it would measure


def _given_costs(T_values=(64, 256), window=16):
    """Deterministic stand-in costs for every variant: different per role, so every bar moves."""
    costs = {}
    for n, name in enumerate(ee.VARIANTS + ("pytorch",)):
        for T in T_values:
            costs[ee.cost_key(name, T, window)] = {"time_s": 1e-5 * (n + 1) * T, "peak_bytes": 2000 * (n + 1) * T}
    return costs


@pytest.mark.parametrize("first, second", [
    (dict(variant="sliding window", T=64, window=16), dict(variant="LSH", T=256, window=16)),
    (dict(variant="exact", T=256, window=16), dict(variant="linear", T=256, window=16)),
    (dict(variant="flash", T=64, window=16), dict(variant="block sparse", T=64, window=16)),
])
def test_fast_frame_is_the_full_render(first, second):
    ex = ee.efficient_explorer(_given_costs(), **SMALL)
    assert_blit_matches_full_render(ex, first, second)


def test_static_html_has_one_frame_per_static_combination(explorer):
    html = explorer.static_html()
    assert html.count('class="ab-frame"') == len(ee.VARIANTS) * len(SMALL["static_t"]) * len(SMALL["static_windows"])
    assert 'class="attnbook-explorer"' in html and "<script" not in html
    assert html.count('class="ab-range"') == 2  # variant and T move; the window is fixed in the book


def test_live_widget_follows_the_controls(explorer):
    assert explorer.widget is not None  # builds the ipywidgets UI
    explorer._controls_w["variant"].value = "block sparse"
    explorer._controls_w["T"].value = 128
    assert explorer.values["variant"] == "block sparse" and explorer.data["T"] == 128
    assert_shows_something(explorer._image_w.value)
    assert "block sparse" in explorer._caption_w.value
