"""The explorers of chapters 2 to 5 (attnbook.explorers.saturation, heads, masks, positions),
driven without a browser: set the controls, check what the figures, pictures and numbers hold.
Runs under ipywidgets 8 and again under 7.7.1."""

import math

import numpy as np
import pytest
import torch

from attnbook.explorers import heads, masks, positions
from attnbook.explorers import saturation as sat
from attnbook.explorers.base import figure_png
from tests.pixels import assert_blit_matches_full_render, assert_shows_something


@pytest.fixture(scope="module")
def saturation():
    return sat.saturation_explorer()


def test_unscaled_entropy_falls_as_d_k_grows(saturation):
    ent = {dk: saturation.update(d_k=dk, scaled=False)["entropy"] for dk in (1, 16, 256, 1024)}
    assert ent[1] > ent[16] > ent[256] > ent[1024]
    assert ent[1024] < 0.3 * math.log(16)  # nearly one-hot
    mw = saturation.update(d_k=1024, scaled=False)["max_weight"]
    assert mw > 0.9


def test_scaled_entropy_stays_near_level(saturation):
    ent = [saturation.update(d_k=dk, scaled=True)["entropy"] for dk in sat.DK_VALUES]
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


def test_softmax_stats_matches_autograd_jacobian():
    z = torch.randn(3, 5, dtype=torch.float64)
    stats = sat.softmax_stats(z)
    norms = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), row).norm() for row in z]
    assert abs(stats["grad_norm"] - torch.stack(norms).mean().item()) < 1e-10


def test_head_explorer_maps_change_with_the_count_but_parameters_do_not():
    ex = heads.heads_explorer(d_model=32)
    maps, params = {}, set()
    for h in (1, 2, 4, 8):
        d = ex.update(num_heads=h)
        T = len(d["tokens"])
        assert d["weights"].shape == (h, T, T)
        torch.testing.assert_close(d["weights"].sum(-1), torch.ones(h, T))
        assert d["head_dim"] * h == 32
        tiles = torch.as_tensor(ex.figure.axes[0].images[0].get_array().filled(np.nan))
        ncols = min(h, 8)
        for head in range(h):  # every head's map is drawn in its tile
            r, c = divmod(head, ncols)
            torch.testing.assert_close(tiles[r * (T + 1): r * (T + 1) + T, c * (T + 1): c * (T + 1) + T],
                                       d["weights"][head])
        maps[h] = d["weights"]
        params.add(d["params"])
    assert len(params) == 1
    assert not torch.allclose(maps[1][0], maps[4][0], atol=1e-3)
    assert not torch.allclose(maps[4][0], maps[4][1], atol=1e-3)  # heads differ from each other
    d = ex.update(sentence=heads.SENTENCES[1])
    assert d["tokens"] == heads.SENTENCES[1].split()


def test_mask_explorer_shows_the_mask_it_applies():
    ex = masks.masks_explorer()
    d = ex.update(kind="causal", T=8)
    assert torch.equal(d["mask"], torch.ones(8, 8, dtype=torch.bool).tril())
    assert torch.all(d["weights"][~d["mask"]] == 0)
    d = ex.update(kind="causal + padding", length=3)
    assert torch.all(d["weights"][:, 3:] == 0) and d["allowed"] == 1 + 2 + 3 * 6
    d = ex.update(kind="sliding window", window=1)
    assert d["allowed"] == 8 + 2 * 7
    d = ex.update(kind="causal + window", window=0)
    torch.testing.assert_close(d["weights"], torch.eye(8))
    assert np.array_equal(ex.figure.axes[0].images[0].get_array(), d["mask"].numpy())


def test_position_explorer_similarity_depends_on_distance_only():
    ex = positions.positions_explorer(T=16)
    for kind in ("sinusoidal", "RoPE"):
        for offset in (0, 1000):
            s = ex.update(kind=kind, offset=offset, d_model=32)["similarity"]
            for k in range(1, 4):
                diag = torch.diagonal(s, offset=k)
                assert diag.max() - diag.min() < 1e-3, (kind, offset, k)
    s0 = ex.update(kind="sinusoidal", offset=0)["similarity"]
    s1 = ex.update(kind="sinusoidal", offset=1000)["similarity"]
    torch.testing.assert_close(s0, s1, atol=2e-3, rtol=0)
    d = ex.update(kind="ALiBi")
    assert d["similarity"][3, 3] == 0 and d["similarity"][3, 0] < d["similarity"][3, 2] < 0


@pytest.mark.parametrize("factory", [sat.saturation_explorer, heads.heads_explorer, masks.masks_explorer, positions.positions_explorer])
def test_each_explorer_renders_live_and_static(factory):
    ex = factory()
    assert_shows_something(figure_png(ex.figure))
    box = ex.widget
    assert box.children
    assert_shows_something(ex._image_w.value)
    first = next(iter(ex._controls_w.values()))
    options = [v for _, v in first.options] if isinstance(first.options[0], tuple) else list(first.options)
    before = ex._image_w.value
    first.value = options[-1] if first.value != options[-1] else options[0]
    assert ex._image_w.value != before
    html = ex.static_html()
    n_frames = math.prod(len(c.static) for c in ex.controls)
    assert html.count('class="ab-frame"') == n_frames
    assert len(html) < 1_500_000


@pytest.mark.parametrize("factory, first, second", [
    (sat.saturation_explorer, dict(d_k=1, scaled=True), dict(d_k=1024, scaled=False)),
    (sat.saturation_explorer, dict(T=16, d_k=4), dict(T=16, d_k=256)),
    (heads.heads_explorer, dict(num_heads=4, sentence=heads.SENTENCES[0]), dict(num_heads=4, sentence=heads.SENTENCES[1])),
    (heads.heads_explorer, dict(num_heads=1), dict(num_heads=8)),
    (masks.masks_explorer, dict(kind="padding", length=2), dict(kind="causal + window", window=0)),
    (positions.positions_explorer, dict(kind="RoPE", d_model=16), dict(kind="ALiBi", d_model=16, offset=1000)),
    (positions.positions_explorer, dict(kind="sinusoidal", d_model=64), dict(kind="learned (untrained)", d_model=64)),
], ids=["saturation", "saturation-same-layout", "heads", "heads-new-layout", "masks", "positions", "positions-learned"])
def test_fast_frame_is_the_full_render(factory, first, second):
    assert_blit_matches_full_render(factory(), first, second)


def test_device_control_offers_what_is_present():
    ex = sat.saturation_explorer()
    devices = ex.control("device").values
    assert devices[0] == "cpu"
    assert ("cuda" in devices) == torch.cuda.is_available()
    for dev in devices:
        d = ex.update(device=dev, d_k=64, scaled=True)
        assert d["device"] == dev and math.isfinite(d["entropy"])


def test_head_explorer_leaves_the_global_random_numbers_alone():
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    ex = heads.heads_explorer(seed=7)
    ex.update(num_heads=8)
    ex.static_html()
    assert torch.equal(torch.rand(5), expected)  # as if the explorer had never run
    a, b = heads.heads_explorer(seed=7), heads.heads_explorer(seed=7)
    torch.testing.assert_close(a.update(num_heads=2)["weights"], b.update(num_heads=2)["weights"])  # seeded
