"""Pixel checks for the explorers: what a rendered frame shows, not only that a PNG was written.

An explorer's fast path (:class:`attnbook.explorers.base.FastFigure`) redraws only the artists its
``build`` hook names over a cached background. An artist that changes but was left out of that list
silently freezes: the frame keeps showing its old state. :func:`assert_blit_matches_full_render` catches
that by comparing the fast frames of two states with full ``savefig`` renders of the same figure.

Stated tolerances (a pixel "differs" when a colour channel differs by more than 32 of 255):

* the fast frame may differ from the full render on at most 2% of its pixels: a changing artist is drawn
  over the whole background, so it covers an axes frame or grid line that a full render draws on top;
* of the pixels that the full render changes (by more than 32) between the two states, at most 0.02% of
  the frame (at least 10 pixels) may stay unchanged (within 8) in the fast frames: a frozen artist (a
  title, a label) leaves hundreds. (The two thresholds differ because a changing bar drawn over a faint
  grid line changes a pixel a little less than the same bar drawn under it.)
"""

from __future__ import annotations

import io
import math

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from attnbook.explorers.base import Explorer, figure_png

CHANNEL_STEP = 32
STILL_STEP = 8
MAX_MISMATCH_SHARE = 0.02
MAX_FROZEN_SHARE = 0.0002


def png_pixels(png: bytes) -> np.ndarray:
    """Decode PNG bytes (refusing anything else) into an RGB array (height, width, 3) of ints."""
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG", f"not a PNG: {image.format}"
    return np.asarray(image.convert("RGB")).astype(np.int16)


def full_render(fig: Figure) -> np.ndarray:
    """The figure rendered from scratch by ``savefig`` (every artist, in z-order), as RGB pixels.

    The fast path marks its changing artists as animated, and a figure leaves an animated artist of its own
    (a ``suptitle``, a ``fig.text``) out of every render, ``savefig`` included: they are made ordinary for
    the render, so that the full render shows them."""
    from matplotlib.artist import Artist

    animated = [a for a in fig.findobj(Artist) if a.get_animated()]
    for a in animated:
        a.set_animated(False)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=fig.dpi)
    finally:
        for a in animated:
            a.set_animated(True)
    return png_pixels(buf.getvalue())


def _differs(a: np.ndarray, b: np.ndarray, step: int = CHANNEL_STEP) -> np.ndarray:
    return np.abs(a - b).max(axis=-1) > step


def assert_shows_something(png: bytes) -> np.ndarray:
    """A decodable PNG that is not one flat colour; returns its pixels."""
    px = png_pixels(png)
    assert px.shape[0] > 10 and px.shape[1] > 10, px.shape
    assert len(np.unique(px.reshape(-1, 3), axis=0)) > 10, "the frame is (nearly) one flat colour"
    return px


def assert_blit_matches_full_render(explorer: Explorer, first: dict, second: dict) -> None:
    """Set ``first`` then ``second`` (control values) and compare each state's fast frame with a full
    render of the same figure, within the tolerances of the module docstring."""
    explorer.update(**first)
    fast_a, full_a = assert_shows_something(figure_png(explorer.figure)), full_render(explorer.figure)
    explorer.update(**second)
    fast_b, full_b = assert_shows_something(figure_png(explorer.figure)), full_render(explorer.figure)
    for fast, full, which in ((fast_a, full_a, first), (fast_b, full_b, second)):
        assert fast.shape == full.shape, f"{which}: fast frame {fast.shape} vs full render {full.shape}"
        share = _differs(fast, full).mean()
        assert share <= MAX_MISMATCH_SHARE, f"{which}: {share:.2%} of the fast frame differs from a full render"
    if fast_a.shape != fast_b.shape:
        return  # another layout: a new figure, nothing could freeze
    changed_full = _differs(full_a, full_b)
    assert changed_full.any(), f"the full render does not change from {first} to {second}"
    frozen = int((changed_full & ~_differs(fast_a, fast_b, STILL_STEP)).sum())
    limit = max(10, int(MAX_FROZEN_SHARE * changed_full.size))
    assert frozen <= limit, (f"{frozen} pixels change in a full render from {first} to {second} but not in "
                             f"the fast frame (limit {limit}): an artist is missing from build's artists")


def assert_renders_live_and_static(explorer: Explorer) -> None:
    """The explorer's figure, its live widget and its static scrubber all show something: the widget's
    image changes when its first control moves, and the scrubber holds one frame per static combination
    (and stays under 1.5 MB)."""
    assert_shows_something(figure_png(explorer.figure))
    assert explorer.widget.children
    image = explorer.image_widget
    assert_shows_something(image.value)
    first = next(iter(explorer.control_widgets.values()))
    options = [v for _, v in first.options] if isinstance(first.options[0], tuple) else list(first.options)
    before = image.value
    first.value = options[-1] if first.value != options[-1] else options[0]
    assert image.value != before, "moving the first control did not change the live image"
    html = explorer.static_html()
    assert html.count('class="ab-frame"') == math.prod(len(c.static) for c in explorer.controls)
    assert len(html) < 1_500_000


def _drawn_texts(fig: Figure) -> list:
    """The non-empty, visible text artists a render of ``fig`` draws: titles, labels, annotations, legend
    entries and the tick labels inside each axis' view (a tick outside it keeps a stale label that is never
    drawn). An axes turned off (``ax.axis("off")``) draws no axis labels or ticks."""
    from matplotlib.text import Text

    axis_texts, shown = set(), []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            axis_texts.update({id(axis.label), id(axis.offsetText)})
            if ax.axison and axis.get_visible():
                shown += [axis.label, axis.offsetText]
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                axis_texts.update({id(tick.label1), id(tick.label2)})
                if ax.axison and axis.get_visible() and lo - span <= tick.get_loc() <= hi + span:
                    shown += [t for t in (tick.label1, tick.label2) if t.get_visible()]
    for t in fig.findobj(Text):
        ax = t.axes
        if id(t) not in axis_texts and (ax is None or ax.get_visible()):
            shown.append(t)
    return [t for t in shown if t.get_visible() and t.get_text().strip()]


def assert_texts_fit(fig: Figure, where: str = "") -> None:
    """Every text the figure draws lies inside the figure, and no two texts overlap (a clipped title, a
    subtitle over a head's name). Measured on the figure's renderer, in pixels, with 1 pixel of slack."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    boxes = [(t, t.get_window_extent(renderer)) for t in _drawn_texts(fig)]
    problems = []
    for t, b in boxes:
        if b.x0 < -1 or b.y0 < -1 or b.x1 > W + 1 or b.y1 > H + 1:
            problems.append(f"{t.get_text()!r} at x {b.x0:.0f}..{b.x1:.0f}, y {b.y0:.0f}..{b.y1:.0f} extends "
                            f"beyond the {W:.0f} x {H:.0f} figure")
    for i, (t, a) in enumerate(boxes):
        for u, b in boxes[i + 1:]:
            dx = min(a.x1, b.x1) - max(a.x0, b.x0)
            dy = min(a.y1, b.y1) - max(a.y0, b.y0)
            if dx > 1 and dy > 1:
                problems.append(f"{t.get_text()!r} overlaps {u.get_text()!r} ({dx:.0f} x {dy:.0f} px)")
    assert not problems, f"{where}: " + "; ".join(problems[:8])


MIN_TEXT_PX = 10  # the smallest text a frame may show, in CSS pixels at the size it is displayed
COLUMN_PX = 700  # the book's column: a wider figure is shown scaled down to it


def assert_frame_readable(fig: Figure, where: str = "", *, pixels: bool = False, max_width: int = COLUMN_PX) -> None:
    """One explorer frame as a reader sees it: a PNG, every text inside the figure and apart from the others,
    the figure no wider than the book's column (``max_width`` CSS pixels; a wider one would be shown scaled
    down) and no text under :data:`MIN_TEXT_PX` pixels as displayed (10 pt at the figures' 72 dpi, one
    point a CSS pixel). With ``pixels`` (slow: decodes the PNG) also something drawn, and the whole figure
    at its own size."""
    png = figure_png(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    if pixels:
        px = assert_shows_something(png)
        assert px.shape[:2] == fig.canvas.get_width_height()[::-1], where  # the whole figure, at its own size
    css_width = fig.get_size_inches()[0] * 72  # the live widget and the book show 72 dpi figures 1:1
    assert css_width <= max_width + 0.5, f"{where}: {css_width:.0f} px wide, wider than the column ({max_width})"
    assert_texts_fit(fig, where)
    small = [(t.get_text(), t.get_fontsize()) for t in _drawn_texts(fig) if t.get_fontsize() < MIN_TEXT_PX]
    assert not small, f"{where}: text under {MIN_TEXT_PX} px: {small[:6]}"
