"""Associative recall: a sequence stores (key, value) pairs and ends with a query key; the answer is the value
stored with that key. This is the task in its simplest form, the one chapter 11 measures for softmax and linear
attention (chapter 13 adds the delta rule): a single query per sequence, and pre-paired tokens, each holding a
key together with its value. The multi-query associative recall (MQAR) of Zoology (Arora et al., 2023) is
harder on both counts: keys and values are separate tokens, and many queries follow.

Dimension legend:
    B  batch size
    S  stored (key, value) pairs of a sequence (``num_pairs``; the chapters call it N)
    T  tokens of a sequence, S + 1: the pairs, then the query
    H  number of heads;  D  head dimension;  E  model width (``width``)

The task: the keys of a sequence are S distinct symbols out of :data:`KEYS`, each value one of :data:`VALUES`
symbols; a token is its key's embedding plus its value's, and the last token is the query key's embedding
plus a "none" value's. There are no positions: the pairs are a set. A :class:`PairRecall` model is one
attention layer of :data:`NUM_HEADS` heads over those tokens and a linear readout of the last one, trained
with the budget of chapter 0 and 11 (:data:`STEPS` Adam steps on fresh batches of :data:`BATCH`, learning rate
:data:`LR`) and scored on :data:`EVAL_SIZE` held-out sequences (:func:`train_pairs`, :func:`recall_accuracies`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_int
from .core import scaled_dot_product_attention
from .efficient import delta_rule_attention, linear_attention
from .mha import MultiHeadAttention, merge_heads

__all__ = ["KEYS", "VALUES", "WIDTH", "NUM_HEADS", "STEPS", "BATCH", "LR", "EVAL_SIZE", "RECALL_KINDS",
           "pairs_batch", "PairRecall", "train_pairs", "recall_accuracies"]

KEYS = 128
"""Key symbols; a sequence's keys are distinct, so it stores at most this many pairs."""
VALUES = 8
"""Value symbols (chapter 0's K = 8); chance is 1 / VALUES."""
WIDTH = 32
"""Model width E of chapter 11's recall models (2 heads of D = 16)."""
NUM_HEADS = 2
STEPS, BATCH, LR = 300, 64, 3e-3
"""Chapter 0's and 11's training budget: Adam steps, sequences per step, learning rate."""
EVAL_SIZE = 2000
"""Held-out sequences an accuracy is measured on (chapter 11 uses 4000; 2000 keep the standard error of an
accuracy under 0.012 at half the time)."""
RECALL_KINDS = ("softmax", "linear", "delta")
"""The attention of a :class:`PairRecall`: softmax attention, linear attention (elu + 1 features), the delta rule."""

_EVAL_SEED = 1234  # the held-out sequences, the same for every model


def pairs_batch(batch_size: int, num_pairs: int, generator: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``batch_size`` sequences of ``num_pairs`` (key, value) pairs with distinct keys, and a query key each,
    drawn from ``generator``: keys and values ``(B, S)``, the query key ``(B,)`` (one of the stored keys) and
    the target ``(B,)``, the value stored with it. (The draws are chapter 11's ``pairs_batch``: the same
    generator state gives the same sequences.)"""
    B = check_int("batch_size", batch_size)
    S = check_int("num_pairs", num_pairs, 1, KEYS)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    keys = torch.rand(B, KEYS, generator=generator).argsort(dim=1)[:, :S]  # (B, S) distinct keys
    values = torch.randint(0, VALUES, (B, S), generator=generator)  # (B, S)
    pick, rows = torch.randint(0, S, (B,), generator=generator), torch.arange(B)  # (B,), (B,)
    return keys, values, keys[rows, pick], values[rows, pick]


class PairRecall(nn.Module):
    """Chapter 11's recall model: token embeddings (key + value; the query gets the "none" value), one
    attention layer (:class:`attnbook.MultiHeadAttention`'s projections and ``out_proj``) and a linear
    readout of the last token's output, the query's.

    ``kind`` (one of :data:`RECALL_KINDS`) chooses the attention the query's output comes from:

    * ``"softmax"``: :func:`attnbook.scaled_dot_product_attention` over all T tokens;
    * ``"linear"``: :func:`attnbook.efficient.linear_attention` (elu + 1 features);
    * ``"delta"``: :func:`attnbook.efficient.delta_rule_attention` run over the sequence, keys and queries
      l2-normalised (as Qwen3-Next), with a write strength per token and head, ``beta = sigmoid(beta_proj(x))``
      (as DeltaNet and Qwen3-Next); the query token writes too (it can learn a small beta).

    Only the last token is read, so softmax and linear attention are computed for that one query (the same
    numbers as the causal layer's last row); the delta rule's state has to see every token in order.
    """

    def __init__(self, kind: str, *, width: int = WIDTH, num_heads: int = NUM_HEADS):
        super().__init__()
        if kind not in RECALL_KINDS:
            raise ValueError(f"kind must be one of {RECALL_KINDS}, got {kind!r}")
        self.kind = kind
        self.key_embed = nn.Embedding(KEYS, width)
        self.value_embed = nn.Embedding(VALUES + 1, width)  # value VALUES: "none", the query's
        self.attn = MultiHeadAttention(width, num_heads)
        self.readout = nn.Linear(width, VALUES)
        self.beta_proj = nn.Linear(width, num_heads) if kind == "delta" else None

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"

    def forward(self, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """keys, values ``(B, S)`` and query ``(B,)`` (symbol ids) -> logits over the values ``(B, VALUES)``."""
        stored = self.key_embed(keys) + self.value_embed(values)  # (B, S, E)
        asked = self.key_embed(query) + self.value_embed(torch.full_like(query, VALUES))  # (B, E)
        x = torch.cat([stored, asked[:, None]], dim=1)  # (B, T, E)
        if self.beta_proj is None:
            q, k, v = self.attn.project(x[:, -1:], x, x)  # (B, H, 1, D), (B, H, T, D), (B, H, T, D)
            if self.kind == "softmax":
                out = scaled_dot_product_attention(q, k, v)[0]  # (B, H, 1, D)
            else:
                out = linear_attention(q, k, v)  # (B, H, 1, D)
        else:
            q, k, v = self.attn.project(x)  # (B, H, T, D) each
            beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)  # (B, H, T)
            T = x.shape[1]
            chunk = -(-T // -(-T // 32))  # equal chunks of at most 32 positions: the fastest here on a CPU
            out = delta_rule_attention(q, k, v, beta, use_qk_l2norm=True, chunk_size=chunk)  # (B, H, T, D)
            out = out[:, :, -1:]  # (B, H, 1, D)
        y = self.attn.out_proj(merge_heads(out))  # (B, 1, E)
        return self.readout(y[:, 0])  # (B, VALUES)


def train_pairs(model: PairRecall, num_pairs: int, *, steps: int = STEPS, batch_size: int = BATCH,
                lr: float = LR, seed: int = 1, eval_size: int = EVAL_SIZE) -> float:
    """Train ``model`` on :func:`pairs_batch` sequences of ``num_pairs`` pairs (``steps`` Adam steps of
    ``batch_size`` fresh sequences, from a generator seeded with ``seed``; cross-entropy on the value) and
    return its accuracy on ``eval_size`` held-out sequences (always the same ones: their generator's seed is
    fixed). Chapter 11's ``train_pairs``, with the budget as arguments."""
    if not isinstance(model, PairRecall):
        raise TypeError(f"model must be an attnbook.recall.PairRecall, got {type(model).__name__}")
    check_int("num_pairs", num_pairs, 1, KEYS)
    steps = check_int("steps", steps, 0)
    check_int("seed", seed, 0)
    if isinstance(lr, bool) or not isinstance(lr, (float, int)) or not lr > 0:
        raise ValueError(f"lr must be a positive float, got {lr!r}")
    data = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        *inputs, target = pairs_batch(batch_size, num_pairs, data)
        loss = F.cross_entropy(model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    *inputs, target = pairs_batch(eval_size, num_pairs, torch.Generator().manual_seed(_EVAL_SEED))
    with torch.no_grad():
        return (model(*inputs).argmax(dim=-1) == target).float().mean().item()


def recall_accuracies(
    num_pairs: Sequence[int] = (4, 16, 64),
    kinds: Sequence[str] = RECALL_KINDS,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    width: int = WIDTH,
    num_heads: int = NUM_HEADS,
    steps: int = STEPS,
    batch_size: int = BATCH,
    lr: float = LR,
    eval_size: int = EVAL_SIZE,
    threads: int | None = 1,
) -> dict[tuple[str, int, int], float]:
    """Held-out accuracy of a :class:`PairRecall` of each kind, for each number of stored pairs and each
    seed, all trained the same way (:func:`train_pairs`): ``{(kind, num_pairs, seed): accuracy}``.

    Seed ``s`` draws the model's weights after ``torch.manual_seed(s)``, inside ``torch.random.fork_rng``
    (the caller's global generator is left as it was), and the training batches from a generator seeded
    with ``s + 1`` (seed 0 uses chapter 11's seeds, 0 and 1). Runs with ``threads`` torch threads (default
    1: the same float rounding on every machine, and steadier on a shared one; ``None`` keeps the current
    setting; restored afterwards)."""
    for kind in kinds:
        if kind not in RECALL_KINDS:
            raise ValueError(f"kinds must be among {RECALL_KINDS}, got {kind!r}")
    for n in num_pairs:
        check_int("num_pairs", n, 1, KEYS)
    for s in seeds:
        check_int("seeds", s, 0)
    if threads is not None:
        check_int("threads", threads)
    before = torch.get_num_threads()
    out: dict[tuple[str, int, int], float] = {}
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        for n in num_pairs:
            for kind in kinds:
                for s in seeds:
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(s)
                        model = PairRecall(kind, width=width, num_heads=num_heads)
                    out[kind, n, s] = train_pairs(model, n, steps=steps, batch_size=batch_size, lr=lr, seed=s + 1,
                                                  eval_size=eval_size)
    finally:
        torch.set_num_threads(before)
    return out
