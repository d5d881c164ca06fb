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

from attnbook.explorers.base import WIDGET_VIEW_MIME, Control, Explorer
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
    assert box.children[-2] is image and box.children[-1] is caption
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


def test_colab_display_is_a_plain_display_of_the_widget(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    shown = _capture(monkeypatch)
    ex = _toy()
    ex._ipython_display_()
    assert len(shown) == 1
    (obj,), kw = shown[0]
    assert obj is ex.widget and kw == {}


def test_display_renders_the_frames_before_the_widget_exists(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
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
