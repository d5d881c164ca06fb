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
