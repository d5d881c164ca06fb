"""Every static frame of every explorer, as the book stores it, checked for what a reader would see wrong:
a text cut off at the figure's edge or lying over another text, a text under 10 px as displayed or a
figure wider than the book's column (tests/pixels.py's ``assert_frame_readable``), a tensor handed to
matplotlib instead of a NumPy array (NumPy's deprecation of ``__array__`` without a copy keyword under older
torch), and any warning while the frames render.

The explorers are built as their chapters build them, with deterministic stand-ins for what the chapters
measure (timings) or train (the toy models are untrained here: the layout does not depend on the weights).
MiniLM's needs the model files and is marked slow.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas

from attnbook.explorers import (
    block_mask_explorer,
    heads_explorer,
    kv_budget_explorer,
    kv_heads_explorer,
    masks_explorer,
    positions_explorer,
    saturation_explorer,
    trained_heads_explorer,
    variants_explorer,
    vit_explorer,
)
from attnbook.explorers.base import Explorer
from attnbook.explorers.kv_heads import HEADS, SEQ_LENS
from attnbook.tasks import addition_task, copy_task, reverse_task
from tests.helpers import fake_decode_timings, fake_efficient_costs, tiny_seq2seq
from tests.pixels import assert_frame_readable


def _trained_heads() -> Explorer:
    tasks = {"copy": copy_task(length=10), "reverse": reverse_task(length=10), "addition": addition_task(num_digits=3)}
    models = {name: (tiny_seq2seq(task, d_model=64, num_heads=4).eval(), task) for name, task in tasks.items()}
    examples = {"copy": ["3141592653", "0123456789", "7777733333"],
                "reverse": ["3141592653", "0123456789", "7777733333"],
                "addition": ["123+456", "999+001", "505+495"]}
    return trained_heads_explorer(models, examples)


def _vit() -> Explorer:
    from attnbook.vision import VisionTransformer, hand_drawn_digits

    torch.manual_seed(0)
    images, labels = hand_drawn_digits()  # an untrained model: the layout does not depend on the weights
    return vit_explorer(VisionTransformer(num_layers=2, dim_feedforward=96), images, labels, static_digits=2)


EXPLORERS = {  # as chapters 2, 3, 4, 5, 7, 8, 9, 11, 12 and 13 build them
    "saturation": saturation_explorer,
    "heads": heads_explorer,
    "masks": masks_explorer,
    "positions": positions_explorer,
    "trained_heads": _trained_heads,
    "variants": lambda: variants_explorer(fake_efficient_costs((256, 1024, 4096), 64)),
    "kv_heads": lambda: kv_heads_explorer(fake_decode_timings(HEADS, SEQ_LENS), static_num_heads=(8, 32),
                                static_seq_len=(4096, 32768)),
    "vit": _vit,
    "kv_budget": kv_budget_explorer,
    "block_mask": block_mask_explorer,
}


@pytest.fixture
def no_tensor_to_numpy(monkeypatch):
    """Fail on any ``numpy.asarray(tensor)``: matplotlib must be handed arrays (``tensor.numpy()``)."""
    calls = []

    def refuse(self, *args, **kwargs):
        import traceback

        calls.append("".join(traceback.format_stack(limit=6)[:-1]))
        return self.detach().cpu().numpy()

    monkeypatch.setattr(torch.Tensor, "__array__", refuse)
    return calls


def check_every_frame(explorer: Explorer, calls: list) -> int:
    n = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for values, png, _ in explorer.frames():
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
            assert_frame_readable(explorer.figure, f"{explorer.title} {values}")
            n += 1
    assert not calls, f"{explorer.title}: a tensor was handed to NumPy/matplotlib:\n{calls[0]}"
    return n


@pytest.mark.parametrize("name", list(EXPLORERS))
def test_every_static_frame_shows_its_texts_whole_and_apart(name, no_tensor_to_numpy):
    assert check_every_frame(EXPLORERS[name](), no_tensor_to_numpy) >= 2


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16, 32])
def test_every_head_count_fits(num_heads):
    """The heads explorer's scrubber shows 1 to 32 heads; the live one the same: every layout's words fit and
    read, four tiles a row with a word on every row (32 heads: eight a row, a word on every other row)."""
    ex = heads_explorer()
    d = ex.update(num_heads=num_heads)
    assert_frame_readable(ex.figure, f"{num_heads} heads")
    w, h = ex.figure.get_size_inches()
    assert 3.5 <= w <= 9.6 and h <= 9.5, f"{num_heads} heads: a {w:.1f} x {h:.1f} inch figure"
    words = [t.get_text() for t in ex.figure.axes[0].texts if not t.get_text().startswith("head")]
    ncols = min(num_heads, 4) if num_heads <= 16 else 8
    labelled = (-(-num_heads // ncols) + ncols) * len(d["tokens"])
    assert len(words) == (labelled if num_heads <= 16 else sum(1 for _ in range(0, len(d["tokens"]), 2)) * (4 + 8))


def test_a_long_sentence_keeps_the_heads_words_readable():
    long = " ".join(["the cat sat on the mat because it was tired"] * 3)  # 30 words
    ex = heads_explorer(sentences=[long])
    ex.update(num_heads=4)
    assert_frame_readable(ex.figure, "30 words")
    words = [t.get_text() for t in ex.figure.axes[0].texts if not t.get_text().startswith("head")]
    assert 0 < len(words) < 30 * (1 + 4)  # too long for a word on every row: every other one


@pytest.mark.parametrize("T", [4, 6, 8, 12, 16])
def test_mask_axes_count_whole_positions(T):
    ex = masks_explorer()
    ex.update(T=T)
    for ax in ex.figure.axes:
        for ticks in (ax.get_xticks(), ax.get_yticks()):
            inside = [t for t in ticks if -0.5 <= t <= T - 0.5]
            assert inside and all(float(t).is_integer() for t in inside), f"T = {T}: ticks {list(ticks)}"


@pytest.mark.slow
def test_minilm_frames(no_tensor_to_numpy):
    from attnbook import pretrained as P
    from attnbook.explorers import minilm_explorer

    try:
        model, tok = P.load_minilm(P.locate_files())
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"all-MiniLM-L6-v2 files not available: {err}")
    assert check_every_frame(minilm_explorer(model, tok, static_heads=(1, 6, 11)), no_tensor_to_numpy) >= 2
    long = ("When the long sentence that the reader typed into the box goes on and on, with clauses, commas, and "
            "asides, the map must still show every word it can, and stay readable.")
    for text in (long, f"{long} {long}"):  # 38 and 75 tokens
        ex = minilm_explorer(model, tok, text=text)
        assert_frame_readable(ex.figure, f"{len(ex.data['tokens'])} tokens", pixels=True)
        ax = ex.figure.axes[0]
        shown = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert shown == ex.data["tokens"][: len(shown)] or len(shown) < len(ex.data["tokens"])
        if len(ex.data["tokens"]) <= 60:
            assert shown == ex.data["tokens"], "a word on every row while the map is under 12 inches tall"


@pytest.mark.parametrize("T", [4, 12])
def test_plotting_heatmaps_count_whole_positions(T):
    from matplotlib.figure import Figure

    from attnbook.plotting import attention_heatmap, index_ticks

    fig = Figure()
    ax = attention_heatmap(torch.softmax(torch.randn(T, T), -1), fig.subplots(), annotate=False)
    FigureCanvas(fig).draw()
    for ticks in (ax.get_xticks(), ax.get_yticks()):
        inside = [t for t in ticks if -0.5 <= t <= T - 0.5]
        assert inside and all(float(t).is_integer() for t in inside), f"T = {T}: ticks {list(ticks)}"
    with pytest.raises(ValueError, match="which"):
        index_ticks(ax, "z")
