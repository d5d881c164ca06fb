"""attnbook.explorers.positions (chapter 5's explorer) without a browser: the similarity of two positions'
encodings depends only on their distance (sinusoidal, RoPE), ALiBi's bias falls with it.
Runs under ipywidgets 8 and again under 7.7.1."""

import pytest
import torch

from attnbook.explorers import positions_explorer
from tests.pixels import assert_blit_matches_full_render, assert_renders_live_and_static


def test_similarity_depends_on_distance_only():
    ex = positions_explorer(T=16)
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


def test_renders_live_and_static():
    assert_renders_live_and_static(positions_explorer())


@pytest.mark.parametrize("first, second", [
    (dict(kind="RoPE", d_model=16), dict(kind="ALiBi", d_model=16, offset=1000)),
    (dict(kind="sinusoidal", d_model=64), dict(kind="learned (untrained)", d_model=64)),
], ids=["positions", "positions-learned"])
def test_fast_frame_is_the_full_render(first, second):
    assert_blit_matches_full_render(positions_explorer(), first, second)


def test_alibi_disables_what_it_does_not_use():
    ex = positions_explorer()
    controls = ex.control_widgets
    controls["kind"].value = "ALiBi"
    assert controls["d_model"].disabled and controls["offset"].disabled and not controls["kind"].disabled
    assert "d_model and position offset do not apply here" in ex.caption_text()
    assert "d_model" not in ex.figure.texts[0].get_text()
    before = ex.image_widget.value
    controls["d_model"].value = 16
    controls["offset"].value = 1000
    assert ex.image_widget.value == before  # nothing to change indeed
    controls["kind"].value = "RoPE"
    assert not controls["d_model"].disabled and not controls["offset"].disabled
