"""attnbook.explorers.masks (chapter 4's explorer) without a browser: each mask kind is the mask
attnbook.masks builds, the weights respect it, and the figure shows it.
Runs under ipywidgets 8 and again under 7.7.1."""

import numpy as np
import pytest
import torch

from attnbook import causal_mask, padding_mask, sliding_window_mask
from attnbook.explorers import masks_explorer
from attnbook.explorers.masks import MASK_KINDS
from tests.pixels import assert_blit_matches_full_render, assert_renders_live_and_static


def test_shows_the_mask_it_applies():
    ex = masks_explorer()
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


@pytest.mark.parametrize("T, window, length", [(8, 2, 5), (12, 1, 12), (6, 0, 1)])
def test_each_kind_is_the_mask_attnbook_masks_builds(T, window, length):
    pad = padding_mask([length], max_len=T)[0, 0].expand(T, T)  # (T, S): every query sees the real keys
    expected = {
        "causal": causal_mask(T),
        "padding": pad,
        "sliding window": sliding_window_mask(T, window),
        "causal + padding": causal_mask(T) & pad,
        "causal + window": sliding_window_mask(T, window, causal=True),
    }
    assert sorted(expected) == sorted(MASK_KINDS)
    ex = masks_explorer()
    for kind in MASK_KINDS:
        d = ex.update(kind=kind, T=T, window=window, length=length)
        assert torch.equal(d["mask"], expected[kind]), kind
        assert d["allowed"] == int(expected[kind].sum()) and d["empty_rows"] == 0
        assert torch.all(d["weights"][~d["mask"]] == 0), kind
        torch.testing.assert_close(d["weights"].sum(-1), torch.ones(T))


def test_renders_live_and_static():
    assert_renders_live_and_static(masks_explorer())


def test_fast_frame_is_the_full_render():
    assert_blit_matches_full_render(masks_explorer(), dict(kind="padding", length=2),
                                    dict(kind="causal + window", window=0))


def test_the_real_length_goes_up_to_the_sequence_length():
    ex = masks_explorer()
    length = ex.control_widgets["length"]
    ex.update(kind="padding", T=8, length=7)
    assert [v for _, v in length.options] == [1, 2, 3, 4, 5, 6, 7, 8]
    ex.control_widgets["T"].value = 4  # a real length of 7 in 4 positions: it moves to 4, not silently cut
    assert ex.values["length"] == 4 and length.value == 4 and [v for _, v in length.options] == [1, 2, 3, 4]
    assert ex.data["allowed"] == 16 and "real length = 4" in ex.caption_text()
    ex.update(T=16, length=16)
    assert ex.values["length"] == 16 and [v for _, v in length.options][-2:] == [12, 16]


def test_the_window_goes_up_to_the_last_key():
    ex = masks_explorer()
    window = ex.control_widgets["window"]
    ex.update(kind="sliding window", T=4, window=4)
    assert ex.values["window"] == 3 and [v for _, v in window.options] == [0, 1, 2, 3]
    assert ex.data["allowed"] == 16  # a window of 3 in 4 positions already covers every key


@pytest.mark.parametrize("kind, off", [
    ("causal", {"window", "length"}), ("padding", {"window"}), ("sliding window", {"length"}),
    ("causal + padding", {"window"}), ("causal + window", {"length"}),
])
def test_the_controls_a_mask_ignores_are_disabled(kind, off):
    ex = masks_explorer()
    controls = ex.control_widgets
    controls["kind"].value = kind
    assert {name for name in ("window", "length") if controls[name].disabled} == off
    assert {c.name for c in ex.unused()} == off
    cap = ex.caption_text()
    assert ("window =" in cap) == ("window" not in off) and ("real length =" in cap) == ("length" not in off)
    for name in off:  # moving it changes nothing
        before = ex.image_widget.value
        ex.update(**{name: 1})
        assert ex.image_widget.value == before
