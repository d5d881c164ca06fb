"""The machinery behind every explorer: live ipywidgets controls in Jupyter and
Colab, and a self-contained HTML scrubber for the static book.

An explorer is a ``compute`` function (control values -> a dict of numbers and
tensors, cheap and testable) and a ``draw`` function (that dict -> a matplotlib
``Figure``). :class:`Explorer` wires them to widgets and pre-renders one frame
per combination of the controls' static values.

How it shows itself (``display(explorer)`` or an explorer as a cell's last
expression):

* Jupyter: one output carrying both the live widget view and ``text/html`` with
  the scrubber. Jupyter shows the widget; the book (``execute_notebooks: off``,
  ``nb_mime_priority_overrides`` in ``_config.yml``) shows the scrubber.
* Colab (``"google.colab" in sys.modules``): a plain ``display(widget)``, which
  Colab's display hook needs.

Works with ipywidgets 7.6+ and 8 and uses only core widgets.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["Control", "Explorer", "FastFigure", "figure_png", "available_devices", "in_colab"]

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def in_colab() -> bool:
    return "google.colab" in sys.modules


def available_devices() -> list[str]:
    """Devices a reader can pick: always 'cpu', plus 'cuda' and 'mps' where present."""
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    return devices


def figure_png(fig: Figure, dpi: int | None = None) -> bytes:
    """Render a matplotlib Figure (made without pyplot) to PNG bytes.

    A figure prepared by :class:`FastFigure` at its own dpi takes the fast path:
    the cached background plus its changing artists only.
    """
    fast = getattr(fig, "_attnbook_fast", None)
    if fast is not None and (dpi is None or dpi == fig.dpi):
        return fast.png()
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi)
    return buf.getvalue()


class FastFigure:
    """Blitting for explorers: everything that never changes (axes, ticks, labels,
    fixed curves) is rendered once into a cached background; each update redraws
    only the ``dynamic`` artists on top of it. An explorer's ``draw`` keeps one
    figure per layout, changes the dynamic artists' data and returns the figure;
    :func:`figure_png` then costs a few milliseconds instead of a full render.
    The figure stays an ordinary Figure that tests can inspect.
    """

    def __init__(self, fig: Figure, dynamic):
        self.fig = fig
        self.dynamic = list(dynamic)
        self.canvas = FigureCanvasAgg(fig)
        for artist in self.dynamic:
            artist.set_animated(True)  # left out of canvas.draw(): not part of the background
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(fig.bbox)
        fig._attnbook_fast = self

    def png(self) -> bytes:
        from PIL import Image

        self.canvas.restore_region(self.background)
        for artist in self.dynamic:
            self.fig.draw_artist(artist)
        rgba = self.canvas.buffer_rgba()
        buf = io.BytesIO()
        Image.frombuffer("RGBA", (rgba.shape[1], rgba.shape[0]), rgba, "raw", "RGBA", 0, 1).convert("RGB").save(
            buf, format="png", compress_level=3)
        return buf.getvalue()


@dataclass
class Control:
    """One control of an explorer.

    Args:
        name: the keyword passed to ``compute``.
        values: the choices, in order (a slider walks through them).
        default: the starting value (must be one of ``values``).
        label: what the reader sees, e.g. ``"d_k"``.
        kind: ``"slider"``, ``"toggle"`` (a few labelled buttons) or ``"dropdown"``.
        static: the values pre-rendered for the book's scrubber (default: all of
            them); ``[default]`` keeps the control fixed there.
        fmt: how a value is written in labels (default ``str``).
    """

    name: str
    values: Sequence[Any]
    default: Any = None
    label: str | None = None
    kind: str = "slider"
    static: Sequence[Any] | None = None
    fmt: Callable[[Any], str] = str

    def __post_init__(self):
        self.values = list(self.values)
        if not self.values:
            raise ValueError(f"control {self.name!r} has no values")
        if self.default is None:
            self.default = self.values[0]
        if self.default not in self.values:
            raise ValueError(f"control {self.name!r}: default {self.default!r} is not one of {self.values!r}")
        if self.kind not in ("slider", "toggle", "dropdown"):
            raise ValueError(f"control {self.name!r}: kind must be slider, toggle or dropdown, got {self.kind!r}")
        self.label = self.label or self.name
        self.static = list(self.values if self.static is None else self.static)
        bad = [v for v in self.static if v not in self.values]
        if bad:
            raise ValueError(f"control {self.name!r}: static values {bad!r} are not among {self.values!r}")

    def make_widget(self):
        import ipywidgets as W

        options = [(self.fmt(v), v) for v in self.values]
        if self.kind == "slider":
            w = W.SelectionSlider(options=options, value=self.default, description=self.label,
                                  continuous_update=False)
        elif self.kind == "toggle":
            w = W.ToggleButtons(options=options, value=self.default, description=self.label)
        else:
            w = W.Dropdown(options=options, value=self.default, description=self.label)
        return w


@dataclass
class Explorer:
    """Controls + ``compute`` + ``draw``, shown live and as a static scrubber.

    ``compute(**values) -> dict`` does the numbers; ``draw(data) -> Figure`` the
    picture; ``caption(data) -> str`` (optional) a line of text under it.
    ``update(**values)`` recomputes and keeps ``values``, ``data`` and
    ``figure``; moving a widget calls it.
    """

    title: str
    controls: Sequence[Control]
    compute: Callable[..., dict]
    draw: Callable[[dict], Figure]
    caption: Callable[[dict], str] | None = None
    frame_dpi: int | None = None  # None: the figure's own dpi (and the fast path)
    values: dict = field(init=False)
    data: dict = field(init=False)
    figure: Figure = field(init=False)
    _widget: Any = field(init=False, default=None, repr=False)

    def __post_init__(self):
        self.controls = list(self.controls)
        names = [c.name for c in self.controls]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate control names in {names}")
        self.values = {c.name: c.default for c in self.controls}
        self.update()

    def __repr__(self) -> str:
        vals = ", ".join(f"{c.label}={c.fmt(self.values[c.name])}" for c in self.controls)
        return f"<{self.title} explorer: {vals}>"

    # -- the logic, usable without a browser or a kernel ----------------------
    def control(self, name: str) -> Control:
        for c in self.controls:
            if c.name == name:
                return c
        raise KeyError(f"no control named {name!r}; controls: {[c.name for c in self.controls]}")

    def update(self, **changes) -> dict:
        """Set some control values (by name), recompute and redraw; returns ``data``."""
        for name, value in changes.items():
            c = self.control(name)
            if value not in c.values:
                raise ValueError(f"{c.label}={value!r} is not one of {c.values!r}")
        self.values = {**self.values, **changes}
        self.data = self.compute(**self.values)
        self.figure = self.draw(self.data)
        if self._widget is not None:
            self._refresh_widget()
        return self.data

    def caption_text(self) -> str:
        return self.caption(self.data) if self.caption else ""

    # -- live widget -------------------------------------------------------------
    @property
    def widget(self):
        """The ipywidgets UI (built on first use)."""
        if self._widget is None:
            import ipywidgets as W

            self._controls_w = {c.name: c.make_widget() for c in self.controls}
            self._image_w = W.Image(format="png")
            self._caption_w = W.HTML()
            for name, w in self._controls_w.items():
                w.observe(self._on_change(name), names="value")
            title = W.HTML(f"<b>{html.escape(self.title)}</b>")
            self._widget = W.VBox([title, *self._controls_w.values(), self._image_w, self._caption_w])
            self._refresh_widget()
        return self._widget

    def _on_change(self, name):
        def handler(change):
            if self.values.get(name) != change["new"]:
                self.update(**{name: change["new"]})

        return handler

    def _refresh_widget(self) -> None:
        for name, w in self._controls_w.items():
            if w.value != self.values[name]:
                w.value = self.values[name]
        self._image_w.value = figure_png(self.figure)
        self._caption_w.value = html.escape(self.caption_text())

    # -- static scrubber -----------------------------------------------------------
    def frames(self):
        """Yield ``(values, png_bytes, caption)`` for every combination of the
        controls' static values, the first control varying slowest."""
        saved = dict(self.values)
        try:
            for combo in itertools.product(*(c.static for c in self.controls)):
                self.update(**dict(zip([c.name for c in self.controls], combo)))
                yield dict(self.values), figure_png(self.figure, self.frame_dpi), self.caption_text()
        finally:
            self.update(**saved)

    def static_html(self) -> str:
        """A self-contained scrubber: one range input per control with more than
        one static value, a label showing the current value, and the frames as
        inline PNGs. No external script, style or font."""
        frames = list(self.frames())
        moving = [c for c in self.controls if len(c.static) > 1]
        strides, s = {}, 1
        for c in reversed(self.controls):
            strides[c.name] = s
            s *= len(c.static)
        start = 0
        for c in self.controls:
            value = self.values[c.name] if self.values[c.name] in c.static else c.static[0]
            start += c.static.index(value) * strides[c.name]
        digest = hashlib.sha1(b"".join(png for _, png, _ in frames)).hexdigest()[:10]
        js = (
            "var r=this.closest('.attnbook-explorer'),i=0;"
            "r.querySelectorAll('input.ab-range').forEach(function(s){"
            "i+=s.value*s.dataset.stride;"
            "s.parentNode.querySelector('.ab-value').textContent=JSON.parse(s.dataset.labels)[s.value];});"
            "r.querySelectorAll('.ab-frame').forEach(function(f){f.style.display=(f.dataset.i==i)?'':'none';});"
        )
        parts = [
            f'<div class="attnbook-explorer" id="ab-{digest}" '
            'style="font-family:sans-serif;border:1px solid #ccc;border-radius:6px;padding:8px;max-width:100%">',
            f'<div style="font-weight:bold;margin-bottom:4px">{html.escape(self.title)}</div>',
        ]
        for c in moving:
            labels = [c.fmt(v) for v in c.static]
            idx = c.static.index(self.values[c.name]) if self.values[c.name] in c.static else 0
            parts.append(
                '<label style="display:block;margin:2px 0">'
                f'{html.escape(c.label)} = <span class="ab-value">{html.escape(labels[idx])}</span> '
                f'<input class="ab-range" type="range" min="0" max="{len(labels) - 1}" step="1" value="{idx}" '
                f'aria-label="{html.escape(c.label)}" data-name="{html.escape(c.name)}" '
                f'data-stride="{strides[c.name]}" data-labels="{html.escape(json.dumps(labels))}" '
                f'oninput="{html.escape(js)}" style="vertical-align:middle;width:16em"></label>'
            )
        fixed = [c for c in self.controls if len(c.static) == 1]
        if fixed:
            txt = ", ".join(f"{c.label} = {c.fmt(c.static[0])}" for c in fixed)
            parts.append(f'<div style="color:#555;font-size:90%">{html.escape(txt)} '
                         "(run the notebook to change these)</div>")
        for i, (_, png, cap) in enumerate(frames):
            b64 = base64.b64encode(png).decode("ascii")
            style = "" if i == start else ' style="display:none"'
            parts.append(
                f'<div class="ab-frame" data-i="{i}"{style}>'
                f'<img alt="{html.escape(self.title)} frame {i}" src="data:image/png;base64,{b64}" '
                'style="max-width:100%;height:auto">'
                f'<div class="ab-caption" style="font-size:90%">{html.escape(cap)}</div></div>'
            )
        parts.append("</div>")
        return "".join(parts)

    # -- display -----------------------------------------------------------------------
    def _ipython_display_(self, **kwargs):
        from IPython.display import display

        widget = self.widget
        if in_colab():
            display(widget)
            return
        data = {"text/plain": repr(self), "text/html": self.static_html()}
        bundle = widget._repr_mimebundle_() if hasattr(widget, "_repr_mimebundle_") else None
        if bundle and WIDGET_VIEW_MIME in bundle:  # ipywidgets 8
            data[WIDGET_VIEW_MIME] = bundle[WIDGET_VIEW_MIME]
        else:  # ipywidgets 7: the same view payload its _ipython_display_ sends
            data[WIDGET_VIEW_MIME] = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
            if hasattr(widget, "_handle_displayed"):
                widget._handle_displayed(**kwargs)
        display(data, raw=True)
