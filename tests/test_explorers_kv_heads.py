"""attnbook.explorers.kv_heads (chapter 9's explorer) without a browser: the key/value head choices it offers, and
its data (against known cache sizes of real models), figure, frames and live widget. The cache formula and
the timed decoding step (decode_inputs, measure_decode) are tested in test_kvcache.py, valid_kv_heads in
test_mha_valid_kv_heads.py, grouped decoding attention in test_mha.py."""

import numpy as np
import pytest

from attnbook.explorers import kv_heads as gq
from attnbook.explorers import kv_heads_explorer
from attnbook.explorers.base import figure_png
from attnbook.explorers.kv_heads import HEADS, KV_CHOICES, KV_HEADS, MODEL, SEQ_LENS
from attnbook.kvcache import BENCH_DIVISOR, MODEL_7B, decode_key
from tests.helpers import fake_decode_timings
from tests.pixels import assert_blit_matches_full_render, assert_shows_something

SEQ = (64, 128, 256)


@pytest.fixture(scope="module")
def explorer():
    return kv_heads_explorer(fake_decode_timings(HEADS, SEQ), seq_len_options=SEQ, static_num_heads=(8, 32),
                        static_seq_len=(64, 256))


def test_the_choices_it_offers():
    assert MODEL == MODEL_7B
    assert KV_HEADS[32] == (32, 16, 8, 4, 1) and KV_HEADS[8] == (8, 4, 2, 1, 1)  # H/8 and MQA coincide at 8
    assert set(KV_HEADS) == set(HEADS) and all(len(hkv) == len(KV_CHOICES) for hkv in KV_HEADS.values())
    for H, hkv in KV_HEADS.items():
        assert all(H % h == 0 and 1 <= h <= H for h in hkv)
    ex = kv_heads_explorer(fake_decode_timings(HEADS, SEQ_LENS), static_num_heads=(8,), static_seq_len=(4096,))
    assert ex.control("num_heads").values == list(HEADS) and ex.control("seq_len").values == list(SEQ_LENS)
    assert ex.control("kv").values == list(KV_CHOICES)
    for H in HEADS:
        assert ex.update(num_heads=H, kv="MHA (=H)")["options"] == list(KV_HEADS[H])


def test_every_kv_choice_is_a_valid_divisor_for_any_head_count():
    """Head counts that the fractions do not divide fall back to the largest divisor below H/n."""
    heads = (1, 6, 12, 40)
    ex = kv_heads_explorer(fake_decode_timings(heads, SEQ), num_heads_options=heads, seq_len_options=SEQ,
                      static_num_heads=(6,), static_seq_len=(64,))
    for H in heads:
        for c in KV_CHOICES:
            h = ex.update(num_heads=H, kv=c)["num_kv_heads"]
            assert H % h == 0 and 1 <= h <= H, (H, c, h)
    got = {(H, c): ex.update(num_heads=H, kv=c)["num_kv_heads"] for H, c in ((12, "H/8"), (12, "H/4"), (6, "H/4"))}
    assert got == {(12, "H/8"): 1, (12, "H/4"): 3, (6, "H/4"): 1}


def test_explorer_memory_is_the_counted_cache(explorer):
    d = explorer.update(num_heads=32, kv="H/4", seq_len=128)
    assert d["num_kv_heads"] == 8 and d["group"] == 4
    # known values: a 7B model with 8 KV heads (Mistral 7B) keeps 128 KiB per token, so 16 MiB for 128 tokens
    assert d["cache_bytes"] == 16 * 2**20
    assert d["bytes_per_token"] == 128 * 2**10
    # 16 KiB per token per KV head (32 layers x K and V x 128 dims x 2 bytes): Llama 2 7B's 32 heads, 512 KiB
    per_token = {32: 512 * 2**10, 16: 256 * 2**10, 8: 128 * 2**10, 4: 64 * 2**10, 1: 16 * 2**10}
    for hkv, curve in zip(d["options"], d["cache_curves"]):
        assert curve == [s * per_token[hkv] for s in SEQ]
    assert d["time_s"] == [1e-6 * h * 128 for h in (32, 16, 8, 4, 1)]  # the given measurements
    assert "8 KV heads" in explorer.caption_text() and "4x less than MHA" in explorer.caption_text()


def test_explorer_controls_change_the_data(explorer):
    a = explorer.update(num_heads=32, kv="MHA (=H)", seq_len=64)
    b = explorer.update(kv="MQA (1)")
    assert a["cache_bytes"] == 32 * b["cache_bytes"]
    c = explorer.update(seq_len=256)
    assert c["cache_bytes"] == 4 * b["cache_bytes"]
    e = explorer.update(num_heads=8, kv="H/2")
    assert e["num_kv_heads"] == 4 and e["options"] == [8, 4, 2, 1, 1]


def test_explorer_figure_shows_the_data(explorer):
    d = explorer.update(num_heads=16, kv="H/2", seq_len=128)
    fig = explorer.figure
    a1, a2 = fig.axes
    marker = a1.lines[-1]
    np.testing.assert_allclose(marker.get_ydata(), [d["cache_bytes"] / 2**30])
    lo = 3e-3
    widths = [p.get_width() + lo for p in a2.patches]
    np.testing.assert_allclose(widths, [max(t * 1e3, lo * 1.0001) for t in d["time_s"]], rtol=1e-6)
    colors = [p.get_facecolor() for p in a2.patches]
    assert colors[1] != colors[0] and colors[0] == colors[2]  # only the current choice is coloured
    px = assert_shows_something(figure_png(fig))
    assert px.shape[:2] == fig.canvas.get_width_height()[::-1]  # the whole figure, at its dpi


@pytest.mark.parametrize("first, second", [
    (dict(num_heads=32, kv="H/4", seq_len=64), dict(num_heads=32, kv="MQA (1)", seq_len=256)),
    (dict(num_heads=8, kv="MHA (=H)", seq_len=128), dict(num_heads=32, kv="H/2", seq_len=128)),
])
def test_fast_frame_is_the_full_render(explorer, first, second):
    assert_blit_matches_full_render(explorer, first, second)


def test_explorer_measures_missing_combinations_once(monkeypatch):
    calls = []

    def fake(H, S, options, **kwargs):
        calls.append((H, S, tuple(options)))
        return {decode_key(H, h, S // BENCH_DIVISOR, kwargs.get("device", "cpu")): 1e-3 for h in options}

    monkeypatch.setattr(gq, "measure_decode", fake)
    given = {}
    ex = kv_heads_explorer(given, seq_len_options=SEQ, static_num_heads=(8,), static_seq_len=(64,))
    ex.update(kv="MQA (1)")
    ex.update(kv="H/2")
    assert calls == [(8, 64, (8, 4, 2, 1))]  # one measurement for all choices, then reused
    assert len(given) == 4  # kept in the dict that was passed


def test_static_frames_need_no_measuring(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("measured although the numbers were given")

    monkeypatch.setattr(gq, "measure_decode", refuse)
    ex = kv_heads_explorer(fake_decode_timings(HEADS, SEQ), seq_len_options=SEQ, static_num_heads=(8, 32),
                      static_seq_len=(64, 256))
    html = ex.static_html()
    assert html.count('class="ab-frame"') == 2 * len(KV_CHOICES) * 2
    assert html.count('class="ab-range"') == 3  # heads, KV heads and length move; the device is fixed
    assert "<script" not in html


def test_live_widget_follows_the_controls(explorer):
    controls = explorer.control_widgets  # builds the ipywidgets UI
    controls["num_heads"].value = 8
    controls["kv"].value = "H/4"
    assert explorer.data["num_kv_heads"] == 2
    assert_shows_something(explorer.image_widget.value)
    assert "2 KV heads" in explorer.caption_widget.value


def _contrast(a, b):
    """WCAG's contrast ratio of two colours (1 to 21)."""
    from matplotlib.colors import to_rgb

    def luminance(c):
        r, g, b = (x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in to_rgb(c))
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("kv", KV_CHOICES)
def test_every_timing_label_reads_against_what_lies_under_it(explorer, kv):
    """A label inside its bar is in black or white, whichever contrasts more with the bar (the grey bars
    held white labels once); a label after its bar is black on white. WCAG asks 4.5 for text this size."""
    explorer.update(num_heads=32, kv=kv, seq_len=256)
    fig = explorer.figure
    ax = fig.axes[1]
    renderer = fig.canvas.get_renderer()
    texts = [t for t in ax.texts if t.get_text()]
    assert len(texts) == len(ax.patches) == len(KV_CHOICES)
    for bar, text in zip(ax.patches, texts):
        inside = bar.get_window_extent(renderer).contains(*text.get_window_extent(renderer).get_points().mean(0))
        under = bar.get_facecolor() if inside else "white"
        assert _contrast(text.get_color(), under) >= 4.5, (text.get_text(), text.get_color(), under)
    assert any(t.get_horizontalalignment() == "right" for t in texts)  # some labels are inside their bars


def test_text_color_on_picks_the_stronger_contrast():
    from attnbook.plotting import text_color_on

    for color in ("lightgray", "white", "tab:orange", "tab:green", "yellow", "black", "navy", "tab:purple", "0.3"):
        best = max(("black", "white"), key=lambda c: _contrast(c, color))
        assert text_color_on(color) == best, color


def test_a_measurement_says_so_while_it_runs(monkeypatch):
    monkeypatch.setattr(gq, "measure_decode", lambda H, S, options, **kw: {
        decode_key(H, h, S // BENCH_DIVISOR, kw.get("device", "cpu")): 1e-3 for h in options})
    ex = kv_heads_explorer({}, seq_len_options=SEQ, static_num_heads=(8,), static_seq_len=(64,))
    messages = []
    ex.caption_widget.observe(lambda change: messages.append(change["new"]), names="value")
    assert "measured just now" in ex.caption_widget.value  # nothing was given: measured when it was made
    assert "measured when the page was built" in ex.static_html()
    ex.control_widgets["seq_len"].value = 128
    assert "measuring one decoding step for every KV choice at H = 8, S = 128 on cpu" in messages[0]
    assert "measuring" not in messages[-1] and "measured just now" in messages[-1]
    given = kv_heads_explorer(fake_decode_timings(HEADS, SEQ), seq_len_options=SEQ, static_num_heads=(8,),
                              static_seq_len=(64,))
    assert "measured earlier in this notebook" in given.caption_widget.value
    messages.clear()
    ex.control_widgets["seq_len"].value = 64  # measured when the explorer was made
    assert not any("measuring" in m for m in messages)
