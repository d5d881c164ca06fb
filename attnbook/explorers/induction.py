"""Chapter 15's explorer: an induction head forming, step by step.

Scrub the training step of a run of :func:`attnbook.circuits.train_induction` and pick a layer and a head:
the head's attention on one repeated sequence at that step, with the repeat loss against steps (the step
marked) and the head's previous-token and prefix-matching scores at that step. The weights come from the
run's snapshots (:meth:`attnbook.circuits.InductionHistory.model_at`); nothing is trained here.

Dimension legend: T sequence length (queries), S keys (S = T), H heads per layer, N layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from ..circuits import InductionHistory, RepeatBatch, prefix_matching_scores, previous_token_scores
from .base import Control, Explorer

__all__ = ["induction_explorer"]


def induction_explorer(history: InductionHistory, batch: RepeatBatch, *, index: int = 0,
                       static_steps: int = 7) -> Explorer:
    """Training step (the recorded ``history.steps``), layer and head -> that head's attention on sequence
    ``index`` of ``batch`` at that step, the repeat loss against steps and the head's scores. The book's
    scrubber shows ``static_steps`` steps spread over the run, every layer and head."""
    if not isinstance(history, InductionHistory) or not history.snapshots:
        raise TypeError(f"history must be an InductionHistory with snapshots, got {type(history).__name__}")
    if not isinstance(batch, RepeatBatch):
        raise TypeError(f"batch must be a RepeatBatch, got {type(batch).__name__}")
    if not 0 <= index < batch.tokens.shape[0]:
        raise ValueError(f"index {index} is outside the batch of {batch.tokens.shape[0]} sequences")
    steps = list(history.steps)
    num_layers, num_heads = history.config["num_layers"], history.config["num_heads"]
    one = RepeatBatch(batch.tokens[index:index + 1], batch.start[index:index + 1], batch.length[index:index + 1])
    T = one.tokens.shape[1]
    start, length = int(one.start[0]), int(one.length[0])
    cache: dict[int, tuple[torch.Tensor, ...]] = {}

    def weights_at(i: int) -> tuple[torch.Tensor, ...]:
        if i not in cache:
            with torch.no_grad():
                cache[i] = history.model_at(i)(one.tokens)[1]
        return cache[i]

    def compute(step: int, layer: int, head: int) -> dict:
        i = steps.index(step)
        w = weights_at(i)[layer - 1]  # (1, H, T, T)
        return {
            "step": step, "layer": layer, "head": head,
            "map": w[0, head - 1].numpy(),  # (T, T)
            "previous_token": float(previous_token_scores(w)[head - 1]),
            "prefix_matching": float(prefix_matching_scores(w, one)[head - 1]),
            "loss": history.repeat_loss[i],
        }

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        fig = Figure(figsize=(9.0, 4.2), dpi=72)
        a1 = fig.add_axes((0.06, 0.13, 0.40, 0.72))
        a2 = fig.add_axes((0.58, 0.55, 0.38, 0.30))
        a3 = fig.add_axes((0.58, 0.13, 0.38, 0.26))
        image = a1.imshow(np.zeros((T, T)), vmin=0.0, vmax=1.0, cmap="viridis")
        a1.set_xlabel("key position", fontsize=10)
        a1.set_ylabel("query position", fontsize=10)
        for pos in (start + length - 0.5,):  # where the second copy begins
            a1.axhline(pos, color="white", lw=0.8, ls=":")
            a1.axvline(pos, color="white", lw=0.8, ls=":")
        a1.tick_params(labelsize=10)
        a2.plot(steps, history.repeat_loss, color="C0")
        (marker,) = a2.plot([], [], "o", color="tab:red", ms=7)
        a2.set_xlabel("training step", fontsize=10)
        a2.set_ylabel("repeat loss", fontsize=10)
        a2.tick_params(labelsize=10)
        bars = a3.barh([1, 0], [0.0, 0.0], color=["C1", "C2"], height=0.6)
        a3.set_yticks([1, 0], labels=["previous-token", "prefix-matching"], fontsize=10)
        a3.set_xlim(0, 1)
        a3.tick_params(labelsize=10)
        a3.set_xlabel("this head's score on this sequence", fontsize=10)
        page = fig.add_axes((0.0, 0.0, 1.0, 1.0))
        page.axis("off")
        title = page.text(0.5, 0.98, " ", fontsize=11, ha="center", va="top")
        return fig, {"image": image, "marker": marker, "bars": list(bars), "title": title}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        art["image"].set_data(d["map"])
        art["marker"].set_data([d["step"]], [d["loss"]])
        art["bars"][0].set_width(d["previous_token"])
        art["bars"][1].set_width(d["prefix_matching"])
        art["title"].set_text(f"step {d['step']}: layer {d['layer']}, head {d['head']} "
                              f"(repeat loss {d['loss']:.2f})")

    def caption(d: dict) -> str:
        return (f"Step {d['step']}, layer {d['layer']}, head {d['head']}: previous-token score "
                f"{d['previous_token']:.2f}, prefix-matching score {d['prefix_matching']:.2f} on this sequence "
                f"(repeat distance {length}, second copy from position {start + length}); repeat loss "
                f"{d['loss']:.2f} on the evaluation batch.")

    picks = sorted({steps[round(k * (len(steps) - 1) / max(static_steps - 1, 1))] for k in range(static_steps)})
    return Explorer(
        "An induction head forming",
        [
            Control("step", steps, steps[-1], label="training step", static=picks),
            Control("layer", list(range(1, num_layers + 1)), num_layers, label="layer", kind="toggle"),
            Control("head", list(range(1, num_heads + 1)), 1, label="head", kind="toggle"),
        ],
        compute, caption=caption, build=build, redraw=redraw,
    )
