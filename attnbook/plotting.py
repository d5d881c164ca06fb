"""Small plotting helpers shared by the chapters and the explorers.

Dimension legend: T query length, S key length, H heads.
Every helper draws on a matplotlib ``Axes`` (or ``Figure``) it is given, or a
new one, so it works with pyplot in a notebook and with the pyplot-free
figures the explorers render:

* :func:`attention_heatmap`: one (T, S) map, optionally annotated;
* :func:`heads_grid`: H maps, one axes each;
* :func:`heads_mosaic`: H maps tiled into one image (one ``imshow`` instead of
  H axes: what the explorers draw, far faster to update);
* :func:`log_bars`: horizontal bars on a log axis with a value label each,
  whose lengths change (the explorers' time and memory bars); :func:`text_color_on`: black or white,
  whichever reads better on a given colour;
* :func:`index_ticks`: integer ticks only on an axis that counts positions (a heatmap's query and key
  axes: token 2, never 2.5).

Every helper hands matplotlib NumPy arrays (:func:`to_numpy`), never tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.container import BarContainer
    from matplotlib.figure import Figure
    from matplotlib.text import Text

__all__ = ["attention_heatmap", "heads_grid", "heads_mosaic", "index_ticks", "log_bars", "LogBars", "text_color_on",
           "to_numpy"]


def to_numpy(x: Any) -> np.ndarray:
    """A tensor (any device, any float dtype) or array-like as a NumPy array (float32 for tensors)."""
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def index_ticks(ax: Axes, which: str = "both") -> Axes:
    """Ticks at whole numbers only on ``ax``'s x axis, y axis or ``"both"``: the axes of a heatmap count
    token positions, and matplotlib's default ticks would read -0.5, 0.0, 0.5 at T = 4 or 2.5, 5.0 at
    T = 12. Returns ``ax``."""
    from matplotlib.ticker import MaxNLocator

    if which not in ("x", "y", "both"):
        raise ValueError(f"which must be 'x', 'y' or 'both', got {which!r}")
    axes = [ax.xaxis, ax.yaxis] if which == "both" else [ax.xaxis if which == "x" else ax.yaxis]
    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    return ax


def attention_heatmap(
    weights: Any,
    ax: Axes | None = None,
    *,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    vmax: float | None = 1.0,
    cmap: str = "viridis",
    colorbar: bool = False,
) -> Axes:
    """Draw one (T, S) attention map: rows are queries, columns keys.

    ``annotate`` writes each weight in its cell (default: when T * S <= 64).
    """
    w = to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap takes a (T, S) map, got shape {w.shape}")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(0.5 * w.shape[1] + 1.5, 0.5 * w.shape[0] + 1))
    im = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
    T, S = w.shape
    index_ticks(ax)  # positions are whole numbers (token labels below replace them)
    if queries is not None:
        ax.set_yticks(range(T), labels=list(queries))
    if keys is not None:
        ax.set_xticks(range(S), labels=list(keys), rotation=90 if max(map(len, keys), default=0) > 3 else 0)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if annotate is None:
        annotate = T * S <= 64
    if annotate:
        top = vmax if vmax is not None else float(w.max())
        for i in range(T):
            for j in range(S):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if w[i, j] > 0.6 * top else "white")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return ax


def heads_grid(weights: Any, fig: Figure, *, tokens: Sequence[str] | None = None,
               titles: Sequence[str] | None = None, ncols: int | None = None, vmax: float | None = 1.0) -> np.ndarray:
    """Draw H maps (weights (H, T, S)) on ``fig`` as a grid; returns the axes."""
    w = to_numpy(weights)
    if w.ndim != 3:
        raise ValueError(f"heads_grid takes (H, T, S) weights, got shape {w.shape}")
    H = w.shape[0]
    ncols = ncols or min(H, 4)
    nrows = -(-H // ncols)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        ax.set_title(titles[h] if titles else f"head {h}", fontsize=9)
        if tokens is not None and len(tokens) <= 16:
            ax.set_xticks(range(w.shape[2]), labels=list(tokens), rotation=90, fontsize=7)
            ax.set_yticks(range(w.shape[1]), labels=list(tokens), fontsize=7)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    return axes


def heads_mosaic(weights: torch.Tensor, ncols: int) -> torch.Tensor:
    """Tile H maps ``(H, T, S)`` into one ``(rows*(T+1)-1, ncols*(S+1)-1)`` image, NaN between tiles
    (``imshow`` leaves NaN blank); head ``h`` sits in row ``h // ncols``, column ``h % ncols``."""
    H, T, S = weights.shape
    nrows = -(-H // ncols)
    out = torch.full((nrows * (T + 1) - 1, ncols * (S + 1) - 1), float("nan"))
    for h in range(H):
        r, c = divmod(h, ncols)
        out[r * (T + 1): r * (T + 1) + T, c * (S + 1): c * (S + 1) + S] = weights[h]
    return out


def text_color_on(color: Any) -> str:
    """``"black"`` or ``"white"``, whichever has the higher contrast ratio (WCAG's relative luminance) with
    a background of ``color`` (any matplotlib colour): black on light grey or tab:orange, white on navy."""
    from matplotlib.colors import to_rgb

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in to_rgb(color))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


@dataclass
class LogBars:
    """Horizontal bars on a log x axis that start at ``lo``, each with a value label after its end
    (made by :func:`log_bars`). ``set(values, labels)`` moves them; ``artists`` are what changes."""

    bars: BarContainer
    texts: list[Text]
    lo: float

    def set(self, values: Sequence[float], labels: Sequence[str]) -> None:
        """Bar ``i`` ends at ``values[i]`` (at least just past ``lo``, so a log axis can show it), with
        ``labels[i]`` written after it, or inside its end when the bar reaches past 55% of the axis (after
        it, the label would run out of the axes and the figure): in black or white, whichever stands out
        more against the bar's colour (:func:`text_color_on`), so set the bars' colours first."""
        for bar, text, value, label in zip(self.bars, self.texts, values, labels):
            x = max(value, self.lo * 1.0001)
            bar.set_width(x - self.lo)
            lo, hi = bar.axes.get_xlim() if bar.axes is not None else (self.lo, x * 10)
            inside = math.log(x / lo) > 0.55 * math.log(hi / lo)
            text.set_x(x / 1.15 if inside else x * 1.15)
            text.set_horizontalalignment("right" if inside else "left")
            text.set_color(text_color_on(bar.get_facecolor()) if inside else "black")
            text.set_text(label)

    @property
    def artists(self) -> list[Any]:
        return [*self.bars, *self.texts]


def log_bars(ax: Axes, ys: Sequence[float], lo: float, hi: float, ticks: Sequence[float], *,
             color: Any, height: float = 0.6, fontsize: float = 8) -> LogBars:
    """Bars at heights ``ys`` on ``ax``, whose x axis becomes logarithmic from ``lo`` to ``hi`` with plain
    tick labels at ``ticks`` (mathtext labels are slow to draw); each bar starts at ``lo``."""
    bars = ax.barh(ys, [lo * 1.0001] * len(ys), left=lo, color=color, height=height)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xticks(list(ticks), labels=[f"{t:g}" for t in ticks])
    ax.minorticks_off()
    texts = [ax.text(lo, y, "", va="center", fontsize=fontsize) for y in ys]
    return LogBars(bars, texts, lo)
