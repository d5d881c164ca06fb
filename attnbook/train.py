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

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.types import Device
from tqdm.auto import tqdm

from ._checks import check_int
from ._compat import default_device
from .tasks import Task

__all__ = ["History", "Alignment", "fit", "evaluate", "predict", "attention_alignment"]


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
    was_training = model.training
    model.eval()
    try:
        out = _toy(model).generate(src.to(_model_device(model)), L)  # (B, <= L)
    finally:
        model.train(was_training)
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
    was_training = model.training
    model.eval()
    try:
        device = _model_device(model)
        per_layer = _toy(model).source_attention(src.to(device), tgt.to(device))  # [(B, H, L, S)]
    finally:
        model.train(was_training)
    shares = []
    for w in per_layer:
        on_target = (w.cpu().float() * expected[:, None]).sum(-1)  # (B, H, L)
        shares.append((on_target * rows[:, None]).sum(dim=(0, 2)) / rows.sum())  # (H,)
    scores = torch.stack(shares)  # (num_layers, H)
    best = int(scores.argmax())
    layer, head = divmod(best, scores.shape[1])
    return Alignment(scores, layer, head, float(scores[layer, head]))
