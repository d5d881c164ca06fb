"""Associative recall: a sequence stores (key, value) pairs and then asks for the value of some of its keys.
Two forms of the task: chapter 11's single query over pre-paired tokens (``"pairs"``: each token holds a key
together with its value, and one query key ends the sequence), and the multi-query associative recall (MQAR)
of Zoology (Arora et al., 2023; ``"mqar"``): keys and values are separate tokens, ``k_1 v_1 ... k_N v_N``,
and several queries follow, each asking for the value of one stored key.

Dimension legend:
    Nm  models trained together (one per seed): their heads sit side by side, Nm * H heads in one call
    B   batch size
    Np  stored (key, value) pairs of a sequence (``num_pairs``; the chapters call it N)
    Nq  queries of a sequence (1 for ``"pairs"``, ``num_queries`` for ``"mqar"``)
    T   tokens of a sequence: Np + 1 (``"pairs"``), 2 Np + Nq (``"mqar"``)
    H   number of heads;  D  head dimension (the state M of a linear memory is D x D per head);  E  width (H D)
    V   token vocabulary of the task (:data:`KEYS` + :data:`VALUES`, plus a "none" value for ``"pairs"``)

The model (:class:`RecallModels`) is one attention layer over token embeddings (no positions: order only
reaches the recurrent kinds), an output projection and a linear readout at each query position, trained on
fresh batches with Adam (:func:`train_recall`). Four kinds of attention (:data:`RECALL_KINDS`):

* ``"softmax"``: causal softmax attention, :func:`attnbook.scaled_dot_product_attention`; keeps every key;
* ``"linear"``: causal linear attention with elu + 1 features and its normaliser,
  :func:`attnbook.efficient.linear_attention` (chapter 11's);
* ``"additive"``: the delta model without its correction, the matched control: the same l2-normalised q and
  k (:func:`attnbook.efficient.l2norm`), the same learned write strength beta, a (D, D) state per head,
  ``M_t = M_{t-1} + beta_t k_t v_t^T``;
* ``"delta"``: the delta rule, :func:`attnbook.efficient.delta_rule_attention`,
  ``M_t = M_{t-1} + beta_t k_t (v_t - M_{t-1}^T k_t)^T``.

``"additive"`` and ``"delta"`` differ only in the term ``- M_{t-1}^T k_t``. With ``query_writes=False`` a query
position gets beta = 0: it reads the state without writing into it first. For ``"mqar"`` each of q, k and v
passes a short causal depthwise convolution (kernel :data:`CONV_SIZE`, as Zoology's and Qwen3-Next's layers),
so that a value token's key can be formed from the key token before it; ``"pairs"`` needs none.

:func:`least_squares_recall` is the reference no training can miss by chance: each head's D x D memory solved
by least squares from the sequence's pairs (random unit key codes), read out as the models read theirs.

:func:`recall_curves` trains Nm seeds of one configuration at once and returns their held-out accuracy at
chosen steps. Training them together is the same as training each alone (separate parameters, a summed loss,
Adam per element), only with fewer, larger tensor operations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_int
from .core import scaled_dot_product_attention
from .efficient import delta_rule_attention, l2norm, linear_attention

__all__ = ["KEYS", "VALUES", "HEAD_DIM", "NUM_HEADS", "BATCH", "LR", "EVAL_SIZE", "CONV_SIZE", "RECALL_KINDS",
           "RECALL_TASKS", "pairs_batch", "mqar_batch", "RecallModels", "train_recall", "recall_curves",
           "least_squares_recall"]

KEYS = 128
"""Key symbols; a sequence's keys are distinct, so it stores at most this many pairs."""
VALUES = 8
"""Value symbols (chapter 0's K = 8); chance is 1 / VALUES."""
HEAD_DIM = 16
"""Chapter 11's head dimension D: its recall models have 2 heads of 16 (width 32), a 16 x 16 memory per head."""
NUM_HEADS = 2
BATCH, LR = 64, 3e-3
"""Sequences per Adam step, learning rate (chapter 0's and 11's)."""
EVAL_SIZE = 2000
"""Held-out sequences an accuracy is measured on (for ``"mqar"``, every query of each is scored)."""
CONV_SIZE = 2
"""Kernel of the short causal convolution of the ``"mqar"`` models (the token itself and the one before)."""
RECALL_KINDS = ("softmax", "linear", "additive", "delta")
"""The attention of a :class:`RecallModels`; see the module docstring."""
RECALL_TASKS = ("pairs", "mqar")

_EVAL_SEED = 1234  # the held-out sequences, the same for every model


def _check_generator(generator: object) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator


def _distinct_keys(B: int, N: int, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(B, KEYS, generator=generator).argsort(dim=1)[:, :N]  # (B, Np) distinct keys


def pairs_batch(batch_size: int, num_pairs: int, generator: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``batch_size`` sequences of ``num_pairs`` (key, value) pairs with distinct keys, and a query key each,
    drawn from ``generator``: keys and values ``(B, Np)``, the query key ``(B,)`` (one of the stored keys) and
    the target ``(B,)``, the value stored with it (chapter 11's draws: the same generator state gives the same
    sequences)."""
    B = check_int("batch_size", batch_size)
    N = check_int("num_pairs", num_pairs, 1, KEYS)
    generator = _check_generator(generator)
    keys = _distinct_keys(B, N, generator)  # (B, Np)
    values = torch.randint(0, VALUES, (B, N), generator=generator)  # (B, Np)
    pick, rows = torch.randint(0, N, (B,), generator=generator), torch.arange(B)  # (B,), (B,)
    return keys, values, keys[rows, pick], values[rows, pick]


def mqar_batch(batch_size: int, num_pairs: int, num_queries: int, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """MQAR sequences: tokens ``(B, 2 Np + Nq)``, ``k_1 v_1 ... k_N v_N`` then Q queries (distinct stored keys in
    a random order), keys as ids ``0 .. KEYS - 1`` and values as ``KEYS + value``; and the targets ``(B, Nq)``,
    the value (``0 .. VALUES - 1``) stored with each query's key."""
    B = check_int("batch_size", batch_size)
    N = check_int("num_pairs", num_pairs, 1, KEYS)
    Q = check_int("num_queries", num_queries, 1, N)
    generator = _check_generator(generator)
    keys = _distinct_keys(B, N, generator)  # (B, Np)
    values = torch.randint(0, VALUES, (B, N), generator=generator)  # (B, Np)
    pick = torch.rand(B, N, generator=generator).argsort(dim=1)[:, :Q]  # (B, Nq) which pairs are asked
    pairs = torch.stack([keys, KEYS + values], dim=2).reshape(B, 2 * N)  # (B, 2Np) k v k v ...
    tokens = torch.cat([pairs, keys.gather(1, pick)], dim=1)  # (B, 2N + Q)
    return tokens, values.gather(1, pick)


def _uniform(generators: Sequence[torch.Generator], shape: tuple[int, ...], bound: float) -> torch.Tensor:
    """One (shape) tensor per generator, uniform in [-bound, bound], stacked: (Nm, *shape)."""
    return torch.stack([(torch.rand(shape, generator=g) * 2 - 1) * bound for g in generators])


class RecallModels(nn.Module):
    """Nm independent one-layer recall models of one ``kind`` (:data:`RECALL_KINDS`) for one ``task``
    (:data:`RECALL_TASKS`), model g initialised from ``torch.Generator().manual_seed(seeds[g])``; see the module
    docstring. Each model: token embeddings (normal), q/k/v projections of width E = ``num_heads * head_dim``
    (uniform in +-1/sqrt(E), as ``nn.Linear``), for ``"additive"`` and ``"delta"`` a write strength
    ``beta = sigmoid(x W_beta + b)`` per token and head, for ``"mqar"`` a short causal depthwise convolution of
    q, k and v, then ``out_proj`` and a linear readout over :data:`VALUES`. ``forward`` returns logits
    ``(Nm, B, Nq, VALUES)``.
    """

    def __init__(self, kind: str, task: str = "pairs", seeds: Sequence[int] = (0,), *, head_dim: int = HEAD_DIM,
                 num_heads: int = NUM_HEADS, query_writes: bool = True):
        super().__init__()
        if kind not in RECALL_KINDS:
            raise ValueError(f"kind must be one of {RECALL_KINDS}, got {kind!r}")
        if task not in RECALL_TASKS:
            raise ValueError(f"task must be one of {RECALL_TASKS}, got {task!r}")
        if not isinstance(query_writes, bool):
            raise TypeError(f"query_writes must be a bool, got {type(query_writes).__name__} {query_writes!r}")
        seeds = tuple(check_int("seeds", s, 0) for s in seeds)
        if not seeds:
            raise ValueError("seeds must name at least one seed, got ()")
        self.kind, self.task, self.query_writes = kind, task, query_writes
        self.num_heads = check_int("num_heads", num_heads)
        self.head_dim = check_int("head_dim", head_dim)
        E = self.num_heads * self.head_dim
        vocab = KEYS + VALUES + 1  # "pairs": key id, KEYS + value id, KEYS + VALUES = "none"; "mqar" uses KEYS + VALUES
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        bound = 1 / math.sqrt(E)
        self.embed = nn.Parameter(torch.stack([torch.randn(vocab, E, generator=g) for g in gens]))  # (Nm, V, E)
        self.qkv = nn.Parameter(_uniform(gens, (E, 3 * E), bound))  # (Nm, E, 3E)
        self.qkv_bias = nn.Parameter(_uniform(gens, (3 * E,), bound))  # (Nm, 3E)
        self.out_proj = nn.Parameter(_uniform(gens, (E, E), bound))  # (Nm, E, E)
        self.readout = nn.Parameter(_uniform(gens, (E, VALUES), bound))  # (Nm, E, VALUES)
        self.readout_bias = nn.Parameter(_uniform(gens, (VALUES,), bound))  # (Nm, VALUES)
        self.beta_proj = (nn.Parameter(_uniform(gens, (E, self.num_heads), bound))  # (Nm, E, H)
                          if kind in ("additive", "delta") else None)
        self.conv = (nn.Parameter(_uniform(gens, (3 * E, CONV_SIZE), 1 / math.sqrt(CONV_SIZE)))  # (Nm, 3E, kernel)
                     if task == "mqar" else None)

    @property
    def num_models(self) -> int:
        return self.embed.shape[0]

    def extra_repr(self) -> str:
        return (f"kind={self.kind!r}, task={self.task!r}, num_models={self.num_models}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}, query_writes={self.query_writes}")

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(Nm, B, T, H * D) -> (B, Nm * H, T, D): every model's heads side by side."""
        G, B, T, _ = t.shape
        return t.view(G, B, T, self.num_heads, self.head_dim).permute(1, 0, 3, 2, 4).reshape(
            B, G * self.num_heads, T, self.head_dim)  # (B, Nm*H, T, D)

    def forward(self, tokens: torch.Tensor, num_queries: int = 1) -> torch.Tensor:
        """tokens as :func:`train_recall` draws them, for every model ``(B, T, ...)`` or each model its own
        ``(Nm, B, T, ...)`` (``"mqar"``: one id per token; ``"pairs"``: two, ``(..., T, 2)``, the key's and the
        value's, whose embeddings the token sums), the last ``num_queries`` of them queries -> logits
        ``(Nm, B, Nq, VALUES)`` at the query positions."""
        G, H, D = self.num_models, self.num_heads, self.head_dim
        per_token = 2 if self.task == "pairs" else 1
        if tokens.dim() == per_token + 1:
            tokens = tokens.expand(G, *tokens.shape)  # (Nm, B, T) or (Nm, B, T, 2)
        B, T = tokens.shape[1], tokens.shape[2]
        Q = check_int("num_queries", num_queries, 1, T)
        x = torch.stack([self.embed[g][tokens[g]] for g in range(G)])  # (Nm, B, T, E) or (Nm, B, T, 2, E)
        if self.task == "pairs":
            x = x.sum(dim=-2)  # (Nm, B, T, E) key + value embedding
        qkv = torch.einsum("gbte,gef->gbtf", x, self.qkv) + self.qkv_bias[:, None, None]  # (Nm, B, T, 3E)
        if self.conv is not None:  # short causal depthwise convolution: w_0 x_t + w_1 x_{t-1} + ...
            padded = F.pad(qkv, (0, 0, CONV_SIZE - 1, 0))  # (Nm, B, T + kernel - 1, 3E)
            qkv = padded[:, :, CONV_SIZE - 1:] * self.conv[:, None, None, :, 0]  # (Nm, B, T, 3E) w_0 x_t
            for i in range(1, CONV_SIZE):
                qkv = qkv + padded[:, :, CONV_SIZE - 1 - i:CONV_SIZE - 1 - i + T] * self.conv[:, None, None, :, i]
        q, k, v = (self._heads(t) for t in qkv.split(H * D, dim=-1))  # (B, Nm*H, T, D) each
        reads = slice(T - Q, T)
        if self.kind == "softmax":
            allowed = torch.arange(T)[None, :] <= torch.arange(T - Q, T)[:, None]  # (Nq, T) causal rows
            out = scaled_dot_product_attention(q[:, :, reads], k, v, allowed)[0]  # (B, Nm*H, Nq, D)
        elif self.kind == "linear" and Q == 1:  # the last query sees every key: its row of the causal layer
            out = linear_attention(q[:, :, reads], k, v)  # (B, Nm*H, 1, D)
        elif self.kind == "linear":
            out = linear_attention(q, k, v, causal=True)[:, :, reads]  # (B, Nm*H, Nq, D)
        else:
            assert self.beta_proj is not None
            beta = torch.sigmoid(torch.einsum("gbte,geh->gbth", x, self.beta_proj))  # (Nm, B, T, H)
            beta = beta.permute(1, 0, 3, 2).reshape(B, G * H, T)  # (B, Nm*H, T)
            if not self.query_writes:
                beta = torch.cat([beta[..., :T - Q], beta.new_zeros(B, G * H, Q)], dim=-1)  # queries only read
            if self.kind == "delta":
                chunk = -(-T // -(-T // 32))  # equal chunks of at most 32 positions: the fastest here on a CPU
                out = delta_rule_attention(q, k, v, beta, use_qk_l2norm=True, chunk_size=chunk)[:, :, reads]
            else:  # additive: M_t = sum_{j <= t} beta_j k_j v_j^T, read by the same unit, scaled query
                qn, kn = l2norm(q[:, :, reads]) * D ** -0.5, l2norm(k)  # (B, Nm*H, Nq, D), (B, Nm*H, T, D)
                allowed = torch.arange(T)[None, :] <= torch.arange(T - Q, T)[:, None]  # (Nq, T)
                weights = (qn @ kn.transpose(-2, -1)) * beta[:, :, None, :] * allowed  # (B, Nm*H, Q, T)
                out = weights @ v  # (B, Nm*H, Nq, D)
        out = out.view(B, G, H, Q, D).permute(1, 0, 3, 2, 4).reshape(G, B, Q, H * D)  # (Nm, B, Nq, E)
        y = torch.einsum("gbqe,gef->gbqf", out, self.out_proj)  # (Nm, B, Nq, E)
        return torch.einsum("gbqe,gev->gbqv", y, self.readout) + self.readout_bias[:, None, None]  # (Nm, B, Nq, VALUES)


def _task_batch(task: str, batch_size: int, num_pairs: int, num_queries: int, generator: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (B, T) and targets (B, Nq) of ``task``, in the id layout :class:`RecallModels` embeds."""
    if task == "pairs":
        keys, values, query, target = pairs_batch(batch_size, num_pairs, generator)
        pairs = torch.stack([keys, KEYS + values], dim=2)  # (B, Np, 2): a pair token's two ids
        asked = torch.stack([query, torch.full_like(query, KEYS + VALUES)], dim=1)[:, None]  # (B, 1, 2): "none"
        return torch.cat([pairs, asked], dim=1), target[:, None]  # (B, T, 2), (B, 1)
    return mqar_batch(batch_size, num_pairs, num_queries, generator)


def train_recall(
    model: RecallModels,
    num_pairs: int,
    steps: int,
    *,
    num_queries: int = 1,
    eval_at: Sequence[int] = (),
    batch_size: int = BATCH,
    lr: float = LR,
    data_seed: int = 1,
    eval_size: int = EVAL_SIZE,
) -> dict[int, list[float]]:
    """Train ``model`` (all its Nm models at once: each its own fresh batches, drawn from one generator seeded
    with ``data_seed``; a cross-entropy per model, summed) for ``steps`` Adam steps on its task with
    ``num_pairs`` pairs (and ``num_queries`` queries for ``"mqar"``), and return the held-out accuracy of each
    model, ``{step: [accuracy of model g]}``, after each step of ``eval_at`` (0: before training) and after the
    last. The held-out sequences (``eval_size`` of them) are the same for every model and step."""
    if not isinstance(model, RecallModels):
        raise TypeError(f"model must be an attnbook.recall.RecallModels, got {type(model).__name__}")
    N = check_int("num_pairs", num_pairs, 1, KEYS)
    steps = check_int("steps", steps, 0)
    Q = 1 if model.task == "pairs" else check_int("num_queries", num_queries, 1, N)
    check_int("data_seed", data_seed, 0)
    check_int("batch_size", batch_size)
    check_int("eval_size", eval_size)
    if isinstance(lr, bool) or not isinstance(lr, (float, int)) or not lr > 0:
        raise ValueError(f"lr must be a positive float, got {lr!r}")
    marks = sorted({check_int("eval_at", s, 0, steps) for s in eval_at} | {steps})
    G = model.num_models
    held_tokens, held_target = _task_batch(model.task, eval_size, N, Q, torch.Generator().manual_seed(_EVAL_SEED))

    def accuracy() -> list[float]:
        with torch.no_grad():
            hits = model(held_tokens, Q).argmax(dim=-1) == held_target  # (Nm, B, Q)
        return hits.float().mean(dim=(1, 2)).tolist()

    data = torch.Generator().manual_seed(data_seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    out: dict[int, list[float]] = {}
    for step in range(steps + 1):
        if step in marks:
            out[step] = accuracy()
        if step == steps:
            break
        tokens, target = _task_batch(model.task, G * batch_size, N, Q, data)
        tokens = tokens.view(G, batch_size, *tokens.shape[1:])  # (Nm, B, T) or (Nm, B, T, 2)
        logits = model(tokens, Q)  # (Nm, B, Nq, VALUES)
        loss = F.cross_entropy(logits.reshape(-1, VALUES), target.view(G, batch_size, Q).reshape(-1),
                               reduction="sum") / (batch_size * Q)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return out


def recall_curves(
    kind: str,
    num_pairs: int,
    steps: int,
    *,
    task: str = "pairs",
    seeds: Sequence[int] = (0, 1, 2),
    eval_at: Sequence[int] = (),
    num_queries: int = 1,
    head_dim: int = HEAD_DIM,
    num_heads: int = NUM_HEADS,
    query_writes: bool = True,
    eval_size: int = EVAL_SIZE,
    threads: int | None = 1,
) -> dict[int, dict[int, float]]:
    """Held-out accuracy against training steps of one configuration, each seed a model of its own, all
    trained together (:class:`RecallModels`, :func:`train_recall`, batches from ``data_seed=1``):
    ``{step: {seed: accuracy}}``. Runs with ``threads`` torch threads (default 1: the same float rounding on
    every machine, and steadier on a shared one; ``None`` keeps the current setting; restored afterwards)."""
    if threads is not None:
        check_int("threads", threads)
    seeds = tuple(seeds)
    model = RecallModels(kind, task, seeds, head_dim=head_dim, num_heads=num_heads, query_writes=query_writes)
    before = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        curve = train_recall(model, num_pairs, steps, num_queries=num_queries, eval_at=eval_at,
                             eval_size=eval_size)
    finally:
        torch.set_num_threads(before)
    return {step: dict(zip(seeds, accs)) for step, accs in curve.items()}


def least_squares_recall(num_pairs: int, head_dim: int = HEAD_DIM, num_heads: int = NUM_HEADS, *,
                         eval_size: int = EVAL_SIZE, seed: int = 0) -> float:
    """Held-out accuracy of a *solved* linear memory on the ``"pairs"`` task: the reference for what a
    fixed-size state of ``num_heads`` heads of ``head_dim`` can hold, with no training in the way.

    Every key symbol gets one random unit code per head (``(KEYS, H, D)``, normal then l2-normalised, from
    ``seed``); a value is one-hot over :data:`VALUES`. For each held-out sequence (the same ones
    :func:`train_recall` scores) each head's memory is the least-squares solution of ``K_h M_h = Y`` over the
    sequence's ``num_pairs`` pairs (``K_h`` (Np, D) the stored keys' codes, ``Y`` (Np, VALUES) their values;
    the minimum-norm exact solution while Np <= D), the state a delta rule run to convergence on those pairs
    reaches. The query reads ``sum_h q_h^T M_h`` and predicts its largest entry. With Np <= D every pair is
    kept exactly (accuracy 1); past D the pairs interfere and the accuracy falls. A reference, not a bound:
    a trained model chooses its codes and its readout."""
    N = check_int("num_pairs", num_pairs, 1, KEYS)
    D, H = check_int("head_dim", head_dim), check_int("num_heads", num_heads)
    check_int("eval_size", eval_size)
    gen = torch.Generator().manual_seed(check_int("seed", seed, 0))
    codes = F.normalize(torch.randn(KEYS, H, D, generator=gen, dtype=torch.float64), dim=-1)  # (KEYS, H, D)
    keys, values, query, target = pairs_batch(eval_size, N, torch.Generator().manual_seed(_EVAL_SEED))
    K = codes[keys].permute(0, 2, 1, 3)  # (B, H, Np, D) the stored keys' codes, per head
    Y = F.one_hot(values, VALUES).to(torch.float64)[:, None].expand(-1, H, -1, -1)  # (B, H, Np, VALUES)
    Kt = K.transpose(-2, -1)  # (B, H, D, Np)
    if N > D:  # more pairs than dimensions: the least-squares fit (K^T K) M = K^T Y
        M = torch.linalg.solve(Kt @ K, Kt @ Y)  # (B, H, D, VALUES) each head's memory
    else:  # as many or fewer: the exact fit of least norm, M = K^T (K K^T)^-1 Y
        M = Kt @ torch.linalg.solve(K @ Kt, Y)  # (B, H, D, VALUES)
    read = (codes[query][:, :, None, :] @ M).sum(dim=1)[:, 0]  # (B, VALUES) summed over the heads
    return (read.argmax(dim=-1) == target).double().mean().item()
