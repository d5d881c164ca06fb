"""attnbook.explorers.block_mask (chapter 13's explorer) without a browser: the tiles it colours are
attnbook.masks.block_mask_stats's, its dense picture is the program's dense mask, every control value renders
with its texts whole, apart and at least 9 px, the fast frames equal full renders, the scrubber has a frame per
static combination, and without FlexAttention it shows the same tiles, counted from the dense mask, and says so.
The counting itself is tested in test_masks_flex.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnbook.masks
from attnbook.explorers import block_mask as bm
from attnbook.explorers import block_mask_explorer
from attnbook.masks import (
    TILE_KINDS,
    block_mask_stats,
    causal_mask_mod,
    dense_mask,
    document_ids,
    document_mask_mod,
    sliding_window_mask_mod,
)
from tests.pixels import (
    assert_blit_matches_full_render,
    assert_frame_readable,
    assert_shows_something,
    assert_texts_fit,
)


@pytest.fixture(scope="module")
def explorer():
    return block_mask_explorer()


def _images(explorer):
    """The dense picture and the tile grid (the two images, in build's order)."""
    a1, a2 = explorer.figure.axes[:2]
    return a1.images[0], a2.images[0]


def _texts(explorer):
    page = explorer.figure.axes[-1]
    return page.texts[0].get_text(), page.texts[1].get_text()


def test_controls():
    ex = block_mask_explorer()
    assert ex.control("program").values == list(bm.MASK_PROGRAMS) and ex.control("program").kind == "dropdown"
    assert ex.control("T").values == [256, 512, 1024, 2048]
    assert ex.values == {"program": "sliding window", "T": 2048}
    assert ex.control("T").static_values == [512, 2048]  # 12 frames in the book


@pytest.mark.parametrize("program, T, mod", [
    ("causal", 1024, causal_mask_mod(1024)),
    ("sliding window", 2048, sliding_window_mask_mod(bm.WINDOW, causal=True)),
    ("document", 512, document_mask_mod(document_ids([192, 64, 128, 128]))),
])
def test_tiles_shown_are_block_mask_stats(explorer, program, T, mod):
    d = explorer.update(program=program, T=T)
    st = block_mask_stats(mod, T)
    picture, tiles = _images(explorer)
    assert np.array_equal(tiles.get_array(), st["tiles"][0, 0].numpy())
    assert (d["skipped"], d["partial"], d["full"], d["total"]) == (st["skipped"], st["partial"], st["full"], st["total"])
    # the picture is the dense mask, pooled to at most 256 x 256 pixels (share of pairs allowed per pixel)
    mask = dense_mask(mod, 1, 1, T)[0, 0].float()  # (T, S)
    P = min(T, 256)
    np.testing.assert_allclose(picture.get_array(), F.adaptive_avg_pool2d(mask[None], P)[0].numpy())
    title, note = _texts(explorer)
    assert f"T = {T:,}: {st['skipped']} of {st['total']} tiles skipped ({st['skipped_share']:.0%})" in title
    assert note.startswith("tiles from torch's create_block_mask" if attnbook.masks.flex_available() else
                           "FlexAttention unavailable")


def test_known_shares_in_title_and_caption(explorer):
    explorer.update(program="sliding window", T=2048)
    assert _texts(explorer)[0] == "causal sliding window (256 keys back), T = 2,048: 211 of 256 tiles skipped (82%)"
    cap = explorer.caption_text()
    assert "211 of 256 tiles skipped (82.4%), 30 partial, 15 full" in cap
    explorer.update(program="causal", T=512)
    assert "6 of 16 tiles skipped (37.5%), 4 partial, 6 full" in explorer.caption_text()
    explorer.update(program="padding", T=256)  # 160 real keys: no tile is empty
    assert "0 of 4 tiles skipped (0.0%)" in explorer.caption_text()


def test_legend_names_the_three_kinds(explorer):
    legend = explorer.figure.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert [label.split(" ")[0] for label in labels] == ["full", "partial", "skipped"]
    assert set(TILE_KINDS) == {"skipped", "partial", "full"}


def test_every_control_value_renders_with_readable_texts(explorer):
    """All 6 x 4 combinations: a picture, every text inside the figure and apart from the others, none under
    9 pt (9 px at the figure's 72 dpi), no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for program in bm.MASK_PROGRAMS:
            for T in bm.LENGTHS:
                explorer.update(program=program, T=T)
                assert_frame_readable(explorer.figure, f"{program} at {T}", pixels=T == 2048)


@pytest.mark.parametrize("first, second", [
    (dict(program="causal", T=2048), dict(program="document", T=2048)),
    (dict(program="prefix-LM", T=512), dict(program="causal + padding", T=512)),
    (dict(program="padding", T=1024), dict(program="sliding window", T=256)),  # another layout
])
def test_fast_frame_is_the_full_render(explorer, first, second):
    assert_blit_matches_full_render(explorer, first, second)


def test_one_figure_per_length(explorer):
    explorer.update(program="causal", T=1024)
    fig = explorer.figure
    explorer.update(program="document", T=1024)
    assert explorer.figure is fig
    explorer.update(T=512)
    assert explorer.figure is not fig  # the tile boundaries differ


def test_static_html_is_a_scrubber():
    ex = block_mask_explorer(static_lengths=(256, 2048))
    html = ex.static_html()
    assert html.count('class="ab-frame"') == len(bm.MASK_PROGRAMS) * 2
    assert html.count('class="ab-range"') == 2
    assert "<script" not in html and len(html) < 1_500_000
    frames = list(ex.frames())
    assert len({png for _, png, _ in frames}) == len(frames)
    assert frames[0][0] == {"program": "causal", "T": 256}
    assert ex.values == {"program": "sliding window", "T": 2048}  # restored after the frames


def test_frames_hand_matplotlib_no_tensors(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "__array__", lambda self, *a, **k: calls.append(1) or self.numpy())
    ex = block_mask_explorer(lengths=(256, 512), static_lengths=(512,))
    assert len(list(ex.frames())) == len(bm.MASK_PROGRAMS) and not calls


def test_live_widget_follows_the_controls(explorer):
    widgets = explorer.control_widgets
    widgets["program"].value = "document"
    widgets["T"].value = 1024
    assert explorer.data["program"] == "document" and explorer.data["T"] == 1024
    assert_shows_something(explorer.image_widget.value)
    assert "51 of 64 tiles skipped" in explorer.caption_widget.value


def test_without_flex_the_same_tiles_come_from_the_dense_mask(monkeypatch, explorer):
    explorer.update(program="document", T=2048)
    with_flex = explorer.data["tile_grid"].copy()
    monkeypatch.setattr(attnbook.masks, "flex_available", lambda: False)
    ex = block_mask_explorer(lengths=(2048,), static_lengths=(2048,))
    d = ex.update(program="document")
    assert d["method"] == "dense"
    assert np.array_equal(d["tile_grid"], with_flex)
    assert _texts(ex)[1].startswith("FlexAttention unavailable (torch < 2.5): tiles counted from the dense mask")
    assert "Tiles from the dense mask (FlexAttention is unavailable here)." in ex.caption_text()
    assert_texts_fit(ex.figure, "without flex")


def test_errors():
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        block_mask_explorer(block_size=0)
    with pytest.raises(ValueError, match="lengths must be multiples of 8"):
        block_mask_explorer(lengths=(260,), static_lengths=(260,))
    with pytest.raises(ValueError, match=r"static_lengths must be among lengths \[256, 512\], got \[1024\]"):
        block_mask_explorer(lengths=(256, 512), static_lengths=(1024,))
    ex = block_mask_explorer(lengths=(256,), static_lengths=(256,))
    with pytest.raises(ValueError, match="mask program='dilated' is not one of"):
        ex.update(program="dilated")
