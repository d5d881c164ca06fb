"""attnbook.explorers.variants (chapter 8's explorer) without a browser: the choices it offers, its data
(the variant's declared pairs and measured costs), figure, static frames and live widget. The pairs, the
pictures and the costs themselves are attnbook.efficient's, tested in test_efficient_pairs.py.

Dimension legend: B batch, H heads, T sequence length, D head dim.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.text import Text

from attnbook import sliding_window_mask
from attnbook.efficient import REGISTRY, attention_call, cost_key, make_inputs, pair_picture, pair_share
from attnbook.explorers import variants as ee
from attnbook.explorers import variants_explorer
from attnbook.explorers.base import figure_png
from attnbook.explorers.variants import T_VALUES, VARIANTS, WINDOWS
from tests.helpers import fake_efficient_costs
from tests.pixels import assert_blit_matches_full_render, assert_shows_something

SMALL = dict(t_values=(64, 128, 256), windows=(8, 16), static_t=(64, 256), static_windows=(16,), rounds=1, resolution=64)


@pytest.fixture(scope="module")
def explorer():
    return variants_explorer(**SMALL)


def test_the_choices_are_the_registrys_variants_and_the_constants():
    assert VARIANTS == tuple(name for name in REGISTRY if name != "pytorch")  # PyTorch's kernel is a reference
    ex = variants_explorer(fake_efficient_costs((256, 1024, 4096), 64))  # as chapter 8 builds it: no measuring
    assert ex.control("variant").values == list(VARIANTS)
    assert ex.control("T").values == list(T_VALUES) and ex.control("window").values == list(WINDOWS)
    assert ex.values == {"variant": "sliding window", "T": 1024, "window": 64}


def test_the_data_are_the_variants_declared_pairs(explorer):
    for name, T, window in (("LSH", 256, 16), ("block sparse", 128, 8), ("sliding window", 64, 16)):
        d = explorer.update(variant=name, T=T, window=window)
        torch.testing.assert_close(d["picture"], pair_picture(name, T, window, resolution=SMALL["resolution"]))
        assert d["pair_share"] == pair_share(name, T, window)
        texts = [t.get_text() for t in explorer.figure.findobj(Text)]
        assert d["uses_window"] and f"{name}, {REGISTRY[name].window} {window}, T = {T}" in texts


def test_every_variant_runs_and_the_exact_ones_agree():
    T = 128
    q, k, v = make_inputs(T)
    ref = attention_call("pytorch", q, k, v)()
    for name in VARIANTS:
        out = attention_call(name, q, k, v, 16)()
        assert out.shape == (1, 2, T, 32)
        if name in ("exact", "flash"):
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


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
    for name in VARIANTS + ("pytorch",):
        for T in (64, 256):
            measured[cost_key(name, T, 16)] = {"time_s": 0.001 * T, "peak_bytes": 1000 * T}

    def refuse(*args, **kwargs):
        raise AssertionError("measured although the numbers were given")

    monkeypatch.setattr(ee, "measure_costs", refuse)
    ex = variants_explorer(measured, **SMALL)
    html = ex.static_html()
    assert html.count('class="ab-frame"') == len(VARIANTS) * 2  # one per static (variant, T)
    d = ex.update(variant="LSH", T=256, window=16)
    assert d["time_s"] == {"variant": 0.256, "exact": 0.256, "pytorch": 0.256}
    with pytest.raises(AssertionError, match="measured although"):
        ex.update(T=128)  # not given: it would measure


@pytest.mark.parametrize("first, second", [
    (dict(variant="sliding window", T=64, window=16), dict(variant="LSH", T=256, window=16)),
    (dict(variant="exact", T=256, window=16), dict(variant="linear", T=256, window=16)),
    (dict(variant="flash", T=64, window=16), dict(variant="block sparse", T=64, window=16)),
])
def test_fast_frame_is_the_full_render(first, second):
    ex = variants_explorer(fake_efficient_costs((64, 256), 16), **SMALL)
    assert_blit_matches_full_render(ex, first, second)


def test_static_html_has_one_frame_per_static_combination(explorer):
    html = explorer.static_html()
    assert html.count('class="ab-frame"') == len(VARIANTS) * len(SMALL["static_t"]) * len(SMALL["static_windows"])
    assert 'class="attnbook-explorer"' in html and "<script" not in html
    assert html.count('class="ab-range"') == 2  # variant and T move; the window is fixed in the book


def test_live_widget_follows_the_controls(explorer):
    controls = explorer.control_widgets  # builds the ipywidgets UI
    controls["variant"].value = "block sparse"
    controls["T"].value = 128
    assert explorer.values["variant"] == "block sparse" and explorer.data["T"] == 128
    assert_shows_something(explorer.image_widget.value)
    assert "block sparse" in explorer.caption_widget.value


def test_stored_and_live_numbers_are_one_statistic_and_say_when_they_were_measured(monkeypatch):
    """The numbers chapter 8 measured (the median of interleaved rounds) are the book's: its frames say they
    were measured when the page was built. Live, a combination not measured yet is measured by the same
    statistic (``reduce="median"``), with a message while it runs, and the caption says which numbers are new."""
    asked = []
    fake = fake_efficient_costs((64, 128, 256), 16)

    def measure(names, t_values, window, **kwargs):
        asked.append((tuple(names), tuple(t_values), window, kwargs["reduce"], kwargs["rounds"]))
        return {cost_key(n, T, window): fake[cost_key(n, T, 16)] for n in names for T in t_values}

    monkeypatch.setattr(ee, "measure_costs", measure)
    stored = {k: v for k, v in fake.items() if k[1] in (64, 256) or k[0] == "LSH"}
    ex = variants_explorer(stored, **{**SMALL, "rounds": 5})
    html = ex.static_html()
    assert not asked and html.count("measured when the page was built") == len(VARIANTS) * 2
    assert "just now" not in html and "median of interleaved rounds" in html
    assert "measured earlier in this notebook" in ex.caption_widget.value
    messages = []
    ex.caption_widget.observe(lambda change: messages.append(change["new"]), names="value")
    ex.control_widgets["T"].value = 128  # not measured yet: the variant, exact and PyTorch's kernel
    assert sorted(a[0][0] for a in asked) == ["exact", "pytorch", "sliding window"]
    assert all(a[1:] == ((128,), 16, "median", 5) for a in asked)
    assert "measuring sliding window, exact, pytorch at T = 128" in messages[0]
    assert "measured just now, on this machine" in ex.caption_widget.value
    asked.clear()
    ex.control_widgets["variant"].value = "LSH"  # stored at T = 128; exact and PyTorch's were measured above
    assert not asked
    assert "exact and pytorch measured just now on this machine, the rest earlier" in ex.caption_widget.value
    messages.clear()
    ex.control_widgets["T"].value = 64  # stored: no measuring, no message
    assert not asked and not any("measuring" in m for m in messages)


def test_the_window_is_disabled_for_the_variants_without_one():
    ex = variants_explorer(fake_efficient_costs((64, 128, 256), 16), **SMALL)
    window = ex.control_widgets["window"]
    for name in VARIANTS:
        ex.control_widgets["variant"].value = name
        assert window.disabled == (REGISTRY[name].window is None), name
        assert ("window / block does not apply here" in ex.caption_text()) == window.disabled
