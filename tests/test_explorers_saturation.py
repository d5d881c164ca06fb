"""attnbook.explorers.saturation (chapter 2's explorer) without a browser: set the controls, check what the
figure and the numbers hold; the device control every explorer shares. The statistics themselves
(attnbook.core.softmax_stats) are tested in test_core_softmax_stats.py.
Runs under ipywidgets 8 and again under 7.7.1."""

import math

import numpy as np
import pytest
import torch

from attnbook.explorers import saturation_explorer
from attnbook.explorers.saturation import DK_VALUES
from tests.pixels import assert_blit_matches_full_render, assert_renders_live_and_static


@pytest.fixture(scope="module")
def saturation():
    return saturation_explorer()


def test_unscaled_entropy_falls_as_d_k_grows(saturation):
    ent = {dk: saturation.update(d_k=dk, scaled=False)["entropy"] for dk in (1, 16, 256, 1024)}
    assert ent[1] > ent[16] > ent[256] > ent[1024]
    assert ent[1024] < 0.3 * math.log(16)  # nearly one-hot
    mw = saturation.update(d_k=1024, scaled=False)["max_weight"]
    assert mw > 0.9


def test_scaled_entropy_stays_near_level(saturation):
    ent = [saturation.update(d_k=dk, scaled=True)["entropy"] for dk in DK_VALUES]
    assert max(ent) - min(ent) < 0.15
    assert min(ent) > 0.8 * math.log(16)


def test_gradient_norm_vanishes_only_without_scaling(saturation):
    g_unscaled = saturation.update(d_k=1024, scaled=False)["grad_norm"]
    g_scaled = saturation.update(d_k=1024, scaled=True)["grad_norm"]
    assert g_unscaled < 0.25 * g_scaled


def test_logit_spread_follows_sqrt_d_k(saturation):
    for dk in (4, 64, 1024):
        std = saturation.update(d_k=dk, scaled=False)["logit_std"]
        assert abs(std / math.sqrt(dk) - 1) < 0.1
        assert abs(saturation.update(d_k=dk, scaled=True)["logit_std"] - 1) < 0.1


def test_saturation_figure_marks_the_current_d_k(saturation):
    saturation.update(d_k=256, scaled=False, T=32)
    fig = saturation.figure
    a1, a2, a3, a4 = fig.axes
    assert len(a2.patches) == 32  # one bar per key
    np.testing.assert_allclose(sum(p.get_height() for p in a2.patches), 1.0, atol=1e-6)
    marks = [ln for ln in a3.lines if list(ln.get_xdata()) == [256, 256]]
    assert marks, "the current d_k is not marked on the entropy plot"
    assert "unscaled" in saturation.caption_text() and "d_k = 256" in saturation.caption_text()
    saturation.update(T=16)


def test_renders_live_and_static():
    assert_renders_live_and_static(saturation_explorer())


@pytest.mark.parametrize("first, second", [
    (dict(d_k=1, scaled=True), dict(d_k=1024, scaled=False)),
    (dict(T=16, d_k=4), dict(T=16, d_k=256)),
], ids=["saturation", "saturation-same-layout"])
def test_fast_frame_is_the_full_render(first, second):
    assert_blit_matches_full_render(saturation_explorer(), first, second)


def test_device_control_offers_what_is_present():
    ex = saturation_explorer()
    devices = ex.control("device").values
    assert devices[0] == "cpu"
    assert ("cuda" in devices) == torch.cuda.is_available()
    for dev in devices:
        d = ex.update(device=dev, d_k=64, scaled=True)
        assert d["device"] == dev and math.isfinite(d["entropy"])


@pytest.mark.parametrize("d_k", [1, 64, 1024])
def test_the_legend_lies_where_the_d_k_mark_never_goes(d_k):
    ex = saturation_explorer()
    ex.update(d_k=d_k)
    fig = ex.figure
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    labels = [t.get_text() for t in legend.get_texts()]
    assert "unscaled" in labels and "current d_k" in labels
    for ax in fig.axes:  # the marks and the curves stay inside their axes; the legend is under all of them
        assert not box.overlaps(ax.get_window_extent(renderer)), ax.get_title()
    assert all(t.get_fontsize() >= 10 for t in legend.get_texts())
