"""Chapter 2's explorer: why attention scales its scores by 1/sqrt(d_k).

Move d_k, the sequence length, scaling on/off and the device, and see the
logits' spread, one query's weights, and entropy, largest weight and softmax
Jacobian norm against d_k, for unit-variance random queries and keys.

Dimension legend: B random queries (a batch), T sequence length (each query
sees T keys: S = T), D head dim (d_k).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import torch
from matplotlib.figure import Figure

from ..core import softmax_stats
from ..plotting import index_ticks
from .base import Control, Explorer, device_control

__all__ = ["saturation_explorer", "DK_VALUES"]

DK_VALUES = [2**i for i in range(11)]  # 1 .. 1024
DK_TICKS = [1, 4, 16, 64, 256, 1024]


def _queries_keys(d_k: int, T: int, n: int, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 7919 + d_k)
    q = torch.randn(n, d_k, generator=g)  # (B, D) unit-variance queries
    k = torch.randn(n, T, d_k, generator=g)  # (B, T, D) unit-variance keys
    return q.to(device), k.to(device)


@lru_cache(maxsize=32)
def _saturation_curves(T: int, device: str, n: int = 256, seed: int = 0) -> dict[str, Any]:
    curves: dict[str, Any] = {"d_k": DK_VALUES, "scaled": {}, "unscaled": {}}
    for name in ("scaled", "unscaled"):
        rows = []
        for d_k in DK_VALUES:
            q, k = _queries_keys(d_k, T, n, device, seed)
            logits = (k @ q[:, :, None]).squeeze(-1)  # (B, T)
            if name == "scaled":
                logits = logits / math.sqrt(d_k)
            rows.append(softmax_stats(logits.cpu()))
        curves[name] = {key: [r[key] for r in rows] for key in rows[0]}
    return curves


def saturation_explorer(seed: int = 0) -> Explorer:
    """d_k, sequence length, scaling on/off and device -> the logits' spread, one
    query's weights, and entropy / max weight / gradient norm against d_k."""

    def compute(d_k: int, T: int, scaled: bool, device: str) -> dict:
        q, k = _queries_keys(d_k, T, 64, device, seed)
        logits = (k @ q[:, :, None]).squeeze(-1)  # (B, T): B queries against T keys each
        if scaled:
            logits = logits / math.sqrt(d_k)
        logits = logits.cpu()
        curves = _saturation_curves(T, device, seed=seed)
        at = curves["d_k"].index(d_k)
        name = "scaled" if scaled else "unscaled"
        stats = {key: curves[name][key][at] for key in ("entropy", "max_weight", "grad_norm")}  # 256 queries
        return {
            "d_k": d_k, "T": T, "scaled": scaled, "device": device,
            "logits": logits, "weights": torch.softmax(logits[0].double(), -1),
            "logit_std": logits.std().item(), **stats, "curves": curves,
        }

    bins = torch.linspace(-64, 64, 65)  # one fixed logit axis for every d_k, so the spread is comparable

    def layout(d: dict) -> tuple:
        return d["T"], d["device"]  # the bars per key and the curves (measured on that device)

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        from matplotlib.lines import Line2D

        fig = Figure(figsize=(8.4, 5.6), dpi=72)
        fig.subplots_adjust(left=0.07, right=0.98, top=0.94, bottom=0.17, hspace=0.45, wspace=0.18)
        (a1, a2), (a3, a4) = fig.subplots(2, 2)
        width = float(bins[1] - bins[0])
        hist = a1.bar(bins[:-1].tolist(), [0.0] * 64, width=width, align="edge", color="tab:blue")
        a1.set_xlim(-64, 64)
        a1.set_ylim(0, 0.5)
        a1.set_xlabel("logit (values beyond ±64 are piled into the end bins)")
        a1.set_ylabel("share of logits")
        bars = a2.bar(range(d["T"]), [0.0] * d["T"], color="tab:orange")
        a2.set_ylim(0, 1)
        a2.set_xlabel("key")
        index_ticks(a2, "x")  # keys are whole numbers
        c = d["curves"]
        # one colour per scaling, one line style per quantity, in both lower panels
        for name, color in (("unscaled", "tab:blue"), ("scaled", "tab:orange")):
            a3.plot(c["d_k"], c[name]["entropy"], "-", marker=".", color=color)
            a4.plot(c["d_k"], c[name]["grad_norm"], "-", marker=".", color=color)
            a4.plot(c["d_k"], c[name]["max_weight"], ":", lw=1.6, color=color)
        a3.axhline(math.log(d["T"]), color="gray", lw=0.8, ls=":")
        a3.set_title(f"entropy (uniform = log T = {math.log(d['T']):.2f})", fontsize=11)
        a4.set_title("softmax Jacobian norm and max weight", fontsize=11)
        marks = []
        for ax in (a3, a4):
            ax.set_xscale("log", base=2)
            ax.set_xticks(DK_TICKS, labels=[str(t) for t in DK_TICKS])  # plain labels: mathtext is slow
            ax.minorticks_off()
            marks.append(ax.axvline(d["d_k"], color="red", lw=1))
            ax.set_xlabel("d_k")
        # the legend sits under the panels, where the moving red mark never crosses it
        handles = [Line2D([], [], color="tab:blue", marker=".", label="unscaled"),
                   Line2D([], [], color="tab:orange", marker=".", label="scaled by 1/√d_k"),
                   Line2D([], [], color="0.3", ls="-", label="Jacobian norm (right)"),
                   Line2D([], [], color="0.3", ls=":", lw=1.6, label="max weight (right)"),
                   Line2D([], [], color="red", lw=1, label="current d_k")]
        fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=10, frameon=False,
                   bbox_to_anchor=(0.5, 0.0), handlelength=1.8, columnspacing=1.2)
        t1 = a1.set_title(" ", fontsize=11)
        t2 = a2.set_title(" ", fontsize=11)
        return fig, {"hist": hist, "bars": bars, "marks": marks, "t1": t1, "t2": t2}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        z = d["logits"].flatten().double().clamp(-63.999, 63.999)
        share = torch.histogram(z, bins=bins.double())[0] / z.numel()
        for rect, h in zip(art["hist"], share.tolist()):
            rect.set_height(h)
        art["t1"].set_text(f"logits q·k{' / √d_k' if d['scaled'] else ''}: std {d['logit_std']:.2f}")
        for rect, w in zip(art["bars"], d["weights"].tolist()):
            rect.set_height(w)
        art["t2"].set_text(f"one query's weights over {d['T']} keys (max {d['weights'].max():.2f})")
        for mark in art["marks"]:
            mark.set_xdata([d["d_k"], d["d_k"]])

    def caption(d: dict) -> str:
        return (f"d_k = {d['d_k']}, T = {d['T']}, {'scaled by 1/√d_k' if d['scaled'] else 'unscaled'} "
                f"({d['device']}): entropy {d['entropy']:.2f}, max weight {d['max_weight']:.2f}, "
                f"Jacobian norm {d['grad_norm']:.3f}")

    return Explorer(
        "Softmax saturation",
        [
            Control("d_k", DK_VALUES, 64, label="d_k"),
            Control("T", [4, 8, 16, 32, 64], 16, label="sequence length", static=[16]),
            Control("scaled", [True, False], True, label="scaling", kind="toggle",
                    fmt=lambda s: "on (÷√d_k)" if s else "off"),
            device_control(),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
    )
