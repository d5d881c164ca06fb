"""attnbook.explorers.heads (chapter 3's explorer) without a browser: the per-head maps change with the head
count while the parameters do not, the figure draws every head's map, and the reader's global random
numbers are left alone. Runs under ipywidgets 8 and again under 7.7.1."""

import numpy as np
import pytest
import torch

from attnbook.explorers import heads_explorer
from attnbook.explorers.heads import SENTENCES
from tests.pixels import assert_blit_matches_full_render, assert_renders_live_and_static


def test_maps_change_with_the_count_but_parameters_do_not():
    ex = heads_explorer(d_model=32)
    maps, params = {}, set()
    for h in (1, 2, 4, 8):
        d = ex.update(num_heads=h)
        T = len(d["tokens"])
        assert d["weights"].shape == (h, T, T)
        torch.testing.assert_close(d["weights"].sum(-1), torch.ones(h, T))
        assert d["head_dim"] * h == 32
        tiles = torch.as_tensor(ex.figure.axes[0].images[0].get_array().filled(np.nan))
        ncols = min(h, 4) if h <= 16 else 8
        for head in range(h):  # every head's map is drawn in its tile, under a blank row for its name
            r, c = divmod(head, ncols)
            top = r * (T + 2) + 1
            torch.testing.assert_close(tiles[top: top + T, c * (T + 1): c * (T + 1) + T], d["weights"][head])
            assert torch.isnan(tiles[top - 1, c * (T + 1): c * (T + 1) + T]).all()
        words = [t.get_text() for t in ex.figure.axes[0].texts]
        rows = -(-h // ncols)
        for token in set(d["tokens"]):  # each word left of every row of tiles and under every column
            assert words.count(token) == d["tokens"].count(token) * (rows + ncols), token
        maps[h] = d["weights"]
        params.add(d["params"])
    assert len(params) == 1
    assert not torch.allclose(maps[1][0], maps[4][0], atol=1e-3)
    assert not torch.allclose(maps[4][0], maps[4][1], atol=1e-3)  # heads differ from each other
    d = ex.update(sentence=SENTENCES[1])
    assert d["tokens"] == SENTENCES[1].split()


def test_one_head_is_one_head():
    ex = heads_explorer()
    ex.update(num_heads=1)
    assert ex.caption_text().startswith("1 head × d_k = 32")
    assert ex.figure.texts[0].get_text().startswith("1 head of d_k = 32")
    ex.update(num_heads=2)
    assert ex.caption_text().startswith("2 heads × d_k = 16")


def test_renders_live_and_static():
    assert_renders_live_and_static(heads_explorer())


@pytest.mark.parametrize("first, second", [
    (dict(num_heads=4, sentence=SENTENCES[0]), dict(num_heads=4, sentence=SENTENCES[1])),
    (dict(num_heads=1), dict(num_heads=8)),
], ids=["heads", "heads-new-layout"])
def test_fast_frame_is_the_full_render(first, second):
    assert_blit_matches_full_render(heads_explorer(), first, second)


def test_leaves_the_global_random_numbers_alone():
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    ex = heads_explorer(seed=7)
    ex.update(num_heads=8)
    ex.static_html()
    assert torch.equal(torch.rand(5), expected)  # as if the explorer had never run
    a, b = heads_explorer(seed=7), heads_explorer(seed=7)
    torch.testing.assert_close(a.update(num_heads=2)["weights"], b.update(num_heads=2)["weights"])  # seeded
