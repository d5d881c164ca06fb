"""Chapter 7's explorer: every head of a trained toy seq2seq model, on an input you pick.

Pick a toy task, one of a few prepared inputs, an attention block and a layer,
and see every head's map of a trained :class:`attnbook.tasks.Seq2SeqTransformer`
on that input, with what the model writes.

Dimension legend:
    H  number of heads
    S  source length (``task.src_len``)
    L  target length including the final EOS (``task.tgt_len + 1``)
    T  query length of the block shown: S for the encoder, L for the decoder
    K  key length of the block shown: S for the encoder and cross-attention, L
       for the decoder's self-attention

The decoder runs on its **own** greedy output (BOS, then what it wrote), so the
maps are exactly the weights it used while writing: decoder row ``k`` is the
query that writes output token ``k``.

    models = {"copy": (copy_model, copy_task(10)), "reverse": (reverse_model, reverse_task(10))}
    examples = {"copy": ["3141592653", "0000011111"], "reverse": ["3141592653", "0123456789"]}
    explorer = trained_heads_explorer(models, examples)
    explorer.update(task="reverse", kind="cross-attention")["weights"]   # (H, L, S)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from .._checks import check_int
from ..plotting import heads_mosaic
from ..tasks import Seq2SeqTransformer, Task
from ..train import TaskAttention, check_seq2seq, run_with_attention
from .base import Control, Explorer

__all__ = ["KINDS", "trained_heads_explorer"]

# what the reader picks -> the key of Seq2SeqTransformer's attention dict
KINDS = {
    "encoder self-attention": "encoder",
    "decoder self-attention": "decoder_self",
    "cross-attention": "decoder_cross",
}
_KIND_HELP = {
    "encoder": "rows: source positions (queries), columns: source positions (keys)",
    "decoder_self": "rows: the output token each query writes, columns: the decoder's input (BOS, then the output so far)",
    "decoder_cross": "rows: the output token each query writes, columns: the source it reads",
}


def _mosaic(weights: torch.Tensor, ncols: int) -> torch.Tensor:
    """The maps ``(H, T, K)`` tiled, ``ncols`` a row, with a blank row above each (room for its head's name)."""
    H, T, K = weights.shape
    return heads_mosaic(torch.cat([torch.full((H, 1, K), float("nan")), weights], dim=1), ncols)


def _build_figure(H: int, T: int, K: int, ncols: int, key_len: int) -> tuple[Figure, dict[str, Any]]:
    """One figure per layout (heads, query and key lengths, the longest key label): the mosaic image, the
    tick-label texts and the title are the only artists that change. Key labels longer than a character
    are written upwards."""
    nrows = -(-H // ncols)
    cell = max(0.18, 1.6 / K)  # inches per attention cell: room for a 10 pt label a row; tiles >= 1.6 inches
    rows, cols = nrows * (T + 2) - 1, ncols * (K + 1) - 1  # the mosaic's size in cells
    upright = key_len > 1
    bottom = 0.15 + 0.085 * key_len if upright else 0.3  # inches under the tiles: the key labels
    left, right, top = 0.55, 0.1, 0.55  # inches: query labels, margin, the two-line title
    width = max(cols * cell + left + right, 4.5)
    height = rows * cell + bottom + top
    fig = Figure(figsize=(width, height), dpi=72)
    ax = fig.add_axes((left / width, bottom / height, cols * cell / width, rows * cell / height))
    image = ax.imshow(_mosaic(torch.zeros(H, T, K), ncols).numpy(), cmap="viridis", vmin=0, vmax=1,
                      interpolation="nearest", aspect="auto")
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.axis("off")
    for h in range(H):
        r, c = divmod(h, ncols)
        ax.text(c * (K + 1) + (K - 1) / 2, r * (T + 2) + 0.3, f"head {h}", fontsize=10, ha="center", va="bottom")
    below = rows - 0.3  # key labels under the last row of tiles (the same for every tile)
    key_texts = [ax.text(c * (K + 1) + j, below, "", fontsize=10, ha="center", va="top", rotation=90 if upright else 0)
                 for c in range(ncols) for j in range(K)]
    query_texts = [ax.text(-0.7, r * (T + 2) + 1 + i, "", fontsize=10, ha="right", va="center")
                   for r in range(nrows) for i in range(T)]
    title = fig.text(0.05 / width, 1 - 0.04 / height, " ", fontsize=10, ha="left", va="top")
    return fig, {"image": image, "title": title, "keys": key_texts, "queries": query_texts}


def trained_heads_explorer(
    models: Mapping[str, tuple[Seq2SeqTransformer, Task]],
    examples: Mapping[str, Sequence[str]],
    *,
    static_examples: int | None = None,
    title: str = "Trained attention heads",
) -> Explorer:
    """Task, example input, attention kind and layer -> every head's map of that
    task's trained model on that input, and what the model writes.

    Args:
        models: task name -> ``(model, task)``; each model an
            :class:`attnbook.tasks.Seq2SeqTransformer` trained on ``task``.
        examples: task name -> the inputs to choose from (text as for
            ``task.encode``); the same number for every task, since the
            example control picks them by number.
        static_examples: how many of the examples the book's scrubber
            pre-renders (default: all). Static frames: tasks x static examples
            x 3 kinds x layers.
        title: the explorer's title.

    ``explorer.data`` holds ``weights (H, T, K)``, the labels, the input, the
    prediction and, for cross-attention, ``shares (H,)``: each head's share of
    attention on the expected source positions for this input. Each input is
    run through its model once, on first use, and kept.
    """
    if not models:
        raise ValueError("models is empty; give at least one task name -> (model, task)")
    if set(models) != set(examples):
        raise ValueError(f"models and examples must have the same task names, got {sorted(models)} and {sorted(examples)}")
    names = list(models)
    for name in names:
        pair = models[name]
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"models[{name!r}] must be a (model, task) tuple, got {type(pair).__name__}")
        check_seq2seq(f"models[{name!r}]", pair[0])
        if not isinstance(pair[1], Task):
            raise TypeError(f"models[{name!r}]: the second item must be an attnbook.tasks.Task, got {type(pair[1]).__name__}")
    counts = {name: len(examples[name]) for name in names}
    if min(counts.values()) < 1 or len(set(counts.values())) != 1:
        raise ValueError(f"give the same number (>= 1) of examples for every task, got {counts}")
    n_examples = counts[names[0]]
    for name in names:
        task = models[name][1]
        for text in examples[name]:
            try:
                task.encode(text)
            except ValueError as err:
                raise ValueError(f"examples[{name!r}]: {text!r} is not a {task.name} source: {err}") from None
    static_examples = n_examples if static_examples is None else check_int("static_examples", static_examples,
                                                                            1, n_examples)
    depth = {(name, kind): len(models[name][0].encoder.layers if block == "encoder" else models[name][0].decoder.layers)
             for name in names for kind, block in KINDS.items()}  # layers of each task's model, per block
    max_layers = max(depth.values())
    runs: dict[tuple[str, int], TaskAttention] = {}

    def compute(task: str, example: int, kind: str, layer: int) -> dict:
        key = (task, example)
        if key not in runs:
            model, t = models[task]
            runs[key] = run_with_attention(model, t, examples[task][example])
        run = runs[key]
        k = KINDS[kind]
        per_layer = run.weights[k]
        shown = min(layer, len(per_layer) - 1)  # a shallower model shows its last layer
        queries, keys = run.labels[k]
        data: dict[str, Any] = {
            "task": task, "example": example, "kind": kind, "block": k, "layer": shown,
            "num_layers": len(per_layer), "weights": per_layer[shown], "queries": queries, "keys": keys,
            "source": run.source, "prediction": run.prediction, "pretty": run.pretty(),
            "answer": run.pretty("target"), "correct": run.correct, "shares": None, "run": run,
        }
        if k == "decoder_cross":
            data["shares"] = run.alignment_shares(shown)
        return data

    def layout(d: dict) -> tuple[int, int, int, int, int]:
        H, T, K = d["weights"].shape
        return H, T, K, min(H, 4), max(len(k) for k in d["keys"])  # heads, lengths, heads per row, longest key

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        return _build_figure(*layout(d))

    def redraw(d: dict, f: dict[str, Any]) -> None:
        H, T, K, ncols, _ = layout(d)
        f["image"].set_data(_mosaic(d["weights"], ncols).numpy())  # one image for all heads
        for i, t in enumerate(f["keys"]):
            t.set_text(d["keys"][i % K])
        for i, t in enumerate(f["queries"]):
            t.set_text(d["queries"][i % T])
        f["title"].set_text(f"{d['task']}: {d['kind']}, layer {d['layer']}\n{_KIND_HELP[d['block']]}")

    def caption(d: dict) -> str:
        verdict = "correct" if d["correct"] else f"wrong: the answer is {d['answer']}"
        text = f"{d['task']}: the model writes {d['pretty']} ({verdict})."
        if d["shares"] is not None:
            shares = ", ".join(f"{s:.2f}" for s in d["shares"].tolist())
            text += f" Share of each head's attention on the expected source positions: {shares}."
        return text

    return Explorer(
        title,
        [
            Control("task", names, names[0], label="task", kind="toggle"),
            Control("example", list(range(n_examples)), 0, label="example",
                    static=list(range(static_examples)), fmt=lambda i: f"#{i + 1}"),
            Control("kind", list(KINDS), "cross-attention", label="attention", kind="dropdown"),
            Control("layer", list(range(max_layers)), 0, label="layer"),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
        # the layers the chosen model has in the chosen block (a one-layer model: the slider is not shown)
        limits=lambda v: {"layer": list(range(depth[v["task"], v["kind"]]))},
    )
