"""attnbook.explorers.kv_budget (chapter 12's explorer) without a browser: the numbers it shows are
attnbook.configs.kv_cache_by_layer's, every control value renders with its texts whole and apart, the fast
frames equal full renders, and the scrubber has a frame per static combination. The counts themselves are
tested in test_configs.py."""

import warnings

import numpy as np
import pytest
import torch

from attnbook.configs import CONFIGS, LAYER_KINDS, format_bytes, kv_cache_by_layer
from attnbook.explorers import kv_budget as kb
from attnbook.explorers import kv_budget_explorer
from tests.pixels import (
    assert_blit_matches_full_render,
    assert_frame_readable,
    assert_shows_something,
)

GIB = 2.0**30
MODELS = list(CONFIGS)


@pytest.fixture(scope="module")
def explorer():
    return kv_budget_explorer()


def _bars(explorer):
    """The bar segments, keyed (model, kind), and the highlight: the patches of the bars' axes in build's order."""
    a1 = explorer.figure.axes[0]
    patches = a1.patches
    assert len(patches) == len(MODELS) * len(LAYER_KINDS) + 1
    segments = {(m, k): patches[i * len(LAYER_KINDS) + j] for i, m in enumerate(MODELS) for j, k in enumerate(LAYER_KINDS)}
    return segments, patches[-1]


def test_controls():
    ex = kv_budget_explorer()
    assert ex.control("model").values == MODELS and ex.control("model").kind == "dropdown"
    assert ex.control("context_len").values == [1024 * 2**i for i in range(8)]  # 1K .. 128K, powers of two
    assert ex.control("model").fmt("qwen3-next-80b-a3b") == "Qwen3-Next-80B-A3B"
    assert ex.values == {"model": "gemma-3-27b", "context_len": 8192}
    assert ex.control("context_len").static_values == [1024, 8192, 131072]  # 18 frames in the book, about 1 MB


@pytest.mark.parametrize("model, S", [("gemma-3-27b", 32768), ("qwen3-next-80b-a3b", 1024),
                                      ("llama-3-8b", 131072), ("deepseek-v3", 4096)])
def test_numbers_shown_are_kv_cache_by_layer(explorer, model, S):
    d = explorer.update(model=model, context_len=S)
    segments, highlight = _bars(explorer)
    a1, a2, _ = explorer.figure.axes
    ends = [t for t in a1.texts]
    for i, m in enumerate(MODELS):
        rows = {r.kind: r.bytes for r in kv_cache_by_layer(m, S)}
        assert d["rows"][m] == kv_cache_by_layer(m, S)
        left = 0.0
        for k in LAYER_KINDS:
            rect = segments[(m, k)]
            np.testing.assert_allclose([rect.get_x(), rect.get_width()], [left, rows.get(k, 0) / GIB], rtol=1e-12)
            left += rows.get(k, 0) / GIB
            past = S > CONFIGS[m].max_position_embeddings
            assert (rect.get_hatch() == "///") == past
        assert ends[i].get_text() == format_bytes(sum(rows.values()))
    total = sum(r.bytes for r in kv_cache_by_layer(model, S))
    assert d["total"] == total
    np.testing.assert_allclose(highlight.get_width(), total / GIB)
    assert highlight.get_y() == pytest.approx(len(MODELS) - 1 - MODELS.index(model) - 0.4)
    line, marker = a2.lines[-2], a2.lines[-1]
    np.testing.assert_allclose(line.get_ydata(),
                               [sum(r.bytes for r in kv_cache_by_layer(model, s)) / GIB for s in kb.CONTEXTS])
    np.testing.assert_allclose(marker.get_ydata(), [total / GIB])
    assert a2.get_title() == CONFIGS[model].name


def test_breakdown_text_reads_the_rows(explorer):
    explorer.update(model="gemma-3-27b", context_len=32768)
    text = explorer.figure.axes[2].texts[-1].get_text()
    assert text == ("Gemma 3 27B at S = 32,768: 2.91 GiB in all\n"
                    "    10 global (full attention) layers x 32,768 tokens = 2.5 GiB\n"
                    "    52 local (sliding-window) layers x 1,024 tokens = 416 MiB")
    explorer.update(model="qwen3-next-80b-a3b", context_len=1024)
    assert explorer.figure.axes[2].texts[-1].get_text().splitlines()[1:] == [
        "    12 global (full attention) layers x 1,024 tokens = 24 MiB",
        "    36 linear-attention layers: a fixed state of 74.2 MiB, the same at any S"]
    explorer.update(model="deepseek-v3", context_len=131072)
    assert explorer.figure.axes[2].texts[-1].get_text().endswith("61 MLA layers x 131,072 tokens of latent = 8.58 GiB")
    explorer.update(model="llama-3-8b", context_len=16384)
    cap = explorer.caption_text()
    assert "S is past its 8,192-token context" in cap and "2 GiB" in cap and CONFIGS["llama-3-8b"].source in cap
    assert explorer.figure.axes[2].texts[0].get_text() == "KV cache per sequence at S = 16,384 tokens (bf16, batch 1)"


def test_every_control_value_renders_with_readable_texts(explorer):
    """All 6 x 8 combinations: a picture, every text inside the figure and apart from the others, no text under
    9 pt (9 px at the figure's 72 dpi), no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for m in MODELS:
            for S in kb.CONTEXTS:
                explorer.update(model=m, context_len=S)
                assert_frame_readable(explorer.figure, f"{m} at {S}", pixels=S == kb.CONTEXTS[-1])


@pytest.mark.parametrize("first, second", [
    (dict(model="gemma-3-27b", context_len=32768), dict(model="qwen3-next-80b-a3b", context_len=1024)),
    (dict(model="llama-3-8b", context_len=131072), dict(model="llama-3-8b", context_len=8192)),
    (dict(model="deepseek-v3", context_len=4096), dict(model="mistral-7b-v0.1", context_len=4096)),
])
def test_fast_frame_is_the_full_render(explorer, first, second):
    assert_blit_matches_full_render(explorer, first, second)


def test_one_figure_for_every_value(explorer):
    explorer.update(model="llama-3-8b", context_len=1024)
    fig = explorer.figure
    explorer.update(model="deepseek-v3", context_len=131072)
    assert explorer.figure is fig  # the scale moves with S; nothing is rebuilt


def test_static_html_is_a_scrubber():
    ex = kv_budget_explorer(static_contexts=(1024, 131072))
    html = ex.static_html()
    assert html.count('class="ab-frame"') == len(MODELS) * 2
    assert html.count('class="ab-range"') == 2  # the model and S both move
    assert "<script" not in html
    frames = list(ex.frames())
    assert len({png for _, png, _ in frames}) == len(frames)  # every frame differs
    assert frames[0][0] == {"model": "llama-3-8b", "context_len": 1024}
    assert ex.values == {"model": "gemma-3-27b", "context_len": 1024}  # restored after the frames


def test_frames_hand_matplotlib_no_tensors(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "__array__", lambda self, *a, **k: calls.append(1) or self.numpy())
    ex = kv_budget_explorer(static_models=("gpt-oss-120b",), static_contexts=(4096,))
    assert len(list(ex.frames())) == 1 and not calls


def test_live_widget_follows_the_controls(explorer):
    widgets = explorer.control_widgets
    widgets["model"].value = "deepseek-v3"
    widgets["context_len"].value = 8192
    assert explorer.data["name"] == "DeepSeek-V3" and explorer.data["context_len"] == 8192
    assert_shows_something(explorer.image_widget.value)
    assert "549 MiB" in explorer.caption_widget.value


def test_errors():
    with pytest.raises(ValueError, match="contexts must be an int >= 1, got 0"):
        kv_budget_explorer(contexts=(0, 1024))
    with pytest.raises(ValueError, match=r"static_models must be names of .*got \['llama'\]"):
        kv_budget_explorer(static_models=("llama",))
    with pytest.raises(ValueError, match="static_contexts must be among contexts"):
        kv_budget_explorer(static_contexts=(1000,))
    ex = kv_budget_explorer(static_contexts=(1024,))
    with pytest.raises(ValueError, match="context length S=1000 is not one of"):
        ex.update(context_len=1000)
