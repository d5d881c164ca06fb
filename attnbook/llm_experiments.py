"""Toy-training experiments on the attention of decoder LLMs: attention sinks and their remedies, and the
growth of attention logits without QK-norm.

Dimension legend:
    B  batch size
    T  sequence length (BOS included)
    V  vocabulary size (BOS included)
    E  model dimension (``d_model``);  F  feed-forward width
    H  number of heads;  N  number of layers

The model, :class:`TinyLM`, is a pre-norm decoder built from :class:`attnbook.llm_attention.LLMAttention`
(RoPE, RMSNorm, a GELU feed-forward block); every switch of the attention layer is a keyword argument.

The task, :func:`backcopy_batch`, is the Bigram-Backcopy task of Guo et al. (2024, "Active-dormant attention
heads"), with a uniform bigram: position 0 holds BOS; after one of ``num_triggers`` trigger tokens the next
token repeats the token *before* the trigger; after any other token, the next token is uniformly random.
Attention is needed only at triggers (a head that looks one token back); everywhere else the best
prediction is uniform and any weighted average of earlier tokens the head adds is noise: the head should
do nothing. That is the setting in which attention sinks form (chapter 9, section 9.4).

Experiments:

* :func:`sink_experiment`: for each variant of :data:`SINK_VARIANTS` (plain softmax, a learned sink per
  head, softmax plus one, the sigmoid output gate) and each seed, train a :func:`sink_model` (its exits
  started open or shut: ``sink_init``, ``gate_bias``; global or a sliding window: ``sliding_window``) and
  measure :func:`first_position_share`, the share of attention weight on position 0, before training and
  after, :func:`sink_share`, the weight the sink logit takes, :func:`first_value_ratio`, how long position
  0's value is next to the others' (a no-op sink's is short), and :func:`backcopy_accuracy`. The toy has no final RMSNorm by default (see :class:`TinyLM`): with one, the
  first token's value grows and serves as a bias, and no zero-valued remedy replaces it.
* :func:`logit_growth_experiment`: train each variant of :data:`GROWTH_VARIANTS` (plain, ``qk_norm``, Gemma 2's
  ``attn_logit_softcapping``) at one or more learning rates (Wortsman et al. 2023's sweep) and record
  :func:`max_attention_logit`, the largest ``|q . k| * scaling``, along the way.

Both run in seconds on one CPU thread; the chapter asserts bounds far from the values measured.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_int, shape_str
from .llm_attention import LLMAttention

__all__ = [
    "BOS_ID",
    "SINK_VARIANTS",
    "backcopy_batch",
    "TinyLM",
    "TrainResult",
    "train_tiny_lm",
    "first_position_share",
    "backcopy_accuracy",
    "first_value_ratio",
    "sink_share",
    "max_attention_logit",
    "attention_entropy",
    "SinkRun",
    "sink_model",
    "sink_experiment",
    "GROWTH_VARIANTS",
    "logit_growth_experiment",
]

#: The token id of BOS, the first token of every :func:`backcopy_batch` sequence.
BOS_ID = 0

#: The four ways an attention head can distribute its weight, as :class:`LLMAttention` switches.
SINK_VARIANTS: dict[str, dict[str, bool]] = {
    "softmax": {},
    "sink": {"sinks": True},
    "softmax_plus_one": {"softmax_plus_one": True},
    "output_gate": {"output_gate": True},
}


def backcopy_batch(
    batch_size: int,
    T: int,
    *,
    vocab_size: int = 24,
    num_triggers: int = 3,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Token ids ``(B, T)`` of the Bigram-Backcopy task: BOS (id 0) at position 0, then tokens ``1 .. V-1``.

    Ids ``1 .. num_triggers`` are triggers: the token after a trigger at position t repeats the token at
    t - 1. Every other token is followed by a uniformly random one (any of ``1 .. V-1``). Position 1 is never
    a trigger (the token before it would be BOS).
    """
    B = check_int("batch_size", batch_size)
    T = check_int("T", T, 3)
    V = check_int("vocab_size", vocab_size, 3)
    num_triggers = check_int("num_triggers", num_triggers, 1, V - 2)
    ids = torch.randint(1, V, (B, T), generator=generator)  # (B, T): the random draws
    ids[:, 0] = BOS_ID
    ids[:, 1] = torch.randint(num_triggers + 1, V, (B,), generator=generator)  # not a trigger
    for t in range(1, T - 1):
        after_trigger = ids[:, t] <= num_triggers  # (B,)
        ids[:, t + 1] = torch.where(after_trigger, ids[:, t - 1], ids[:, t + 1])
    return ids


class _Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int, attention: dict[str, Any]):
        super().__init__()
        self.attn_norm = nn.RMSNorm(d_model)
        self.attn = LLMAttention(d_model, num_heads, **attention)
        self.mlp_norm = nn.RMSNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, dim_feedforward), nn.GELU(), nn.Linear(dim_feedforward, d_model))

    def forward(self, x: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, weights = self.attn(self.attn_norm(x), need_weights=need_weights)  # (B, T, E)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), weights  # (B, T, E)


class TinyLM(nn.Module):
    """A small pre-norm decoder LM: token embedding, N blocks (RMSNorm, :class:`LLMAttention`, RMSNorm, GELU
    feed-forward), an optional final RMSNorm, a linear head. No position embedding: RoPE, in the attention.

    Args:
        vocab_size: V.
        d_model, num_heads, num_layers, dim_feedforward: E, H, N, F.
        final_norm: an RMSNorm before the head (as LLMs have). Without it the logits read the residual
            stream directly, so an idle head's output can only hurt a flat prediction: the idle head must
            add nothing, and its sink is a pure no-op. With it, the model can instead flatten a
            prediction by adding a large constant vector before the norm, and the first token's value
            grows to serve as that constant (a sink that is a bias, which a zero-valued sink cannot
            replace).
        **attention: keyword arguments of :class:`LLMAttention` (``sinks=True``, ``qk_norm=True``, ...).

    ``forward(ids (B, T), need_weights=False)`` returns ``(logits (B, T, V), [weights (B, H, T, T) or None
    per layer])``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 32,
        num_heads: int = 2,
        num_layers: int = 1,
        dim_feedforward: int = 64,
        *,
        final_norm: bool = False,
        **attention: Any,
    ):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size)
        check_int("num_layers", num_layers)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            _Block(d_model, num_heads, check_int("dim_feedforward", dim_feedforward), attention)
            for _ in range(num_layers)
        )
        self.norm: nn.Module = nn.RMSNorm(d_model) if final_norm else nn.Identity()
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 2:
            raise TypeError(f"ids must be a LongTensor (B, T) of token ids, got {getattr(ids, 'dtype', type(ids))} "
                            f"{shape_str(ids) if isinstance(ids, torch.Tensor) else ''}")
        x = self.embed(ids)  # (B, T, E)
        weights = []
        for layer in self.layers:
            x, w = layer(x, need_weights)
            weights.append(w)
        return self.head(self.norm(x)), weights  # (B, T, V)

    def attentions(self) -> list[LLMAttention]:
        """The N attention layers, first to last."""
        return [cast(_Block, layer).attn for layer in self.layers]

    def attention_inputs(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """What each layer's attention reads, ``(B, T, E)`` per layer (after its RMSNorm)."""
        x = self.embed(ids)  # (B, T, E)
        inputs = []
        for layer in self.layers:
            block = cast(_Block, layer)
            inputs.append(block.attn_norm(x))
            x, _ = block(x)
        return inputs


@dataclass
class TrainResult:
    """What :func:`train_tiny_lm` measured.

    Attributes:
        loss: the training loss of every step.
        max_logit: ``(step, max_attention_logit)`` at every ``record_every``-th step (empty if not asked).
        entropy: ``(step, attention_entropy)`` at the same steps.
        seconds: wall time of the training loop.
    """

    loss: list[float] = field(default_factory=list)
    max_logit: list[tuple[int, float]] = field(default_factory=list)
    entropy: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0


def train_tiny_lm(
    model: TinyLM,
    steps: int = 400,
    lr: float = 1e-2,
    *,
    batch_size: int = 32,
    T: int = 32,
    seed: int = 0,
    num_triggers: int = 3,
    weight_decay: float = 0.01,
    record_every: int | None = None,
) -> TrainResult:
    """Train ``model`` on fresh :func:`backcopy_batch` batches with AdamW at a constant rate ``lr``
    (no warmup, no clipping). ``seed`` seeds the batches. With ``record_every``, also record
    :func:`max_attention_logit` and :func:`attention_entropy` on the training batch every that many steps (and
    at the last).
    The model is left in eval mode."""
    if not isinstance(model, TinyLM):
        raise TypeError(f"model must be an attnbook.llm_experiments.TinyLM, got {type(model).__name__}")
    steps = check_int("steps", steps)
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    if record_every is not None:
        check_int("record_every", record_every)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    result = TrainResult()
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        ids = backcopy_batch(batch_size, T + 1, vocab_size=model.vocab_size, num_triggers=num_triggers,
                             generator=generator)  # (B, T + 1)
        logits, _ = model(ids[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        result.loss.append(loss.item())
        if record_every is not None and (step % record_every == 0 or step == steps):
            result.max_logit.append((step, max_attention_logit(model, ids[:, :-1])))
            result.entropy.append((step, attention_entropy(model, ids[:, :-1])))
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


def _check_lm_ids(model: object, ids: object) -> tuple[TinyLM, torch.Tensor]:
    if not isinstance(model, TinyLM):
        raise TypeError(f"model must be an attnbook.llm_experiments.TinyLM, got {type(model).__name__}")
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 2:
        raise TypeError(f"ids must be a LongTensor (B, T), got {type(ids).__name__}")
    return model, ids


def _query_weights(model: TinyLM, ids: torch.Tensor, start: int, stop: int | None) -> list[torch.Tensor]:
    """Each layer's attention weights ``(B, H, T', S)`` for the queries at positions ``start .. stop-1``."""
    model, ids = _check_lm_ids(model, ids)
    T = ids.shape[1]
    stop = T if stop is None else check_int("stop", stop, 1, T)
    check_int("start", start, 0, stop - 1)
    was_training = model.training
    model.eval()
    try:
        _, weights = model(ids, need_weights=True)
    finally:
        model.train(was_training)
    return [w[:, :, start:stop] for w in weights if w is not None]  # (B, H, T', S) each


@torch.no_grad()
def first_position_share(model: TinyLM, ids: torch.Tensor, start: int = 4, stop: int | None = None) -> float:
    """The attention weight on position 0 (BOS), averaged over the layers, the heads, the sequences of
    ``ids`` ``(B, T)`` and the queries at positions ``start .. stop-1`` (default: to the end; early queries
    have few keys to spread over: query 0 can only see position 0). An even spread over the keys would give
    ``mean(1 / (t + 1) for t in start .. T-1)``: 0.07 for T = 32."""
    shares = [w[..., 0].mean() for w in _query_weights(model, ids, start, stop)]  # each averaged
    return float(torch.stack(shares).mean())


@torch.no_grad()
def sink_share(model: TinyLM, ids: torch.Tensor, start: int = 4, stop: int | None = None) -> float:
    """The weight that goes to no token, ``1 - sum_j w_j`` per query row, averaged as
    :func:`first_position_share` averages: what a learned sink (or softmax plus one's implicit logit 0)
    takes. 0 for plain softmax and the gate, whose rows sum to 1."""
    shares = [(1 - w.sum(-1)).mean() for w in _query_weights(model, ids, start, stop)]  # each averaged
    return float(torch.stack(shares).mean())


@torch.no_grad()
def first_value_ratio(model: TinyLM, ids: torch.Tensor) -> float:
    """How long the value vector of position 0 is next to the others': the mean norm of position 0's value
    over the mean norm of the values at positions ``1 .. T-1``, per layer and key/value head, averaged. Well
    under 1 when the first token is a no-op sink (weight parked there adds little), above 1 when its value
    is used as a bias."""
    model, ids = _check_lm_ids(model, ids)
    ratios = []
    for attention, x in zip(model.attentions(), model.attention_inputs(ids)):
        _, _, v = attention.project(x)  # (B, Hkv, T, D)
        norms = v.norm(dim=-1)  # (B, Hkv, T)
        ratios.append(norms[:, :, 0].mean(0) / norms[:, :, 1:].mean((0, 2)))  # (Hkv,)
    return float(torch.cat(ratios).mean())


@torch.no_grad()
def backcopy_accuracy(model: TinyLM, ids: torch.Tensor, num_triggers: int = 3) -> float:
    """How often ``model`` predicts the token after a trigger right (the one part of the task that needs
    attention), over the triggers at positions ``1 .. T-2`` of ``ids`` ``(B, T)``."""
    model, ids = _check_lm_ids(model, ids)
    was_training = model.training
    model.eval()
    try:
        logits, _ = model(ids[:, :-1])  # (B, T - 1, V)
    finally:
        model.train(was_training)
    trigger = (ids[:, :-1] >= 1) & (ids[:, :-1] <= num_triggers)  # (B, T - 1)
    if not bool(trigger.any()):
        raise ValueError("ids hold no trigger token to score")
    right = logits.argmax(-1) == ids[:, 1:]  # (B, T - 1)
    return float(right[trigger].float().mean())


@torch.no_grad()
def max_attention_logit(model: TinyLM, ids: torch.Tensor) -> float:
    """The largest ``|q . k| * scaling`` over the layers, heads, sequences of ``ids`` ``(B, T)`` and the
    query-key pairs the causal mask allows: the attention logit before soft-capping and the softmax (what
    grows without QK-norm; a soft-capped layer's softmax sees ``cap * tanh(logit / cap)`` of it)."""
    model, ids = _check_lm_ids(model, ids)
    largest = 0.0
    T = ids.shape[1]
    allowed = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    for attention, x in zip(model.attentions(), model.attention_inputs(ids)):
        logits = attention.attention_logits(x)  # (B, H, T, T)
        largest = max(largest, float(logits.abs().masked_fill(~allowed, 0.0).amax()))
    return largest


@torch.no_grad()
def attention_entropy(model: TinyLM, ids: torch.Tensor, start: int = 4) -> float:
    """The entropy ``-sum_j w_j ln w_j`` (nats) of each query's attention weights, averaged over the layers,
    heads, sequences of ``ids`` ``(B, T)`` and queries at positions ``start .. T-1``: ``ln(t + 1)`` for an even
    spread over query t's keys, 0 for a one-hot row (the entropy collapse that growing logits cause)."""
    entropies = [-(w * w.clamp_min(1e-30).log()).sum(-1).mean() for w in _query_weights(model, ids, start, None)]
    return float(torch.stack(entropies).mean())


def _seeds(seeds: Iterable[int]) -> list[int]:
    out = [check_int("seed", s, 0) for s in seeds]
    if not out:
        raise ValueError("seeds is empty")
    return out


@dataclass
class SinkRun:
    """One trained model of :func:`sink_experiment`.

    Attributes:
        share: :func:`first_position_share` on the held-out sequences, after training.
        accuracy: :func:`backcopy_accuracy` on them (did the model learn the task?).
        value_ratio: :func:`first_value_ratio` on them (is the first token a no-op?).
        seconds: training time.
        share_at_start: :func:`first_position_share` of the untrained model (step 0, the baseline).
        sink_share: :func:`sink_share` after training: the weight the sink logit takes (0 without one).
        model: the trained model, to measure more (not shown in the repr).
    """

    share: float
    accuracy: float
    value_ratio: float
    seconds: float
    share_at_start: float
    sink_share: float
    model: TinyLM = field(repr=False)


def _with_bias(linear: nn.Module, value: float) -> nn.Linear:
    """A copy of ``linear`` (same weight) with a bias, every entry ``value``."""
    assert isinstance(linear, nn.Linear)
    new = nn.Linear(linear.in_features, linear.out_features, bias=True,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight)
        nn.init.constant_(new.bias, value)
    return new


def sink_model(
    variant: str,
    seed: int = 0,
    *,
    final_norm: bool = False,
    sink_init: float = 3.0,
    gate_bias: float | None = None,
    sliding_window: int | None = None,
) -> TinyLM:
    """The untrained :class:`TinyLM` (1 layer, 2 heads, E = 32, vocabulary 24) that :func:`sink_experiment`
    trains for ``variant`` (a name of :data:`SINK_VARIANTS`) and ``seed``.

    The learned sink logits (variant ``"sink"``) start at ``sink_init``: 3 opens the exit from the first step
    (the sink weighs as much as e^3 = 20 keys of score 0). With gpt-oss's start near 0 the sink and the first
    token race to become the no-op, and which one wins differs from seed to seed: a single number per head
    moves by about ``lr`` per step under Adam, while the first token's score is shaped by whole weight matrices.

    ``gate_bias`` (variant ``"output_gate"``): ``None`` gives the gate no bias, as Qwen3-Next's, so it starts
    half open (its logits start near 0, and their sigmoid averages about 0.5). A number gives ``gate_proj`` a
    bias initialised to it, its weights as without one: -3 starts the gate nearly closed, ``sigmoid(-3) =
    0.047``, the gate's counterpart of ``sink_init=3``.

    ``sliding_window`` makes the attention local (:class:`LLMAttention`'s meaning: each query sees itself and
    the ``sliding_window - 1`` keys before it), as gpt-oss's every other layer: past the window the first
    token is out of reach.

    The initial weights come from ``torch.manual_seed(seed)`` under ``torch.random.fork_rng`` (the caller's
    generator is left as it was)."""
    if variant not in SINK_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; the variants are {', '.join(SINK_VARIANTS)}")
    seed = check_int("seed", seed, 0)
    for name, value in (("sink_init", sink_init), ("gate_bias", gate_bias)):
        if value is None and name == "gate_bias":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number{' or None' if name == 'gate_bias' else ''}, "
                            f"got {type(value).__name__} {value!r}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyLM(24, final_norm=final_norm, sliding_window=sliding_window, **SINK_VARIANTS[variant])
        for attention in model.attentions():
            if attention.sinks is not None:
                nn.init.constant_(attention.sinks, float(sink_init))
            if attention.gate_proj is not None and gate_bias is not None:
                attention.gate_proj = _with_bias(attention.gate_proj, float(gate_bias))
    return model


def sink_experiment(
    seeds: Sequence[int] = (0, 1, 2),
    variants: Sequence[str] = tuple(SINK_VARIANTS),
    *,
    steps: int = 400,
    lr: float = 1e-2,
    T: int = 32,
    final_norm: bool = False,
    sink_init: float = 3.0,
    gate_bias: float | None = None,
    sliding_window: int | None = None,
) -> dict[tuple[str, int], SinkRun]:
    """Train one :func:`sink_model` (1 layer, 2 heads, E = 32) per variant of :data:`SINK_VARIANTS` and seed
    on the Bigram-Backcopy task (``steps`` steps of AdamW at ``lr``, batches of 32) and return
    ``{(variant, seed): SinkRun}``, measured on 256 held-out sequences of length ``T``.

    ``sink_init`` (where the learned sink logits start, 3 by default: open) and ``gate_bias`` (``None`` by
    default: the gate has no bias, as Qwen3-Next's; -3 starts it nearly closed) and ``sliding_window`` are
    :func:`sink_model`'s. Shares are over the queries at positions 4 .. T-1."""
    for v in variants:
        if v not in SINK_VARIANTS:
            raise ValueError(f"unknown variant {v!r}; the variants are {', '.join(SINK_VARIANTS)}")
    test = backcopy_batch(256, T, generator=torch.Generator().manual_seed(12345))  # (256, T)
    runs = {}
    for variant in variants:
        for seed in _seeds(seeds):
            model = sink_model(variant, seed, final_norm=final_norm, sink_init=sink_init, gate_bias=gate_bias,
                               sliding_window=sliding_window)
            at_start = first_position_share(model, test)
            result = train_tiny_lm(model, steps, lr, T=T, seed=seed)
            runs[variant, seed] = SinkRun(first_position_share(model, test), backcopy_accuracy(model, test),
                                          first_value_ratio(model, test), result.seconds, at_start,
                                          sink_share(model, test), model)
    return runs


#: The variants :func:`logit_growth_experiment` compares, as :class:`LLMAttention` switches: nothing bounds the
#: logits; QK-norm (Qwen3, Gemma 3, OLMo 2); Gemma 2's soft cap of the scores, ``50 * tanh(s / 50)``.
GROWTH_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "qk_norm": {"qk_norm": True},
    "softcap": {"attn_logit_softcapping": 50.0},
}


def logit_growth_experiment(
    seeds: Sequence[int] = (0, 1, 2),
    *,
    lrs: Sequence[float] = (0.1,),
    variants: Sequence[str] = tuple(GROWTH_VARIANTS),
    steps: int = 400,
    record_every: int = 20,
    T: int = 32,
) -> dict[tuple[str, float, int], TrainResult]:
    """Train one :class:`TinyLM` (1 layer, 2 heads, E = 32, final RMSNorm) per variant of
    :data:`GROWTH_VARIANTS`, learning rate of ``lrs`` and seed; return ``{(variant, lr, seed): TrainResult}``
    whose ``max_logit`` traces :func:`max_attention_logit` over training (on each recorded step's batch).
    A variant's models start from the same weights for a seed (the switches add no parameters but the
    norms' weights, which start at 1).

    With ``qk_norm`` each head's q and k have D features of RMS 1 before the norm's weight, so a logit is at
    most ``D ** -0.5 * D * max|q_norm.weight| * max|k_norm.weight| = sqrt(D) * ...``: 4 for D = 16 while
    the weights stay at 1, and only as large as those weights grow. Without it nothing bounds q and k; the
    soft cap bounds what the softmax sees (under 50) but not ``q . k`` itself."""
    for v in variants:
        if v not in GROWTH_VARIANTS:
            raise ValueError(f"unknown variant {v!r}; the variants are {', '.join(GROWTH_VARIANTS)}")
    rates = list(lrs)
    if not rates or not all(isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 for lr in rates):
        raise ValueError(f"lrs must be positive learning rates, got {lrs!r}")
    results = {}
    for variant in variants:
        for lr in rates:
            for seed in _seeds(seeds):
                with torch.random.fork_rng():
                    torch.manual_seed(seed)
                    model = TinyLM(24, final_norm=True, **GROWTH_VARIANTS[variant])
                results[variant, lr, seed] = train_tiny_lm(model, steps, lr, T=T, seed=seed,
                                                           record_every=record_every)
    return results
