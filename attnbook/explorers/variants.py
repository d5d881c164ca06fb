"""Chapter 8's explorer: what each efficient attention variant scores and costs as the sequence grows.

Which (query, key) pairs each variant scores, how long it takes and how much
memory it holds, against exact attention and PyTorch's fused kernel.

The variants are :data:`attnbook.efficient.REGISTRY`'s: the pairs drawn are each variant's declared
:class:`attnbook.efficient.Pattern` (:func:`attnbook.efficient.pair_picture`), the costs come from
:func:`attnbook.efficient.measure_costs` (time: the median of interleaved rounds, the statistic chapter 8
and the benchmarks report; memory: tracked tensor by tensor, so the same on every run). This module holds
only the explorer and the choices it offers.

Dimension legend:
    B  batch size (1 by default)
    H  number of heads (2)
    T  sequence length; self-attention, so the key length S equals T
    D  head dimension (32)
    W  a variant's locality size, ``window``: the sliding window's half-width,
       BigBird's block size, Reformer's chunk size, FlashAttention's tile size
    P  side of a downsampled picture of the (T, T) pairs (``resolution``)

The variants shown (:data:`VARIANTS`), each on q, k, v of shape ``(B, H, T, D)``:

* ``"exact"``: :func:`attnbook.scaled_dot_product_attention`, which builds the
  (T, T) scores and weights;
* ``"sliding window"``, ``"block sparse"`` (BigBird: one window block on each
  side, one global block, one random block), ``"flash"``: exact under their
  pattern (flash: no pattern, all pairs, a tile of ``W`` keys at a time);
* ``"linear"`` (elu + 1 features) and ``"performer"`` (FAVOR+, 64 random
  features): no pair is ever scored, keys are summed into a small state;
* ``"LSH"`` (Reformer, shared queries and keys, one hash round, ``T / W``
  buckets, chunks of ``W``): the pairs depend on the data.

``"pytorch"`` (:func:`torch.nn.functional.scaled_dot_product_attention`,
PyTorch's fused kernel; on a CPU a tiled C++ kernel) is the second reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from ..efficient import NUM_FEATURES, REGISTRY, cost_key, measure_costs, pair_picture, pair_share
from ..plotting import log_bars
from .base import Control, Explorer

__all__ = ["VARIANTS", "T_VALUES", "WINDOWS", "variants_explorer"]

VARIANTS = tuple(name for name in REGISTRY if name != "pytorch")  # what the explorer offers
T_VALUES = (256, 512, 1024, 2048, 4096)
WINDOWS = (16, 32, 64, 128, 256)
BAR_LABELS = ("this variant", "exact, T×T", "PyTorch SDPA")


# ----------------------------------------------------------------------------- the explorer


def _checker(T: int, window: int, P: int) -> torch.Tensor:
    """(P, P) shading that alternates between FlashAttention's tiles (1 when a
    tile is smaller than a cell: nothing to show)."""
    cell = T / P
    if window < cell:
        return torch.ones(P, P)
    tile = (torch.arange(P) * cell / window).floor().long()  # (P,) tile of each cell
    return 1.0 - 0.35 * ((tile[:, None] + tile[None, :]) % 2).float()  # (P, P)


def _fmt(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def variants_explorer(
    measured: dict | None = None,
    *,
    t_values: Sequence[int] = T_VALUES,
    windows: Sequence[int] = WINDOWS,
    static_t: Sequence[int] = (256, 1024, 4096),
    static_windows: Sequence[int] = (64,),
    rounds: int = 5,
    resolution: int = 128,
    seed: int = 0,
) -> Explorer:
    """Variant, sequence length T and window -> the (query, key) pairs the variant
    scores (downsampled to at most ``resolution`` cells a side) and its measured
    time and tracked peak memory next to exact attention's and PyTorch's fused
    kernel's, on ``make_inputs(T)`` (B=1, H=2, D=32).

    ``measured`` (``{cost_key(...): {"time_s", "peak_bytes"}}``, e.g. from
    :func:`measure_costs` with ``reduce="median"``, as chapter 8 measures them) supplies costs already
    measured; the rest are measured on first use (the median of ``rounds`` interleaved rounds, the same
    statistic) and kept in that same dict. Passing the numbers for the static combinations makes the book's
    frames cost no measuring; their caption says they were measured when the page was built, the live one
    which numbers were measured just now. The window control applies to the variants that have one. The
    static frames: every variant x ``static_t``, window ``static_windows``.
    """
    costs = {} if measured is None else measured
    live: set[tuple] = set()  # the keys measured by this explorer (the rest came in ``measured``)
    roles = ("variant", "exact", "pytorch")

    def missing(variant: str, T: int, window: int) -> list[str]:
        names = dict.fromkeys((variant, "exact", "pytorch"))
        return [n for n in names if cost_key(n, T, window) not in costs or "peak_bytes" not in costs[cost_key(n, T, window)]]

    def cost(name: str, T: int, window: int) -> dict:
        key = cost_key(name, T, window)
        if key not in costs or "peak_bytes" not in costs[key]:
            costs.update(measure_costs([name], [T], window, rounds=rounds, seed=seed, reduce="median"))
            live.add(key)
        return costs[key]

    def busy(v: dict) -> str | None:
        todo = missing(v["variant"], v["T"], v["window"])
        if not todo:
            return None
        return (f"measuring {', '.join(todo)} at T = {v['T']:,} (median of {rounds} rounds, with its memory); "
                "this takes a few seconds for long sequences")

    def compute(variant: str, T: int, window: int) -> dict:
        share = pair_share(variant, T, window, seed=seed)
        names = {"variant": variant, "exact": "exact", "pytorch": "pytorch"}
        c = {role: cost(name, T, window) for role, name in names.items()}
        return {
            "variant": variant, "T": T, "window": window, "uses_window": REGISTRY[variant].window is not None,
            "picture": pair_picture(variant, T, window, resolution, seed=seed), "pair_share": share,
            "time_s": {role: x["time_s"] for role, x in c.items()},
            "peak_bytes": {role: x["peak_bytes"] for role, x in c.items()},
            # the variants whose numbers this explorer measured (the others came in ``measured``)
            "measured_now": [n for n in dict.fromkeys(names.values()) if cost_key(n, T, window) in live],
            "shown": list(dict.fromkeys(names.values())),
        }

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        import matplotlib as mpl

        fig = Figure(figsize=(9.6, 3.5), dpi=72)
        fig.subplots_adjust(left=0.03, right=0.96, top=0.84, bottom=0.17, wspace=0.12)
        gs = fig.add_gridspec(1, 5, width_ratios=[1.0, 0.45, 1.25, 0.1, 1.25])
        a0 = fig.add_subplot(gs[0])
        cmap = mpl.colormaps["Blues"].with_extremes(bad="#e8e8e8")
        norm = mpl.colors.PowerNorm(0.5, vmin=0, vmax=1)  # sparse scattered pairs stay visible
        image = a0.imshow(torch.ones(resolution, resolution).numpy(), cmap=cmap, norm=norm,
                          extent=(0, 1, 1, 0), interpolation="nearest")
        a0.set_xticks([])
        a0.set_yticks([])
        a0.set_xlabel("key j →")
        a0.set_ylabel("← query i")
        note = a0.text(0.5, 0.5, "", ha="center", va="center", fontsize=10, transform=a0.transAxes)
        title0 = a0.set_title(" ", fontsize=11)
        bars = {}
        for n, (what, unit) in enumerate((("time", "ms"), ("peak memory (tracked)", "MiB"))):
            ax = fig.add_subplot(gs[2 * n + 2])
            bars[unit] = log_bars(ax, [2, 1, 0], 1e-2, 1e4, [1e-2, 1, 1e2, 1e4], color=("tab:orange", "tab:blue",
                                                                                         "tab:green"), fontsize=10)
            ax.set_ylim(-0.6, 2.6)
            ax.set_yticks([2, 1, 0], labels=BAR_LABELS if n == 0 else [""] * 3, fontsize=10)
            ax.set_xlabel(f"{what}, {unit} (log scale)", fontsize=10)
            ax.grid(axis="x", alpha=0.3)
        title = fig.suptitle(" ", fontsize=11)
        return fig, {"image": image, "note": note, "title0": title0, "title": title,
                     "ms": bars["ms"].artists, "MiB": bars["MiB"].artists, "bars": bars}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        T, window, name = d["T"], d["window"], d["variant"]
        picture = d["picture"]
        if name == "flash":
            picture = picture * _checker(T, window, picture.shape[0])
        art["image"].set_data(picture.numpy())
        if d["pair_share"] is None:
            width = "D = 32" if name == "linear" else f"m = {NUM_FEATURES}"
            art["note"].set_text(f"no (query, key) score\nis ever computed:\nkeys are summed into a\n({width}) × D state")
            art["title0"].set_text("pairs scored: none")
        else:
            art["note"].set_text("")
            art["title0"].set_text(f"pairs scored: {d['pair_share']:.1%} of T²")
        for unit, values, scale in (("ms", d["time_s"], 1e3), ("MiB", d["peak_bytes"], 2.0**-20)):
            art["bars"][unit].set([values[r] * scale for r in roles], [_fmt(values[r] * scale) for r in roles])
        used = f", {REGISTRY[name].window} {window}" if d["uses_window"] else ""
        art["title"].set_text(f"{name}{used}, T = {T}")

    def numbers(d: dict) -> str:
        t, m = d["time_s"], d["peak_bytes"]
        share = "no pairs scored" if d["pair_share"] is None else f"{d['pair_share']:.1%} of the T² pairs scored"
        return (f"{d['variant']}, T = {d['T']}: {share}; time {t['variant'] * 1e3:.3g} ms vs exact "
                f"{t['exact'] * 1e3:.3g} ms and PyTorch's fused kernel {t['pytorch'] * 1e3:.3g} ms; peak memory "
                f"{m['variant'] / 2**20:.3g} MiB vs {m['exact'] / 2**20:.3g} MiB and {m['pytorch'] / 2**20:.3g} MiB")

    def static_caption(d: dict) -> str:
        return f"{numbers(d)} (times: median of interleaved rounds, one thread, measured when the page was built)"

    def caption(d: dict) -> str:
        now = d["measured_now"]
        if not now:
            when = "measured earlier in this notebook, before this explorer"
        elif len(now) == len(d["shown"]):
            when = "measured just now, on this machine"
        else:
            when = f"{' and '.join(now)} measured just now on this machine, the rest earlier in this notebook"
        return f"{numbers(d)} (times: median of interleaved rounds, one thread; {when})"

    t_values, windows = list(t_values), list(windows)
    static_t, static_windows = list(static_t), list(static_windows)
    return Explorer(
        "Efficient attention: cost against sequence length",
        [
            Control("variant", VARIANTS, "sliding window", label="variant", kind="dropdown"),
            Control("T", t_values, 1024 if 1024 in static_t else static_t[0], label="sequence length T",
                    static=list(static_t)),
            Control("window", windows, static_windows[0], label="window / block", static=list(static_windows)),
        ],
        compute, caption=caption, build=build, redraw=redraw, busy=busy, static_caption=static_caption,
        limits=lambda v: {} if REGISTRY[v["variant"]].window is not None else {"window": None},
    )
