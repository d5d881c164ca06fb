"""Training and evaluation loops for the toy tasks in :mod:`attnbook.tasks`.

Dimension legend:
    B  batch size
    H  number of heads
    S  source length
    L  target length including the final EOS

``fit`` works with any model that has ``loss(src, tgt) -> scalar`` and
``generate(src, max_new_tokens) -> (B, <= L)`` ids, as
:class:`attnbook.tasks.Seq2SeqTransformer` and
:class:`attnbook.tasks.DecoderOnlyTransformer` do. ``attention_alignment`` also
needs ``source_attention(src, tgt) -> [weights (B, H, L, S) per layer]``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.types import Device
from tqdm.auto import tqdm

from ._checks import check_int
from ._compat import default_device
from .tasks import Seq2SeqTransformer, Task

__all__ = ["History", "Alignment", "TaskAttention", "eval_mode", "fit", "evaluate", "predict", "attention_alignment",
           "run_with_attention", "check_seq2seq"]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``with eval_mode(model):`` runs the block with ``model.eval()`` (no dropout) and then puts back the
    training flag the model had, even when the block raises."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@dataclass
class History:
    """What :func:`fit` measured. One entry per evaluation point:

    Attributes:
        step: the number of optimizer steps taken at that point.
        loss: mean training loss over the steps since the previous point.
        accuracy: whole-sequence accuracy (greedy decoding) on held-out sources.
        lr: the learning rate at that point.
        seconds: total wall time of ``fit``, evaluations included.
    """

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def __repr__(self) -> str:
        if not self.step:
            return "History(empty)"
        return (
            f"History({len(self.step)} points, step {self.step[-1]}, loss {self.loss[-1]:.4f}, "
            f"accuracy {self.accuracy[-1]:.3f}, {self.seconds:.1f} s)"
        )


@dataclass
class Alignment:
    """Share of attention that lands on the expected source positions.

    Attributes:
        scores: ``(num_layers, H)``; the mean over examples and target tokens
            of the attention weight summed over the expected positions (1 =
            every query looks only where expected).
        layer, head: the best head.
        score: its score, ``scores[layer, head]``.
    """

    scores: torch.Tensor
    layer: int
    head: int
    score: float

    def __repr__(self) -> str:
        return f"Alignment(best layer {self.layer}, head {self.head}: {self.score:.3f})"


def _check_model(model: object, *methods: str) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for m in methods:
        if not callable(getattr(model, m, None)):
            raise TypeError(f"{type(model).__name__} has no {m}() method; use a model from attnbook.tasks")


def _check_task(task: object) -> None:
    if not isinstance(task, Task):
        raise TypeError(f"task must be an attnbook.tasks.Task (e.g. copy_task()), got {type(task).__name__}")


def _toy(model: nn.Module) -> Any:
    """``model`` for calling the methods a toy model adds (``loss``, ``generate``, ``source_attention``),
    which ``nn.Module``'s type does not know; :func:`_check_model` has checked that they exist."""
    return model


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


@torch.no_grad()
def predict(model: nn.Module, task: Task, src: torch.Tensor) -> torch.Tensor:
    """Greedy answers ``(B, L)`` for sources ``(B, S)``: what the model writes,
    padded with PAD to the target length (EOS included)."""
    _check_model(model, "generate")
    _check_task(task)
    task.check_src(src)
    L = task.tgt_len + 1
    with eval_mode(model):
        out = _toy(model).generate(src.to(_model_device(model)), L)  # (B, <= L)
    if out.shape[1] < L:
        pad = torch.full((out.shape[0], L - out.shape[1]), task.vocab.pad_id, dtype=out.dtype, device=out.device)
        out = torch.cat([out, pad], dim=1)  # (B, L)
    return out


def evaluate(
    model: nn.Module,
    task: Task,
    n: int = 1000,
    seed: int = 1234,
    *,
    split: str = "test",
    batch_size: int = 500,
) -> float:
    """Whole-sequence accuracy of greedy decoding on ``n`` sources drawn with
    ``seed`` (held-out ones by default): an example counts only if every
    answer token and the final EOS are right."""
    _check_model(model, "generate")
    _check_task(task)
    check_int("n", n)
    check_int("batch_size", batch_size)
    src, tgt = task.batch(n, seed=seed, split=split)
    correct = 0
    for i in range(0, n, batch_size):
        pred = predict(model, task, src[i : i + batch_size]).cpu()  # (b, L)
        correct += int((pred == tgt[i : i + batch_size]).all(dim=1).sum())
    return correct / n


def _lr_factor(step: int, steps: int, warmup: int, min_factor: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_factor``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def fit(
    model: nn.Module,
    task: Task,
    steps: int = 1000,
    batch_size: int = 64,
    lr: float = 3e-3,
    *,
    weight_decay: float = 0.01,
    warmup: int = 50,
    min_lr_factor: float = 0.1,
    clip_grad: float | None = 1.0,
    device: Device = None,
    seed: int = 0,
    eval_every: int | None = None,
    eval_n: int = 200,
    stop_at: float | None = None,
    progress: bool = True,
) -> History:
    """Train ``model`` on fresh batches of ``task`` (training split) with AdamW.

    Args:
        steps, batch_size, lr: optimizer steps, examples per step, peak learning rate.
        weight_decay: AdamW's decoupled weight decay.
        warmup: steps of linear warmup; after it the rate follows a cosine
            down to ``min_lr_factor * lr`` at the last step. ``warmup=0`` and
            ``min_lr_factor=1`` give a constant rate.
        clip_grad: clip the gradients' global norm to this (None: no clipping).
        device: where to train; ``None`` means :func:`attnbook.default_device`.
            The model is moved there and stays there.
        seed: seeds the stream of training batches (the model's initial
            weights come from the global seed at its construction).
        eval_every: steps between evaluation points (default: 10 points in all);
            each point records the mean training loss and the whole-sequence
            accuracy on ``eval_n`` held-out examples.
        stop_at: stop early once an evaluation point reaches this accuracy.
        progress: show a tqdm progress bar (``tqdm.auto``, so a widget in Jupyter).

    Returns:
        a :class:`History`. The model is left in eval mode.
    """
    _check_model(model, "loss", "generate")
    _check_task(task)
    check_int("steps", steps)
    check_int("batch_size", batch_size)
    check_int("warmup", warmup, 0)
    check_int("eval_n", eval_n)
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    if clip_grad is not None and not clip_grad > 0:
        raise ValueError(f"clip_grad must be positive or None, got {clip_grad!r}")
    if not 0.0 <= min_lr_factor <= 1.0:
        raise ValueError(f"min_lr_factor must be in [0, 1], got {min_lr_factor!r}")
    eval_every = max(1, steps // 10) if eval_every is None else eval_every
    check_int("eval_every", eval_every)

    device = default_device() if device is None else torch.device(device)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps, warmup, min_lr_factor))
    generator = torch.Generator().manual_seed(seed)
    history = History()
    start = time.perf_counter()
    running, count = 0.0, 0
    bar = tqdm(range(steps), desc=f"fit {task.name}", disable=not progress, leave=False)
    for step in bar:
        model.train()
        src, tgt = task.batch(batch_size, generator=generator, device=device)
        loss = _toy(model).loss(src, tgt)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_grad is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        optimizer.step()
        scheduler.step()
        running += loss.item()
        count += 1
        done = step + 1
        if done % eval_every == 0 or done == steps:
            acc = evaluate(model, task, n=eval_n, seed=seed + 1, batch_size=eval_n)
            history.step.append(done)
            history.loss.append(running / count)
            history.accuracy.append(acc)
            history.lr.append(optimizer.param_groups[0]["lr"])
            bar.set_postfix(loss=f"{running / count:.3f}", acc=f"{acc:.3f}")
            running, count = 0.0, 0
            if stop_at is not None and acc >= stop_at:
                break
    bar.close()
    model.eval()
    history.seconds = time.perf_counter() - start
    return history


@torch.no_grad()
def attention_alignment(model: nn.Module, task: Task, n: int = 256, seed: int = 1234) -> Alignment:
    """How well each head's attention from target to source matches the
    expected positions (:meth:`attnbook.tasks.Task.alignment_targets`: the
    diagonal for copy, the anti-diagonal for reverse, the operand digits of
    the same place for addition), under teacher forcing on ``n`` held-out
    examples. Returns the per-layer, per-head scores and the best head."""
    _check_model(model, "source_attention")
    _check_task(task)
    check_int("n", n)
    src, tgt = task.batch(n, seed=seed, split="test")
    expected = task.alignment_targets(src, tgt).float()  # (B, L, S)
    rows = expected.sum(-1) > 0  # (B, L): target tokens with an expected position
    if not bool(rows.any()):
        raise ValueError(f"task {task.name!r} has no expected source positions to score")
    with eval_mode(model):
        device = _model_device(model)
        per_layer = _toy(model).source_attention(src.to(device), tgt.to(device))  # [(B, H, L, S)]
    shares = []
    for w in per_layer:
        on_target = (w.cpu().float() * expected[:, None]).sum(-1)  # (B, H, L)
        shares.append((on_target * rows[:, None]).sum(dim=(0, 2)) / rows.sum())  # (H,)
    scores = torch.stack(shares)  # (num_layers, H)
    best = int(scores.argmax())
    layer, head = divmod(best, scores.shape[1])
    return Alignment(scores, layer, head, float(scores[layer, head]))


# ----------------------------------------------------------------------------- one input, every map


def _short(token: str) -> str:
    """``"<eos>"`` -> ``"eos"``: special tokens without brackets, so tick labels stay narrow."""
    return token[1:-1] if token.startswith("<") and token.endswith(">") else token


@dataclass
class TaskAttention:
    """One input run through a trained seq2seq model, with every attention map.

    Attributes:
        task: the task.
        source: the input text, e.g. ``"123+456"``.
        src: ``(1, S)`` its token ids.
        output: ``(1, L)`` what the model wrote (greedy, PAD after its EOS).
        target: ``(1, L)`` the correct answer (``task.solve``).
        weights: ``{"encoder" | "decoder_self" | "decoder_cross": [(H, T, K) per layer]}``.
        labels: for each kind, ``(query labels (T,), key labels (K,))``.
    """

    task: Task
    source: str
    src: torch.Tensor
    output: torch.Tensor
    target: torch.Tensor
    weights: dict[str, list[torch.Tensor]]
    labels: dict[str, tuple[list[str], list[str]]]

    @property
    def prediction(self) -> str:
        """What the model wrote, as text (up to its EOS)."""
        text = self.task.decode(self.output[0])  # (L,) -> one string
        assert isinstance(text, str)
        return text

    @property
    def correct(self) -> bool:
        """Every answer token and the final EOS right."""
        return bool(torch.equal(self.output, self.target))

    def pretty(self, which: str = "output") -> str:
        """``task.pretty`` of the source with the model's ``"output"`` or the correct ``"target"``."""
        return self.task.pretty(self.src, self.output if which == "output" else self.target)[0]

    def alignment_shares(self, layer: int = 0) -> torch.Tensor:
        """``(H,)``: per head, the mean share of cross-attention (layer ``layer``)
        on the expected source positions (:meth:`attnbook.tasks.Task.alignment_targets`),
        over the output tokens that have one: one input's version of
        :func:`attnbook.train.attention_alignment`."""
        expected = self.task.alignment_targets(self.src, self.target)[0].float()  # (L, S)
        rows = expected.sum(-1) > 0  # (L,)
        w = self.weights["decoder_cross"][layer]  # (H, L, S)
        on_target = (w * expected).sum(-1)  # (H, L)
        return on_target[:, rows].mean(-1)  # (H,)


def check_seq2seq(name: str, model: object) -> None:
    """TypeError unless ``model`` is a :class:`attnbook.tasks.Seq2SeqTransformer` (which has encoder,
    decoder and cross-attention maps)."""
    if not isinstance(model, Seq2SeqTransformer):
        raise TypeError(
            f"{name}: the explorer shows encoder, decoder and cross-attention, so it needs an "
            f"attnbook.tasks.Seq2SeqTransformer, got {type(model).__name__}"
        )


@torch.no_grad()
def run_with_attention(model: Seq2SeqTransformer, task: Task, text: str) -> TaskAttention:
    """Encode ``text``, let ``model`` write its answer greedily, and collect the
    attention weights of every block while the decoder reads its own output."""
    check_seq2seq("model", model)
    if not isinstance(task, Task):
        raise TypeError(f"task must be an attnbook.tasks.Task, got {type(task).__name__}")
    src = task.encode(text)  # (1, S)
    output = predict(model, task, src).cpu()  # (1, L)
    tgt_in = task.vocab.shift_right(output)  # (1, L): BOS, then the output shifted right
    device = _model_device(model)
    with eval_mode(model):
        _, attn = model(src.to(device), tgt_in.to(device), need_weights=True)
    weights = {kind: [w[0].float().cpu() for w in per_layer] for kind, per_layer in attn.items()}  # (H, T, K) each
    tokens = task.vocab.tokens
    src_labels = [tokens[i] for i in src[0].tolist()]
    out_labels = [_short(tokens[i]) for i in output[0].tolist()]
    in_labels = [_short(tokens[i]) for i in tgt_in[0].tolist()]
    labels = {
        "encoder": (src_labels, src_labels),
        "decoder_self": (out_labels, in_labels),
        "decoder_cross": (out_labels, src_labels),
    }
    return TaskAttention(task, text, src, output, task.solve(src), weights, labels)
