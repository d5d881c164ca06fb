"""Chapter 13's explorer: which tiles of the scores a FlexAttention block mask computes, and which it skips.

Pick a mask program (causal, sliding window, packed documents, prefix LM, padding) and a length T, and see
the dense mask (left) next to its block mask (right): each (query block, key block) tile of
:data:`attnbook.masks.FLEX_BLOCK_SIZE` x ``FLEX_BLOCK_SIZE`` pairs is full (every pair allowed: computed
without calling ``mask_mod``), partial (computed, ``mask_mod`` applied) or skipped (no pair allowed: a
compiled FlexAttention kernel never touches it). The share skipped is in the title and the caption.

Dimension legend: T queries and keys (self-attention, S = T), Bq, Bk queries and keys of one tile,
P side of the downsampled picture of the dense mask.

The tiles come from :func:`attnbook.masks.block_mask_stats`: ``create_block_mask``'s index lists where
FlexAttention is available (torch >= 2.5), else counted from the dense mask (the same tiles; the figure says
which), so the picture never depends on FlexAttention being installed.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch.nn.functional as F
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .._checks import check_int
from ..masks import (
    FLEX_BLOCK_SIZE,
    MaskMod,
    block_mask_stats,
    causal_mask_mod,
    combine_mask_mods,
    dense_mask,
    document_ids,
    document_mask_mod,
    padding_mask_mod,
    prefix_lm_mask_mod,
    sliding_window_mask_mod,
)
from .base import Control, Explorer

__all__ = ["block_mask_explorer", "MASK_PROGRAMS", "LENGTHS", "WINDOW", "DOCUMENT_SHARES", "PREFIX_SHARE",
           "REAL_SHARE", "TILE_COLORS"]

MASK_PROGRAMS = ("causal", "sliding window", "document", "prefix-LM", "padding", "causal + padding")
LENGTHS = (256, 512, 1024, 2048)
WINDOW = 256  # the causal sliding window: a query sees itself and the 256 keys before it
DOCUMENT_SHARES = (3, 1, 2, 2)  # four packed documents, in eighths of T (T = 256: 96, 32, 64, 64 tokens)
PREFIX_SHARE = 3  # the prefix LM's prefix, in eighths of T
REAL_SHARE = 5  # the padded sequence's real tokens, in eighths of T
TILE_COLORS = ("0.92", "tab:orange", "tab:blue")  # skipped, partial, full: the codes of masks.TILE_KINDS
_P = 256  # side of the dense mask's picture (a pixel is the share of allowed pairs it covers)


def _program(name: str, T: int) -> MaskMod:
    """The mask program an explorer choice stands for, at length T."""
    eighth = T // 8
    if name == "causal":
        return causal_mask_mod(T)
    if name == "sliding window":
        return sliding_window_mask_mod(WINDOW, causal=True)
    if name == "document":
        return document_mask_mod(document_ids([share * eighth for share in DOCUMENT_SHARES]))
    if name == "prefix-LM":
        return prefix_lm_mask_mod(PREFIX_SHARE * eighth)
    if name == "padding":
        return padding_mask_mod([REAL_SHARE * eighth], T)
    if name == "causal + padding":
        return combine_mask_mods(causal_mask_mod(T), padding_mask_mod([REAL_SHARE * eighth], T))
    raise ValueError(f"program must be one of {MASK_PROGRAMS}, got {name!r}")


_WHAT = {
    "causal": "causal",
    "sliding window": f"causal sliding window ({WINDOW} keys back)",
    "document": f"{len(DOCUMENT_SHARES)} documents packed, causal within each",
    "prefix-LM": f"prefix LM (bidirectional over {PREFIX_SHARE}/8 of T)",
    "padding": f"padding ({REAL_SHARE}/8 of T real)",
    "causal + padding": f"causal + padding ({REAL_SHARE}/8 of T real)",
}


def block_mask_explorer(*, block_size: int = FLEX_BLOCK_SIZE, lengths: tuple[int, ...] = LENGTHS,
                        static_lengths: tuple[int, ...] = (512, 2048)) -> Explorer:
    """Mask program (a dropdown over :data:`MASK_PROGRAMS`) and length T (a slider over ``lengths``) -> the
    dense mask next to its block mask of ``block_size`` tiles (full, partial, skipped), and the share of
    tiles skipped. The book's scrubber shows every program at ``static_lengths``."""
    block_size = check_int("block_size", block_size)
    lengths = tuple(check_int("lengths", T, 8) for T in lengths)
    if any(T % 8 for T in lengths):
        raise ValueError(f"lengths must be multiples of 8 (the programs split T in eighths), got {list(lengths)}")
    if not static_lengths or any(T not in lengths for T in static_lengths):
        raise ValueError(f"static_lengths must be among lengths {list(lengths)}, got {list(static_lengths)}")

    @lru_cache(maxsize=32)
    def stats(program: str, T: int) -> dict:
        mask_mod = _program(program, T)
        st = block_mask_stats(mask_mod, T, T, block_size)
        mask = dense_mask(mask_mod, 1, 1, T)[0, 0]  # (T, S)
        P = min(T, _P)
        picture = F.adaptive_avg_pool2d(mask.float()[None], P)[0]  # (P, P): the share of pairs allowed
        return {**st, "picture": picture.numpy(), "tile_grid": st["tiles"][0, 0].numpy().astype(np.int8)}

    def compute(program: str, T: int) -> dict:
        st = stats(program, T)
        return {"program": program, "T": T, "what": _WHAT[program], **st}

    def layout(d: dict) -> int:
        return d["T"]  # the tile boundaries drawn over both pictures

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        T = d["T"]
        n = d["tile_grid"].shape[0]
        P = d["picture"].shape[0]
        fig = Figure(figsize=(7.4, 4.6), dpi=72)
        a1 = fig.add_axes((0.08, 0.25, 0.38, 0.58))
        a2 = fig.add_axes((0.58, 0.25, 0.38, 0.58))
        im1 = a1.imshow(np.zeros((P, P)), cmap="Greys_r", vmin=0, vmax=1, interpolation="nearest",
                        extent=(0, T, T, 0))
        im2 = a2.imshow(np.zeros((n, n)), cmap=ListedColormap(list(TILE_COLORS)), vmin=-0.5, vmax=2.5,
                        interpolation="nearest", extent=(0, T, T, 0))
        edges = [i * block_size for i in range(1, n) if i * block_size < T]
        lines = []  # the tiles' boundaries over both pictures; redrawn after (over) the images, so named below
        for ax, color in ((a1, "tab:red"), (a2, "white")):
            for e in edges:
                lines += [ax.axhline(e, color=color, lw=0.7), ax.axvline(e, color=color, lw=0.7)]
            ticks = [0, T // 2, T]
            ax.set_xticks(ticks, labels=[str(t) for t in ticks])
            ax.set_yticks(ticks, labels=[str(t) for t in ticks])
            ax.tick_params(labelsize=10)
            ax.set_xlabel("key position", fontsize=10)
            ax.set_ylabel("query position", fontsize=10)
        a1.set_title("dense mask (white = may attend)", fontsize=10)
        a2.set_title(f"block mask: {n} x {n} tiles of {block_size} x {block_size}", fontsize=10)
        handles = [Patch(facecolor=TILE_COLORS[2], label="full (no mask_mod)"),
                   Patch(facecolor=TILE_COLORS[1], label="partial (mask_mod applied)"),
                   Patch(facecolor=TILE_COLORS[0], edgecolor="0.6", label="skipped (never computed)")]
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.075), ncol=3, fontsize=10,
                   frameon=False, handlelength=1.4, columnspacing=1.2)
        # the changing texts on an axes over the whole figure (a figure's own animated texts are left out of
        # a full render, so the blit test could not compare them)
        page = fig.add_axes((0.0, 0.0, 1.0, 1.0))
        page.axis("off")
        title = page.text(0.5, 0.975, " ", fontsize=11, ha="center", va="top")
        note = page.text(0.5, 0.012, " ", fontsize=10, ha="center", va="bottom", color="0.25")
        return fig, {"picture": im1, "tiles": im2, "edges": lines, "title": title, "note": note}

    def redraw(d: dict, art: dict[str, Any]) -> None:  # art["edges"] stay as built (a layout is one T)
        art["picture"].set_data(d["picture"])
        art["tiles"].set_data(d["tile_grid"])
        art["title"].set_text(f"{d['what']}, T = {d['T']:,}: {d['skipped']} of {d['total']} tiles skipped "
                              f"({d['skipped_share']:.0%})")
        if d["method"] == "flex":
            note = f"tiles from torch's create_block_mask; {d['allowed_share']:.0%} of the (query, key) pairs allowed"
        else:
            note = (f"FlexAttention unavailable (torch < 2.5): tiles counted from the dense mask; "
                    f"{d['allowed_share']:.0%} of pairs allowed")
        art["note"].set_text(note)

    def caption(d: dict) -> str:
        how = ("torch's create_block_mask" if d["method"] == "flex"
               else "the dense mask (FlexAttention is unavailable here)")
        return (f"{d['what']}, T = {d['T']:,}, tiles of {d['block_size']} x {d['block_size']}: "
                f"{d['skipped']} of {d['total']} tiles skipped ({d['skipped_share']:.1%}), {d['partial']} partial, "
                f"{d['full']} full; {d['allowed_share']:.1%} of the (query, key) pairs allowed. "
                f"Tiles from {how}.")

    return Explorer(
        "FlexAttention block masks",
        [
            Control("program", list(MASK_PROGRAMS), "sliding window", label="mask program", kind="dropdown"),
            Control("T", list(lengths), 2048 if 2048 in lengths else lengths[-1], label="length T",
                    static=[T for T in lengths if T in static_lengths], fmt=lambda T: f"{T:,}"),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
    )
