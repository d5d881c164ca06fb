"""attnbook.explorers.induction (chapter 15's explorer) without a browser: what it shows is the snapshot's own
attention and scores, the fast frames equal full renders, frames are readable, and the scrubber has a frame
per static combination."""

import pytest
import torch

from attnbook.circuits import prefix_matching_scores, repeated_sequences, train_induction
from attnbook.explorers import induction_explorer
from tests.pixels import assert_blit_matches_full_render, assert_frame_readable, assert_shows_something


@pytest.fixture(scope="module")
def run():
    _, hist = train_induction(num_layers=2, num_heads=2, d_model=16, vocab_size=16, seq_len=24, min_length=6,
                              steps=40, every=10, batch_size=8, eval_size=16)
    batch = repeated_sequences(4, 24, 16, min_length=6, generator=torch.Generator().manual_seed(0))
    return hist, batch


def test_shows_the_snapshots_attention_and_scores(run):
    hist, batch = run
    ex = induction_explorer(hist, batch, index=2)
    ex.update(step=20, layer=2, head=2)
    model = hist.model_at(hist.steps.index(20))
    one = repeated_sequences(4, 24, 16, min_length=6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        w = model(one.tokens)[1][1]  # (B, H, T, T)
    assert torch.allclose(torch.from_numpy(ex.data["map"]), w[2, 1], atol=1e-6)
    sub = type(one)(one.tokens[2:3], one.start[2:3], one.length[2:3])
    assert ex.data["prefix_matching"] == pytest.approx(float(prefix_matching_scores(w[2:3], sub)[1]), abs=1e-6)
    assert ex.data["loss"] == hist.repeat_loss[hist.steps.index(20)]


def test_fast_frames_match_full_renders_and_are_readable(run):
    hist, batch = run
    ex = induction_explorer(hist, batch)
    assert_blit_matches_full_render(ex, {"step": 0, "layer": 1, "head": 1}, {"step": 40, "layer": 2, "head": 2})
    assert_frame_readable(ex.figure, "induction explorer", pixels=True)


def test_static_scrubber_has_a_frame_per_static_combination(run):
    hist, batch = run
    ex = induction_explorer(hist, batch, static_steps=3)
    assert ex.control("step").static_values == [0, 20, 40]
    html = ex.static_html()
    assert html.count('class="ab-frame"') == 3 * 2 * 2
    frames = list(ex.frames())
    assert len({png for _, png, _ in frames}) == len(frames)


def test_live_widget_follows_the_controls(run):
    hist, batch = run
    ex = induction_explorer(hist, batch)
    ex.control_widgets["step"].value = 10
    ex.control_widgets["head"].value = 2
    assert ex.data["step"] == 10 and ex.data["head"] == 2
    assert "Step 10, layer 2, head 2" in ex.caption_widget.value
    assert_shows_something(ex.image_widget.value)


def test_errors(run):
    hist, batch = run
    with pytest.raises(TypeError, match="InductionHistory"):
        induction_explorer(object(), batch)
    with pytest.raises(ValueError, match="outside the batch of 4"):
        induction_explorer(hist, batch, index=4)
