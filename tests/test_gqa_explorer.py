"""attnbook.explorers.gqa (chapter 9's explorer) without a browser: key/value head choices, the timed
decoding step, and the explorer's data (against known cache sizes of real models), figure and frames.
The cache formula is tested in test_kvcache.py, grouped decoding attention in test_mha.py, the profiler
helper in test_measure.py."""

import numpy as np
import pytest
import torch

import attnbook
from attnbook.explorers import gqa as gq
from attnbook.explorers.base import figure_png
from tests.pixels import assert_blit_matches_full_render, assert_shows_something

SEQ = (64, 128, 256)


def _fake_measurements(heads=gq.HEADS, seq_lens=SEQ, device="cpu"):
    """Deterministic stand-in timings for every (H, Hkv, S/8): proportional to the bytes read."""
    out = {}
    for H in heads:
        for S in seq_lens:
            for hkv in gq.valid_kv_heads(H):
                out[gq.decode_key(H, hkv, S // gq.BENCH_DIVISOR, device)] = 1e-6 * hkv * S
    return out


@pytest.fixture(scope="module")
def explorer():
    return gq.gqa_explorer(_fake_measurements(), seq_lens=SEQ, static_heads=(8, 32), static_seq=(64, 256))


def test_valid_kv_heads_are_exactly_what_multihead_attention_accepts():
    assert gq.valid_kv_heads(12) == [1, 2, 3, 4, 6, 12]
    for h in range(1, 13):
        ok = h in gq.valid_kv_heads(12)
        if ok:
            attnbook.MultiHeadAttention(24, 12, num_kv_heads=h)
        else:
            with pytest.raises(ValueError, match="divisor"):
                attnbook.MultiHeadAttention(24, 12, num_kv_heads=h)
    with pytest.raises(ValueError, match="num_heads"):
        gq.valid_kv_heads(0)


def test_every_kv_choice_is_a_valid_divisor_for_any_head_count():
    assert [gq.kv_heads(32, c) for c in gq.KV_CHOICES] == [32, 16, 8, 4, 1]
    assert [gq.kv_heads(8, c) for c in gq.KV_CHOICES] == [8, 4, 2, 1, 1]
    for H in (1, 6, 8, 12, 16, 32, 40):
        for c in gq.KV_CHOICES:
            h = gq.kv_heads(H, c)
            assert H % h == 0 and 1 <= h <= H
    assert gq.kv_heads(12, "H/8") == 1 and gq.kv_heads(12, "H/4") == 3 and gq.kv_heads(6, "H/4") == 1
    with pytest.raises(ValueError, match="choice must be one of"):
        gq.kv_heads(8, "H/3")


def test_decode_inputs_shapes_and_seed():
    q, k, v = gq.decode_inputs(8, 2, 10, 16)
    assert q.shape == (1, 8, 1, 16) and k.shape == v.shape == (1, 2, 10, 16)
    assert torch.equal(q, gq.decode_inputs(8, 2, 10, 16)[0])
    with pytest.raises(ValueError, match="must divide"):
        gq.decode_inputs(8, 3, 10)


def test_measure_decode_times_every_distinct_choice():
    t = gq.measure_decode(8, 128, head_dim=16, rounds=1)
    assert set(t) == {gq.decode_key(8, h, 16) for h in (8, 4, 2, 1)}
    assert all(s > 0 for s in t.values())
    t = gq.measure_decode(4, 64, [4], head_dim=8, rounds=1)
    assert set(t) == {gq.decode_key(4, 4, 8)}


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
        return {gq.decode_key(H, h, S // gq.BENCH_DIVISOR, kwargs.get("device", "cpu")): 1e-3 for h in options}

    monkeypatch.setattr(gq, "measure_decode", fake)
    given = {}
    ex = gq.gqa_explorer(given, seq_lens=SEQ, static_heads=(8,), static_seq=(64,))
    ex.update(kv="MQA (1)")
    ex.update(kv="H/2")
    assert calls == [(8, 64, (8, 4, 2, 1))]  # one measurement for all choices, then reused
    assert len(given) == 4  # kept in the dict that was passed


def test_static_frames_need_no_measuring(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("measured although the numbers were given")

    monkeypatch.setattr(gq, "measure_decode", refuse)
    ex = gq.gqa_explorer(_fake_measurements(), seq_lens=SEQ, static_heads=(8, 32), static_seq=(64, 256))
    html = ex.static_html()
    assert html.count('class="ab-frame"') == 2 * len(gq.KV_CHOICES) * 2
    assert html.count('class="ab-range"') == 3  # heads, KV heads and length move; the device is fixed
    assert "<script" not in html


def test_live_widget_follows_the_controls(explorer):
    assert explorer.widget is not None
    explorer._controls_w["num_heads"].value = 8
    explorer._controls_w["kv"].value = "H/4"
    assert explorer.data["num_kv_heads"] == 2
    assert_shows_something(explorer._image_w.value)
    assert "2 KV heads" in explorer._caption_w.value
