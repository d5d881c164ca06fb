"""Small plotting helpers shared by the chapters and the explorers.

Dimension legend: T query length, S key length, H heads.
Every helper draws on a matplotlib ``Axes`` it is given (or a new one) and
returns it, so it works with pyplot in a notebook and with the pyplot-free
figures the explorers render.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["attention_heatmap", "heads_grid", "to_numpy"]


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def attention_heatmap(
    weights,
    ax=None,
    *,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    vmax: float | None = 1.0,
    cmap: str = "viridis",
    colorbar: bool = False,
):
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


def heads_grid(weights, fig, *, tokens: Sequence[str] | None = None, titles: Sequence[str] | None = None,
               ncols: int | None = None, vmax: float | None = 1.0):
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
