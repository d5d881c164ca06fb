"""The explorer machinery: controls, frames, the static scrubber, and how it displays
(Jupyter with both outputs, Colab with a plain display(widget)); runs under ipywidgets 7 and 8."""

import json
import os
import re
import sys
import types

import ipywidgets
import pytest
from matplotlib.figure import Figure

from attnbook.explorers.base import STATIC_ENV, WIDGET_VIEW_MIME, Control, Explorer
from tests.pixels import assert_blit_matches_full_render, assert_shows_something


def test_runs_under_the_expected_ipywidgets():
    expected = os.environ.get("ATTNBOOK_EXPECT_IPYWIDGETS")
    if not expected:
        pytest.skip("ATTNBOOK_EXPECT_IPYWIDGETS is not set (the ipywidgets 7 leg of `tools/dev.py test` sets it)")
    assert ipywidgets.__version__.split(".")[0] == expected, ipywidgets.__version__


def _toy(calls=None):
    def compute(a, b):
        if calls is not None:
            calls.append((a, b))
        return {"a": a, "b": b, "y": [a * x + (1 if b == "up" else -1) for x in range(3)]}

    def draw(d):
        fig = Figure(figsize=(2, 1.5), dpi=40)
        ax = fig.subplots()
        ax.plot(range(3), d["y"])
        ax.set_title(f"a={d['a']}")
        return fig

    return Explorer("Toy", [Control("a", [1, 2, 3], 2), Control("b", ["up", "down"], kind="toggle")],
                    compute, draw, caption=lambda d: f"a is {d['a']}")


def test_update_recomputes_and_redraws():
    calls = []
    ex = _toy(calls)
    assert ex.values == {"a": 2, "b": "up"} and calls == [(2, "up")]
    ex.update(a=3)
    assert ex.data["y"] == [1, 4, 7]
    assert list(ex.figure.axes[0].lines[0].get_ydata()) == [1, 4, 7]
    assert ex.caption_text() == "a is 3"
    with pytest.raises(ValueError, match=r"a=5 is not one of \[1, 2, 3\]"):
        ex.update(a=5)
    with pytest.raises(KeyError, match="no control named 'c'"):
        ex.update(c=1)


def test_control_validation():
    with pytest.raises(ValueError, match="default 9"):
        Control("x", [1, 2], 9)
    with pytest.raises(ValueError, match="static values"):
        Control("x", [1, 2], static=[3])
    with pytest.raises(ValueError, match="kind"):
        Control("x", [1, 2], kind="knob")


def test_static_scrubber_is_self_contained_with_one_frame_per_combination():
    ex = _toy()
    html = ex.static_html()
    frames = re.findall(r'<div class="ab-frame" data-i="(\d+)"', html)
    assert frames == [str(i) for i in range(6)]  # 3 values of a x 2 of b
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 6
    # nothing loaded from elsewhere: no external scripts, styles, fonts or images
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<script" not in html and "<link" not in html and "@import" not in html
    ranges = re.findall(r'<input class="ab-range"[^>]*>', html)
    assert len(ranges) == 2
    labels = [json.loads(re.search(r'data-labels="([^"]*)"', r).group(1).replace("&quot;", '"')) for r in ranges]
    assert labels == [["1", "2", "3"], ["up", "down"]]
    strides = [int(re.search(r'data-stride="(\d+)"', r).group(1)) for r in ranges]
    assert strides == [2, 1]
    # the visible frame is the current values' one: a=2 (index 1), b=up (index 0) -> 1*2 + 0
    visible = re.findall(r'<div class="ab-frame" data-i="(\d+)">', html)
    assert visible == ["2"]
    assert ex.values == {"a": 2, "b": "up"}  # rendering frames restores the values


def test_fixed_controls_are_listed_not_scrubbed():
    ex = Explorer("Fixed", [Control("a", [1, 2], static=[1]), Control("b", [3, 4])],
                  lambda a, b: {"a": a, "b": b}, lambda d: Figure(figsize=(1, 1), dpi=20))
    html = ex.static_html()
    assert len(re.findall(r'class="ab-range"', html)) == 1
    assert "a = 1 (run the notebook to change these)" in html


def test_widget_drives_the_explorer():
    ex = _toy()
    box = ex.widget
    controls = ex.control_widgets
    assert list(controls) == ["a", "b"] and list(box.children[1:3]) == list(controls.values())
    slider = controls["a"]
    assert isinstance(slider, ipywidgets.SelectionSlider)
    image, caption = ex.image_widget, ex.caption_widget
    assert isinstance(image, ipywidgets.Image) and isinstance(caption, ipywidgets.HTML)
    before = image.value
    slider.value = 1
    assert ex.values["a"] == 1 and ex.data["y"] == [1, 2, 3]
    assert image.value != before
    assert_shows_something(image.value)
    assert "a is 1" in caption.value
    ex.update(b="down")  # and the other way round: update() moves the widget
    assert controls["b"].value == "down"
    assert box.children[-3].children == (image,) and box.children[-2] is caption  # then the stale-kernel hint
    # in a narrow output the image keeps at least 90% of its size and its box scrolls sideways
    assert image.layout.max_width == "100%" and box.children[-3].layout.overflow == "auto hidden"
    width = int(image.layout.width.removesuffix("px"))
    assert width == 80 and image.layout.min_width == f"{round(0.9 * width)}px"  # 2 inches at 40 dpi
    assert ex.image_widget is image and ex.widget is box  # built once


def test_the_widget_accessors_build_the_widget_on_first_use():
    for first in ("control_widgets", "image_widget", "caption_widget"):
        ex = _toy()
        getattr(ex, first)
        assert ex.image_widget.value and "a is 2" in ex.caption_widget.value
        assert ex.control_widgets["a"].value == 2
        ex.control_widgets.clear()  # a copy: clearing it leaves the explorer's controls alone
        assert set(ex.control_widgets) == {"a", "b"}


def _capture(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.append((objs, kw)))
    return shown


def test_jupyter_display_publishes_widget_view_and_html(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv(STATIC_ENV, "1")  # executed for the book, as tools/execute.py does
    shown = _capture(monkeypatch)
    ex = _toy()
    ex._ipython_display_()
    assert len(shown) == 1
    (data,), kw = shown[0]
    assert kw == {"raw": True}
    assert set(data) == {"text/plain", "text/html", WIDGET_VIEW_MIME}
    assert data[WIDGET_VIEW_MIME]["model_id"] == ex.widget.model_id
    assert data[WIDGET_VIEW_MIME]["version_major"] == 2
    assert 'class="attnbook-explorer"' in data["text/html"]
    assert data["text/plain"] == "<Toy explorer: a=2, b=up>"


def test_a_live_kernel_shows_only_the_widget_and_computes_no_frame(monkeypatch):
    """In a reader's kernel (STATIC_ENV unset) the output carries the widget view and, for a front end that
    cannot show it, one line saying to run the cell; no frame of the scrubber is rendered."""
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.delenv(STATIC_ENV, raising=False)
    shown = _capture(monkeypatch)
    ex = _toy()
    monkeypatch.setattr(Explorer, "frames", lambda self: pytest.fail("a live kernel rendered the scrubber's frames"))
    ex._ipython_display_()
    assert len(shown) == 1
    (data,), _ = shown[0]
    assert set(data) == {"text/plain", "text/html", WIDGET_VIEW_MIME}
    assert data[WIDGET_VIEW_MIME]["model_id"] == ex.widget.model_id
    assert 'class="attnbook-explorer"' not in data["text/html"] and "base64" not in data["text/html"]
    assert "<b>Toy</b>: a live explorer" in data["text/html"] and "Run this cell" in data["text/html"]
    assert len(data["text/html"]) < 400


def test_the_live_widget_says_what_a_widget_without_its_kernel_means():
    ex = _toy()
    hints = [w for w in ex.widget.children if isinstance(w, ipywidgets.HTML) and "attnbook-stale-hint" in w.value]
    assert len(hints) == 1 and ex.widget.children[-1] is hints[0]
    assert "lost its kernel" in hints[0].value and "run this cell again" in hints[0].value


def test_colab_display_is_a_plain_display_of_the_widget_then_the_static_fallback(monkeypatch):
    """Under Colab (simulated: ``google.colab`` in sys.modules) the widget goes out with a plain
    display(widget), which Colab's display hook needs, and then the book's scrubber, folded, as a fallback
    that works without the widget manager: every frame, and the range inputs that switch them."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    shown = _capture(monkeypatch)
    ex = _toy()
    ex._ipython_display_()
    assert len(shown) == 2
    (obj,), kw = shown[0]
    assert obj is ex.widget and kw == {}
    (fallback,), kw = shown[1]
    assert kw == {"raw": True} and set(fallback) == {"text/html", "text/plain"}
    page = fallback["text/html"]
    assert page.startswith("<details") and page.endswith("</details>") and "<summary" in page
    assert ex.static_html() in page  # the whole scrubber, as the book shows it
    assert len(re.findall(r'<div class="ab-frame"', page)) == 6 and 'class="ab-range"' in page
    assert WIDGET_VIEW_MIME not in fallback


def test_colab_fallback_frames_are_real_pictures(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    shown = _capture(monkeypatch)
    _toy()._ipython_display_()
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', shown[1][0][0]["text/html"])
    import base64

    pictures = [assert_shows_something(base64.b64decode(png)) for png in pngs]
    assert len(pictures) == 6 and any((a != b).any() for a, b in zip(pictures, pictures[1:]))


def test_display_renders_the_frames_before_the_widget_exists(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv(STATIC_ENV, "1")
    _capture(monkeypatch)
    pushed = []
    monkeypatch.setattr(Explorer, "_refresh_widget", lambda self: pushed.append(dict(self.values)))
    ex = _toy()
    ex._ipython_display_()
    assert pushed == [{"a": 2, "b": "up"}]  # the widget got one picture, of the current values, not 6 frames
    pushed.clear()
    ex.static_html()  # with a live widget: the frames are not pushed to it either
    assert pushed == [{"a": 2, "b": "up"}]


def _hooked(calls, *, title_changes=True):
    """A toy explorer drawn by the layout/build/redraw hooks; the layout depends on n."""

    def compute(n, k):
        return {"n": n, "k": k}

    def build(d):
        calls.append(("build", d["n"]))
        fig = Figure(figsize=(3, 2), dpi=50)
        ax = fig.subplots()
        (line,) = ax.plot(range(d["n"]), [0] * d["n"], color="tab:red", lw=3)
        ax.set_xlim(-0.5, 5.5)
        ax.set_ylim(-1, 10)
        title = ax.set_title(" ")
        return fig, ({"line": line, "title": title} if title_changes else {"line": line})

    def redraw(d, art):
        calls.append(("redraw", d["n"], d["k"]))
        art["line"].set_ydata([d["k"] * i for i in range(d["n"])])
        ax = art["line"].axes
        ax.title.set_text(f"{d['k']}" * 20)  # changes whether or not build named it

    return Explorer("Hooked", [Control("n", [3, 6]), Control("k", [1, 2, 0])], compute,
                    layout=lambda d: d["n"], build=build, redraw=redraw)


def test_hooks_build_once_per_layout_and_redraw_every_update():
    calls = []
    ex = _hooked(calls)
    ex.update(k=2)
    ex.update(n=6)
    first_fig = ex.figure
    ex.update(k=0)
    ex.update(n=3, k=1)
    assert [c for c in calls if c[0] == "build"] == [("build", 3), ("build", 6)]
    assert len([c for c in calls if c[0] == "redraw"]) == 5
    assert ex.figure is not first_fig and ex.update(n=6) is ex.data and ex.figure is first_fig
    assert list(ex.figure.axes[0].lines[0].get_ydata()) == [0, 1, 2, 3, 4, 5]
    assert_blit_matches_full_render(ex, dict(n=6, k=1), dict(n=6, k=2))


def test_a_frozen_artist_is_caught_by_the_pixel_check():
    ex = _hooked([], title_changes=False)  # the title changes in redraw but is not named by build
    with pytest.raises(AssertionError, match="differs from a full render|missing from build's artists"):
        assert_blit_matches_full_render(ex, dict(n=6, k=1), dict(n=6, k=2))


def test_hook_arguments_are_checked():
    draw = lambda d: Figure(figsize=(1, 1), dpi=20)  # noqa: E731
    build = lambda d: (Figure(figsize=(1, 1), dpi=20), {})  # noqa: E731
    with pytest.raises(ValueError, match="not both"):
        Explorer("X", [Control("a", [1])], lambda a: {}, draw, build=build, redraw=lambda d, art: None)
    with pytest.raises(ValueError, match="needs draw"):
        Explorer("X", [Control("a", [1])], lambda a: {})
    with pytest.raises(ValueError, match="layout is a hook"):
        Explorer("X", [Control("a", [1])], lambda a: {}, draw, layout=lambda d: 0)

    def build_with_axes(d):
        fig = Figure(figsize=(1, 1), dpi=20)
        return fig, {"ax": fig.subplots()}

    with pytest.raises(TypeError, match="not what holds them"):
        Explorer("X", [Control("a", [1])], lambda a: {}, build=build_with_axes, redraw=lambda d, art: None)


# ----------------------------------------------------------------------------- limits, hints, busy, captions


def _bounded(calls=None, hint=None):
    """n in 1..5, k in 0..4 but at most n - 1; the offset applies only when mode is "shift"."""

    def compute(n, k, mode, offset):
        if calls is not None:
            calls.append((n, k, mode, offset))
        return {"n": n, "k": k, "mode": mode, "offset": offset}

    def draw(d):
        fig = Figure(figsize=(2, 1.5), dpi=40)
        fig.subplots().bar(range(d["n"]), [d["k"] + (d["offset"] if d["mode"] == "shift" else 0)] * d["n"])
        return fig

    return Explorer("Bounded", [Control("n", [1, 2, 3, 4, 5], 3), Control("k", [0, 1, 2, 3, 4], 2),
                                Control("mode", ["plain", "shift"], kind="toggle"),
                                Control("offset", [0, 10, 20], 10, hint=hint)],
                    compute, draw, caption=lambda d: f"n={d['n']}",
                    limits=lambda v: {"k": list(range(v["n"])), "offset": None if v["mode"] == "plain" else [0, 10, 20]})


def test_limits_move_a_value_to_the_nearest_allowed_one():
    calls = []
    ex = _bounded(calls)
    assert ex.values["k"] == 2 and ex.allowed == {"k": [0, 1, 2], "offset": None}
    ex.update(n=2)  # k = 2 is out of range now: the nearest allowed is 1
    assert ex.values["k"] == 1 and calls[-1] == (2, 1, "plain", 10)
    ex.update(k=4)  # asking for too much gives the most there is
    assert ex.values["k"] == 1
    ex.update(n=5, k=4)
    assert ex.values["k"] == 4
    ex.update(n=1)
    assert ex.values["k"] == 0 and ex.allowed["k"] == [0]


def test_a_control_that_does_not_apply_is_named_in_the_caption():
    ex = _bounded()
    assert [c.name for c in ex.unused()] == ["offset"]
    assert ex.caption_text() == "n=3; offset does not apply here"
    ex.update(mode="shift")
    assert ex.unused() == [] and ex.caption_text() == "n=3"


def test_bad_limits_are_refused():
    def explorer(limits):
        return Explorer("X", [Control("a", [1, 2])], lambda a: {"a": a}, lambda d: Figure(figsize=(1, 1), dpi=20),
                        limits=limits)

    with pytest.raises(ValueError, match="non-empty subset"):
        explorer(lambda v: {"a": []})
    with pytest.raises(ValueError, match="non-empty subset"):
        explorer(lambda v: {"a": [3]})
    with pytest.raises(KeyError, match="no control named 'b'"):
        explorer(lambda v: {"b": [1]})


def test_the_live_widget_offers_only_what_applies():
    ex = _bounded()
    k, offset = ex.control_widgets["k"], ex.control_widgets["offset"]
    assert [v for _, v in k.options] == [0, 1, 2] and k.value == 2 and not k.disabled
    assert offset.disabled  # mode "plain": the offset does not apply
    ex.control_widgets["n"].value = 2  # the slider moves: k's range shrinks and its value follows
    assert [v for _, v in k.options] == [0, 1] and k.value == 1 and ex.values["k"] == 1
    ex.control_widgets["n"].value = 1
    assert [v for _, v in k.options] == [0] and k.disabled  # one value left: nothing to move
    ex.control_widgets["n"].value = 5
    assert [v for _, v in k.options] == [0, 1, 2, 3, 4] and not k.disabled and ex.values["k"] == 0
    k.value = 4
    assert ex.values["k"] == 4 and ex.data["k"] == 4
    ex.control_widgets["mode"].value = "shift"
    assert not offset.disabled
    offset.value = 20
    assert ex.data["offset"] == 20
    assert "does not apply" not in ex.caption_widget.value
    ex.control_widgets["mode"].value = "plain"
    assert offset.disabled and "offset does not apply here" in ex.caption_widget.value


def test_setting_new_options_does_not_recompute_with_a_stray_value():
    calls = []
    ex = _bounded(calls)
    ex.widget  # noqa: B018
    calls.clear()
    ex.control_widgets["n"].value = 1  # k's options become [0]: one update, with k = 0
    assert calls == [(1, 0, "plain", 10)]


def test_a_hint_is_shown_beside_its_control_and_a_lone_value_without_one_is_hidden():
    ex = _bounded(hint="what the offset adds")
    box = ex.widget
    rows = [w for w in box.children if isinstance(w, ipywidgets.HBox)]
    assert len(rows) == 1 and rows[0].children[0] is ex.control_widgets["offset"]
    assert "what the offset adds" in rows[0].children[1].value
    lone = Explorer("Lone", [Control("a", [1, 2]), Control("b", [7])], lambda a, b: {"a": a},
                    lambda d: Figure(figsize=(1, 1), dpi=20))
    assert lone.control_widgets["b"].layout.display == "none" and lone.control_widgets["a"].layout.display != "none"
    assert "b = 7" not in lone.static_html()
    hinted = Explorer("Hinted", [Control("a", [1, 2]), Control("b", [7], hint="only 7 here")], lambda a, b: {"a": a},
                      lambda d: Figure(figsize=(1, 1), dpi=20))
    assert hinted.control_widgets["b"].layout.display != "none" and hinted.control_widgets["b"].disabled
    assert "b = 7 (run the notebook" in hinted.static_html()


def test_the_device_control_says_what_it_means(monkeypatch):
    import attnbook.explorers.base as base

    monkeypatch.setattr(base, "available_devices", lambda: ["cpu"])
    c = base.device_control()
    assert c.values == ["cpu"] and c.shown and "torch.cuda.is_available() is False" in c.hint
    monkeypatch.setattr(base, "available_devices", lambda: ["cpu", "cuda"])
    c = base.device_control()
    assert c.values == ["cpu", "cuda"] and "GPU (cuda)" in c.hint and "no GPU" not in c.hint


def test_a_slow_update_says_so_while_it_computes():
    seen, holder, measured = [], [], {1, 2}

    def compute(n):  # what the live caption says while compute runs; n = 3 is measured once, then kept
        seen.append(holder[0].caption_widget.value if holder and holder[0]._widget is not None else None)
        measured.add(n)
        return {"n": n}

    ex = Explorer("Slow", [Control("n", [1, 2, 3])], compute, lambda d: Figure(figsize=(1, 1), dpi=20),
                  caption=lambda d: f"n is {d['n']}",
                  busy=lambda v: None if v["n"] in measured else f"measuring n = {v['n']}")
    holder.append(ex)
    ex.widget  # noqa: B018
    seen.clear()
    ex.control_widgets["n"].value = 2  # quick: no message
    assert len(seen) == 1 and "n is 1" in seen[0] and "n is 2" in ex.caption_widget.value
    ex.control_widgets["n"].value = 3
    assert "measuring n = 3" in seen[-1] and "n is 3" in ex.caption_widget.value
    ex.control_widgets["n"].value = 1
    ex.control_widgets["n"].value = 3  # measured before: no message
    assert "measuring" not in seen[-1]


def test_the_books_frames_take_the_static_caption():
    ex = Explorer("Two captions", [Control("n", [1, 2])], lambda n: {"n": n}, lambda d: Figure(figsize=(1, 1), dpi=20),
                  caption=lambda d: f"live {d['n']}", static_caption=lambda d: f"built {d['n']}")
    assert [cap for _, _, cap in ex.frames()] == ["built 1", "built 2"]
    assert ex.caption_text() == "live 1" and ex.caption_text(static=True) == "built 1"
    assert "built 2" in ex.static_html() and "live" not in ex.static_html()
    assert "live 1" in ex.caption_widget.value and "built" not in ex.caption_widget.value


def test_dir_lists_the_lazy_names_for_tab_completion():
    import attnbook
    import attnbook.explorers

    # The factories and submodules load on first use; dir() (what tab completion reads) must list them anyway.
    listed = dir(attnbook.explorers)
    assert set(attnbook.explorers.__all__) <= set(listed), sorted(set(attnbook.explorers.__all__) - set(listed))
    assert {"vision", "explorers", "testing", "train", "llm_attention"} <= set(dir(attnbook))
    for name in dir(attnbook.explorers):
        getattr(attnbook.explorers, name)  # everything listed resolves
