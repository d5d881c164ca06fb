"""Chapter 12's explorer: the KV cache of six published models, split by kind of layer.

Pick a model and a context length S and see, for all six configs of :data:`attnbook.configs.CONFIGS`
at once, the KV cache of one sequence as a horizontal bar stacked by kind of layer (global full
attention, local sliding window, MLA latent, linear-attention state; counted by
:func:`attnbook.configs.kv_cache_by_layer`), and each model's total against S on log axes. The chosen
model is outlined, its curve drawn in black, and its rows written out under the figure.

Dimension legend: B batch (1 here), S context length (tokens per sequence).

Numbers are counted, not measured: keys, values and latents in bfloat16 (2 bytes), the linear layers'
recurrent state in float32, batch 1 (see :mod:`attnbook.configs` for exactly what each kind holds).
A bar is hatched where S is beyond the model's ``max_position_embeddings`` (the positions its config
allows, written under its name: 8K for Llama 3 8B; DeepSeek-V3's config allows 160K, its model card
advertises 128K).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .._checks import check_int
from ..configs import CONFIGS, LAYER_KIND_LABELS, LAYER_KINDS, CacheRow, format_bytes, kv_cache_by_layer
from .base import Control, Explorer

__all__ = ["CONTEXTS", "KIND_COLORS", "kv_budget_explorer"]

CONTEXTS = tuple(2**k for k in range(10, 18))  # 1K .. 128K tokens
KIND_COLORS = {"full": "tab:blue", "sliding": "tab:orange", "mla": "tab:green", "linear": "tab:purple"}
_GIB = 2.0**30
_MODELS = tuple(CONFIGS)


def _k(n: int) -> str:
    """A power-of-two token count in K: 1024 -> ``"1K"``."""
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


_LAYERS = {"full": "global (full attention) layers", "sliding": "local (sliding-window) layers",
           "mla": "MLA layers", "linear": "linear-attention layers"}


def _row_line(row: CacheRow) -> str:
    """One row in words: ``"52 local (sliding-window) layers x 1,024 tokens = 416 MiB"``."""
    if row.tokens is None:
        return f"{row.num_layers} {_LAYERS[row.kind]}: a fixed state of {format_bytes(row.bytes)}, the same at any S"
    what = " of latent" if row.kind == "mla" else ""
    return f"{row.num_layers} {_LAYERS[row.kind]} x {row.tokens:,} tokens{what} = {format_bytes(row.bytes)}"


def kv_budget_explorer(*, contexts: Sequence[int] = CONTEXTS,
                       static_contexts: Sequence[int] = (1024, 8192, 131072),
                       static_models: Sequence[str] = _MODELS, dtype_bytes: int = 2) -> Explorer:
    """Model (a dropdown over :data:`attnbook.configs.CONFIGS`) and context length S (a slider over
    ``contexts``, powers of two from 1K to 128K by default) -> every model's KV cache per sequence at S,
    stacked by kind of layer, and the totals against S. ``dtype_bytes`` is the size of a cached number
    (2: bfloat16). The book's scrubber shows ``static_models`` x ``static_contexts``."""
    contexts = [check_int("contexts", s) for s in contexts]
    check_int("dtype_bytes", dtype_bytes)
    bad = [m for m in static_models if m not in CONFIGS]
    if bad or not static_models:
        raise ValueError(f"static_models must be names of attnbook.configs.CONFIGS ({', '.join(CONFIGS)}), got {bad}")
    if not static_contexts or any(s not in contexts for s in static_contexts):
        raise ValueError(f"static_contexts must be among contexts {contexts}, got {list(static_contexts)}")
    dtype_name = {1: "fp8", 2: "bf16", 4: "fp32"}.get(dtype_bytes, f"{dtype_bytes}-byte")
    # the curves do not depend on the controls: counted once
    curves = {m: [sum(r.bytes for r in kv_cache_by_layer(m, s, dtype_bytes=dtype_bytes)) for s in contexts]
              for m in _MODELS}

    def compute(model: str, context_len: int) -> dict:
        rows = {m: kv_cache_by_layer(m, context_len, dtype_bytes=dtype_bytes) for m in _MODELS}
        totals = {m: sum(r.bytes for r in rs) for m, rs in rows.items()}
        return {
            "model": model, "name": CONFIGS[model].name, "context_len": context_len, "dtype_bytes": dtype_bytes,
            "rows": rows, "totals": totals, "selected_rows": rows[model], "total": totals[model],
            "beyond": {m: context_len > CONFIGS[m].max_position_embeddings for m in _MODELS},
            "contexts": contexts, "curves": curves,
        }

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        fig = Figure(figsize=(9.6, 4.9), dpi=72)
        a1 = fig.add_axes((0.18, 0.30, 0.43, 0.50))
        a2 = fig.add_axes((0.73, 0.30, 0.25, 0.50))
        n = len(_MODELS)
        ys = {m: n - 1 - i for i, m in enumerate(_MODELS)}  # the menu's order, top to bottom
        # one bar segment per model and kind, all redrawn (a kind a model lacks stays 0 wide)
        segments = {(m, k): a1.barh(ys[m], 0.0, height=0.62, color=KIND_COLORS[k], linewidth=0)[0]
                    for m in _MODELS for k in LAYER_KINDS}
        ends = {m: a1.text(0.0, ys[m], " ", va="center", fontsize=10) for m in _MODELS}
        a1.set_ylim(-0.6, n - 0.4)
        names = [f"{CONFIGS[m].name}\n{_k(CONFIGS[m].max_position_embeddings)} positions" for m in _MODELS]
        a1.set_yticks([ys[m] for m in _MODELS], labels=names, fontsize=10)
        a1.tick_params(axis="x", labelsize=10)
        a1.set_xlabel("GiB per sequence", fontsize=10)
        a1.grid(axis="x", alpha=0.3)
        a1.set_axisbelow(True)
        highlight = Rectangle((0.0, -0.4), 0.0, 0.8, fill=False, edgecolor="black", linewidth=2.0)
        a1.add_patch(highlight)
        # the totals against S, every model in grey, the chosen one in black
        for m in _MODELS:
            a2.plot(contexts, [b / _GIB for b in curves[m]], color="0.72", lw=1.0)
        a2.set_xscale("log", base=2)
        a2.set_yscale("log")
        a2.set_xlim(contexts[0] / 1.4, contexts[-1] * 1.4)
        lo = min(min(c) for c in curves.values()) / _GIB
        hi = max(max(c) for c in curves.values()) / _GIB
        a2.set_ylim(lo / 2, hi * 2)
        ticks = contexts[::2] if len(contexts) > 4 else contexts
        a2.set_xticks(ticks, labels=[_k(s) for s in ticks])  # plain labels: mathtext is slow
        yt = [v for v in (0.01, 0.1, 1.0, 10.0, 100.0) if lo / 2 <= v <= hi * 2]
        a2.set_yticks(yt, labels=[f"{v:g}" for v in yt])
        a2.minorticks_off()
        a2.tick_params(labelsize=10)
        a2.set_xlabel("context S (tokens)", fontsize=10)
        a2.set_ylabel("GiB (log)", fontsize=10)
        a2.grid(alpha=0.3)
        vline = a2.axvline(contexts[0], color="tab:red", lw=1.0)
        (line,) = a2.plot([], [], color="black", lw=2.2)
        (marker,) = a2.plot([], [], "o", color="tab:red", ms=7)
        t2 = a2.set_title(" ", fontsize=10)
        handles = [Patch(color=KIND_COLORS[k], label=LAYER_KIND_LABELS[k]) for k in LAYER_KINDS]
        handles.append(Patch(facecolor="0.6", edgecolor="white", hatch="///", label="S > max_position_embeddings"))
        fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.01, 0.935), ncol=3, fontsize=10,
                   frameon=False, handlelength=1.6, columnspacing=1.2)
        # the changing texts live on an axes over the whole figure, not on the figure: matplotlib leaves a figure's
        # own animated artists out of a full render (savefig), so tests could not compare them with the fast frame
        page = fig.add_axes((0.0, 0.0, 1.0, 1.0))
        page.axis("off")
        title = page.text(0.5, 0.985, " ", fontsize=11, ha="center", va="top")
        text = page.text(0.01, 0.015, " ", fontsize=10, va="bottom", ha="left")
        # a1's x axis (ticks, labels, grid) rescales with S, so it is redrawn too
        return fig, {"segments": list(segments.values()), "ends": list(ends.values()), "xaxis": a1.xaxis,
                     "highlight": highlight, "vline": vline, "line": line, "marker": marker, "t2": t2,
                     "title": title, "text": text, "ys": ys, "by_key": segments, "by_model": ends}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        S = d["context_len"]
        top = max(d["totals"].values()) / _GIB
        art["xaxis"].axes.set_xlim(0, top * 1.45)  # room for the labels at the bars' ends
        for m in _MODELS:
            left, past = 0.0, d["beyond"][m]
            sizes = {r.kind: r.bytes / _GIB for r in d["rows"][m]}
            for k in LAYER_KINDS:
                rect = art["by_key"][(m, k)]
                rect.set_x(left)
                rect.set_width(sizes.get(k, 0.0))
                rect.set_hatch("///" if past else None)
                rect.set_edgecolor("white" if past else KIND_COLORS[k])
                left += sizes.get(k, 0.0)
            art["by_model"][m].set_position((left + top * 0.03, art["ys"][m]))
            art["by_model"][m].set_text(format_bytes(d["totals"][m]))
        m = d["model"]
        y = art["ys"][m]
        art["highlight"].set_bounds(0.0, y - 0.4, d["total"] / _GIB, 0.8)
        art["vline"].set_xdata([S, S])
        art["line"].set_data(d["contexts"], [b / _GIB for b in d["curves"][m]])
        art["marker"].set_data([S], [d["total"] / _GIB])
        art["t2"].set_text(d["name"])
        art["title"].set_text(f"KV cache per sequence at S = {S:,} tokens ({dtype_name}, batch 1)")
        lines = [f"{d['name']} at S = {S:,}: {format_bytes(d['total'])} in all"]
        lines += ["    " + _row_line(r) for r in d["selected_rows"]]
        art["text"].set_text("\n".join(lines))

    def caption(d: dict) -> str:
        rows = "; ".join(_row_line(r) for r in d["selected_rows"])
        past = (f" (S is past its {CONFIGS[d['model']].max_position_embeddings:,}-token context)"
                if d["beyond"][d["model"]] else "")
        return (f"{d['name']} at S = {d['context_len']:,} tokens{past}: {format_bytes(d['total'])} of KV cache per "
                f"sequence ({dtype_name}, batch 1): {rows}. Source: {CONFIGS[d['model']].source}")

    default_context = 8192 if 8192 in static_contexts else static_contexts[0]
    return Explorer(
        "KV cache budget of published models",
        [
            Control("model", list(_MODELS), "gemma-3-27b" if "gemma-3-27b" in static_models else static_models[0],
                    label="model", kind="dropdown", static=list(static_models), fmt=lambda m: CONFIGS[m].name),
            Control("context_len", contexts, default_context, label="context length S",
                    static=[s for s in contexts if s in static_contexts], fmt=lambda s: f"{s:,}"),
        ],
        compute, caption=caption, build=build, redraw=redraw,
    )
