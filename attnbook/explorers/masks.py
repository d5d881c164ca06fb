"""Chapter 4's explorer: what each mask allows, and the attention it leaves.

Pick a mask kind (causal, padding, sliding window, their combinations), the
window, the real length of a padded sequence, the sequence length and the
device, and see the mask next to the attention weights it produces.

Dimension legend: T queries and keys (self-attention), E model dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from ..core import scaled_dot_product_attention
from ..masks import causal_mask, combine_masks, padding_mask, sliding_window_mask
from ..plotting import index_ticks
from .base import Control, Explorer, device_control
from .live import masks_caption, masks_inputs

__all__ = ["masks_explorer", "MASK_KINDS", "WINDOWED", "PADDED"]

MASK_KINDS = ["causal", "padding", "sliding window", "causal + padding", "causal + window"]
WINDOWED = ("sliding window", "causal + window")  # the kinds the window applies to
PADDED = ("padding", "causal + padding")  # the kinds the real length applies to
_T_VALUES = [4, 6, 8, 12, 16]
_WINDOWS = [0, 1, 2, 3, 4]
_LENGTHS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]


def _build_mask(kind: str, T: int, window: int, length: int) -> torch.Tensor:
    """The bool (T, T) mask an explorer kind stands for (True = may attend)."""
    if kind not in MASK_KINDS:
        raise ValueError(f"kind must be one of {MASK_KINDS}, got {kind!r}")
    pad = padding_mask([min(length, T)], max_len=T)[0, 0]  # (1, S) -> broadcasts over queries
    parts = {
        "causal": [causal_mask(T)],
        "padding": [pad],
        "sliding window": [sliding_window_mask(T, window)],
        "causal + padding": [causal_mask(T), pad],
        "causal + window": [sliding_window_mask(T, window, causal=True)],
    }[kind]
    mask = combine_masks(*parts)
    assert mask is not None
    return mask.expand(T, T)


def masks_explorer(seed: int = 0, d_model: int = 16) -> Explorer:
    """Mask kind (causal, padding lengths, sliding window, combinations), window,
    padding length, sequence length and device -> the mask and the attention it allows.

    The window applies to :data:`WINDOWED` kinds only (and goes up to T - 1, where it covers every key), the
    real length to :data:`PADDED` kinds only (up to T); the live widget disables the other one."""

    def limits(v: dict) -> dict[str, Sequence[Any] | None]:
        T = v["T"]
        return {"window": [w for w in _WINDOWS if w <= T - 1] if v["kind"] in WINDOWED else None,
                "length": [n for n in _LENGTHS if n <= T] if v["kind"] in PADDED else None}

    def compute(kind: str, T: int, window: int, length: int, device: str) -> dict:
        mask = _build_mask(kind, T, window, length)  # (T, S)
        x, wq, wk = masks_inputs(T, seed, d_model)  # (T, E), (E, E), (E, E): what the live page is fed too
        q, k = (x @ wq).to(device), (x @ wk).to(device)  # (T, D) each
        _, w = scaled_dot_product_attention(q, k, k, mask.to(device))  # (T, S)
        w = w.cpu()
        empty = int((~mask.any(-1)).sum())
        return {"kind": kind, "T": T, "window": window, "length": length, "device": device,
                "mask": mask, "weights": w, "allowed": int(mask.sum()), "empty_rows": empty}

    def layout(d: dict) -> int:
        return d["T"]

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        T = d["T"]
        fig = Figure(figsize=(7.2, 3.4), dpi=72)
        fig.subplots_adjust(left=0.08, right=0.98, top=0.86, bottom=0.15, wspace=0.3)
        a1, a2 = fig.subplots(1, 2)
        im1 = a1.imshow(torch.zeros(T, T).numpy(), cmap="Greys_r", vmin=0, vmax=1)
        a1.set_title("mask (white = may attend)", fontsize=10)
        im2 = a2.imshow(torch.zeros(T, T).numpy(), cmap="viridis", vmin=0, vmax=1)
        a2.set_title("attention weights", fontsize=10)
        for ax in (a1, a2):
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
            index_ticks(ax)  # positions are whole numbers
        title = fig.suptitle(" ", fontsize=11)
        return fig, {"mask": im1, "weights": im2, "title": title}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        art["mask"].set_data(d["mask"].float().numpy())
        art["weights"].set_data(d["weights"].numpy())
        art["title"].set_text(d["kind"])

    def caption(d: dict) -> str:
        return masks_caption(d)  # the live page's caption too

    return Explorer(
        "Masks",
        [
            Control("kind", MASK_KINDS, "causal", label="mask", kind="dropdown"),
            Control("T", _T_VALUES, 8, label="sequence length", static=[8]),
            Control("window", _WINDOWS, 2, label="window", static=[1, 3]),
            Control("length", _LENGTHS, 5, label="real length (padding)", static=[5]),
            device_control(),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw, limits=limits,
    )
