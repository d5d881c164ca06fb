"""What trained heads compute: an attention-only transformer and the tools to take its heads apart.

A small decoder of attention-only layers (token embedding plus learned absolute positions, then N residual
multi-head attention blocks, no MLP, no LayerNorm, an unembedding), trained on sequences whose second part
repeats a random first part at a distance that changes from sequence to sequence. The tools: per-head
scores (previous-token, prefix-matching, copying), zero- and mean-ablation of heads, path patching of layer
1's output into only layer 2's keys, queries or values, the QK and OV circuits as matrices, and a
gradient-times-input attribution to set beside the attention weights. Elhage et al. (2021), A Mathematical
Framework for Transformer Circuits; Olsson et al. (2022), In-context Learning and Induction Heads.

Dimension legend:
    B  batch size (sequences)
    H  heads per layer
    T  sequence length (queries), S  keys (S = T: causal self-attention)
    D  head dimension (E // H)
    E  model dimension
    V  vocabulary size
    N  number of layers
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_int, shape_str
from .core import scaled_dot_product_attention
from .masks import causal_mask
from .mha import MultiHeadAttention, merge_heads

__all__ = [
    "AttentionOnlyTransformer",
    "RepeatBatch",
    "repeated_sequences",
    "repeat_loss",
    "previous_token_scores",
    "prefix_matching_scores",
    "duplicate_token_scores",
    "copying_scores",
    "head_scores",
    "ablation_losses",
    "composition_patching",
    "ov_circuit",
    "qk_circuit",
    "positional_qk_circuit",
    "gradient_attribution",
    "rank_correlation",
    "InductionHistory",
    "train_induction",
]

Head = tuple[int, int]  # (layer, head), counted from 0
Ablation = Mapping[Head, str]  # (layer, head) -> "zero" or "mean"


def _check_head(model: AttentionOnlyTransformer, head: Head) -> None:
    layer, h = head
    if not (0 <= layer < model.num_layers and 0 <= h < model.num_heads):
        raise ValueError(f"head {head} is outside the model's {model.num_layers} layers x {model.num_heads} heads")


class AttentionOnlyTransformer(nn.Module):
    """Token embedding + learned positions, ``num_layers`` residual blocks of causal
    :class:`attnbook.MultiHeadAttention` (no MLP, no LayerNorm, no biases), and an unembedding.

    ``forward(tokens, ablate=None, patch=None)`` returns ``(logits (B, T, V), weights)``, ``weights`` one
    (B, H, T, T) tensor per layer. ``ablate`` maps (layer, head) to ``"zero"`` (the head's output set to 0)
    or ``"mean"`` (replaced by its mean over the batch, position by position). ``patch`` maps a layer to the
    residual stream its keys, queries or values read instead of the true one:
    ``{1: {"key": x}}`` feeds ``x`` (B, T, E) to layer 1's key projection only (path patching).
    """

    def __init__(self, vocab_size: int, seq_len: int, d_model: int = 64, num_heads: int = 4, num_layers: int = 2):
        super().__init__()
        check_int("vocab_size", vocab_size, 2)
        check_int("seq_len", seq_len, 2)
        check_int("num_layers", num_layers)
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.num_heads, self.num_layers = num_heads, num_layers
        self.embed = nn.Embedding(vocab_size, d_model)  # W_E
        self.pos = nn.Embedding(seq_len, d_model)  # learned absolute positions
        self.attn = nn.ModuleList(MultiHeadAttention(d_model, num_heads, bias=False) for _ in range(num_layers))
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)  # W_U
        nn.init.normal_(self.embed.weight, std=d_model ** -0.5 * 2)
        nn.init.normal_(self.pos.weight, std=d_model ** -0.5 * 2)

    @property
    def d_model(self) -> int:
        return self.embed.embedding_dim

    def check_tokens(self, tokens: torch.Tensor) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must be an integer tensor (B, T), got {getattr(tokens, 'dtype', type(tokens))}")
        if tokens.dim() != 2 or not 1 <= tokens.shape[1] <= self.seq_len:
            raise ValueError(f"tokens must be (B, T) with T <= seq_len={self.seq_len}, got {shape_str(tokens)}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"tokens must lie in [0, {self.vocab_size}), got [{tokens.min()}, {tokens.max()}]")

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        return self.embed(tokens) + self.pos.weight[:T]  # (B, T, E)

    def block(self, layer: int) -> MultiHeadAttention:
        """Layer ``layer``'s attention (counted from 0)."""
        mha = self.attn[layer]
        assert isinstance(mha, MultiHeadAttention)
        return mha

    def head_outputs(self, layer: int, x: torch.Tensor, *, key: torch.Tensor | None = None,
                     query: torch.Tensor | None = None, value: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s per-head outputs z (B, H, T, D) and weights (B, H, T, T) for residual stream x
        (B, T, E); ``key``/``query``/``value`` replace x as that projection's input."""
        mha = self.block(layer)
        q, k, v = mha.project(x if query is None else query, x if key is None else key,
                              x if value is None else value)  # (B, H, T, D) each
        T = x.shape[1]
        z, w = scaled_dot_product_attention(q, k, v, causal_mask(T, device=x.device))  # (B, H, T, D), (B, H, T, T)
        return z, w

    def write(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """What heads z (B, H, T, D) add to the residual stream: W_O applied to the merged heads, (B, T, E)."""
        return self.block(layer).out_proj(merge_heads(z))

    def head_writes(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """Each head's own contribution to the residual stream, (B, H, T, E); they sum to :meth:`write`."""
        H, D = self.num_heads, z.shape[-1]
        W_O = self.block(layer).out_proj.weight.view(self.d_model, H, D)  # (E, H, D)
        return torch.einsum("bhtd,ehd->bhte", z, W_O)  # (B, H, T, E)

    def forward(self, tokens: torch.Tensor, ablate: Ablation | None = None,
                patch: Mapping[int, Mapping[str, torch.Tensor]] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        self.check_tokens(tokens)
        ablate = dict(ablate or {})
        for head, how in ablate.items():
            _check_head(self, head)
            if how not in ("zero", "mean"):
                raise ValueError(f"ablation of head {head} must be 'zero' or 'mean', got {how!r}")
        x = self.embed_tokens(tokens)  # (B, T, E)
        weights = []
        for layer in range(self.num_layers):
            sources = dict((patch or {}).get(layer, {}))
            for name in sources:
                if name not in ("key", "query", "value"):
                    raise ValueError(f"patch of layer {layer} names {name!r}; use 'key', 'query' or 'value'")
            z, w = self.head_outputs(layer, x, **sources)  # (B, H, T, D), (B, H, T, T)
            for (lay, h), how in ablate.items():
                if lay == layer:
                    z = z.clone()
                    z[:, h] = 0.0 if how == "zero" else z[:, h].mean(dim=0, keepdim=True)
            x = x + self.write(layer, z)  # (B, T, E)
            weights.append(w)
        return self.unembed(x), tuple(weights)  # (B, T, V)


# --------------------------------------------------------------------- the task
@dataclass
class RepeatBatch:
    """Sequences with a repeated segment: ``tokens`` (B, T); sequence b repeats its tokens
    ``start[b] .. start[b] + length[b] - 1`` right after them, at distance ``length[b]``."""

    tokens: torch.Tensor
    start: torch.Tensor  # (B,) where the first copy begins (the offset)
    length: torch.Tensor  # (B,) the repeat distance

    def repeat_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Bool (B, T) of the positions t whose NEXT token is predictable from the first copy (t and t + 1 in
        the second copy), and the distance (B, 1) back to the first copy."""
        B, T = self.tokens.shape
        t = torch.arange(T).expand(B, T)
        second = self.start[:, None] + self.length[:, None]  # first position of the second copy
        end = second + self.length[:, None]  # one past it
        return (t >= second) & (t + 1 < end), self.length[:, None]


def repeated_sequences(batch_size: int, seq_len: int, vocab_size: int, *, min_length: int = 4,
                       max_length: int | None = None, fixed: bool = False,
                       generator: torch.Generator | None = None) -> RepeatBatch:
    """Random tokens in which a random segment is repeated once, right after itself.

    Each sequence draws its repeat distance (the segment's length) from ``min_length .. max_length`` and the
    offset where the first copy starts from what fits; the rest is random filler. ``fixed=True`` is the
    shortcut's control: every sequence repeats its first ``seq_len // 2`` tokens (offset 0, one distance)."""
    check_int("batch_size", batch_size)
    check_int("seq_len", seq_len, 4)
    check_int("vocab_size", vocab_size, 2)
    max_length = seq_len // 2 if max_length is None else max_length
    check_int("min_length", min_length, 2)
    check_int("max_length", max_length, 2)
    if not min_length <= max_length <= seq_len // 2:
        raise ValueError(f"need 2 <= min_length={min_length} <= max_length={max_length} <= seq_len // 2 = "
                         f"{seq_len // 2}")
    B, T = batch_size, seq_len
    tokens = torch.randint(vocab_size, (B, T), generator=generator)  # (B, T)
    if fixed:
        length = torch.full((B,), T // 2)
        start = torch.zeros(B, dtype=torch.long)
    else:
        length = torch.randint(min_length, max_length + 1, (B,), generator=generator)
        start = (torch.rand(B, generator=generator) * (T - 2 * length + 1)).long()  # 0 .. T - 2 * length
    t = torch.arange(T).expand(B, T)
    second = (t >= start[:, None] + length[:, None]) & (t < start[:, None] + 2 * length[:, None])
    src = (t - length[:, None]).clamp(min=0)
    tokens = torch.where(second, tokens.gather(1, src), tokens)  # (B, T)
    return RepeatBatch(tokens, start, length)


def repeat_loss(logits: torch.Tensor, batch: RepeatBatch) -> torch.Tensor:
    """Mean cross-entropy of the next-token predictions inside the second copy (the in-context loss)."""
    where, _ = batch.repeat_positions()  # (B, T)
    target = batch.tokens[:, 1:]  # (B, T - 1)
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), target, reduction="none")  # (B, T - 1)
    return ce[where[:, :-1]].mean()


# --------------------------------------------------------------------- per-head scores
def _offset_score(weights: torch.Tensor, where: torch.Tensor, back: torch.Tensor) -> torch.Tensor:
    """Mean over the positions ``where`` (B, T) of the weight each head (B, H, T, T) puts ``back`` (B, 1)
    positions behind the query: (H,)."""
    B, H, T, S = weights.shape
    t = torch.arange(T).expand(B, T)
    src = (t - back).clamp(min=0)  # (B, T)
    w = weights.gather(3, src[:, None, :, None].expand(B, H, T, 1)).squeeze(3)  # (B, H, T)
    return w.transpose(0, 1)[:, where].mean(dim=1)  # (H,)


def previous_token_scores(weights: torch.Tensor) -> torch.Tensor:
    """Per head, the mean weight a query puts on the position just before it (queries 1 .. T - 1): (H,)."""
    B, H, T, _ = weights.shape
    where = torch.zeros(B, T, dtype=torch.bool)
    where[:, 1:] = True
    return _offset_score(weights, where, torch.ones(B, 1, dtype=torch.long))


def prefix_matching_scores(weights: torch.Tensor, batch: RepeatBatch) -> torch.Tensor:
    """Per head, the mean weight a query in the second copy puts on the token AFTER the earlier occurrence of
    its own token (distance ``length - 1`` back): the induction head's signature, (H,)."""
    if weights.shape[0] != batch.tokens.shape[0] or weights.shape[2] != batch.tokens.shape[1]:
        raise ValueError(f"weights {shape_str(weights)} do not match tokens {shape_str(batch.tokens)}")
    where, dist = batch.repeat_positions()
    return _offset_score(weights, where, dist - 1)


def duplicate_token_scores(weights: torch.Tensor, batch: RepeatBatch) -> torch.Tensor:
    """Per head, the mean weight a query in the second copy puts on the earlier occurrence of its own token
    (distance ``length`` back), (H,)."""
    if weights.shape[0] != batch.tokens.shape[0] or weights.shape[2] != batch.tokens.shape[1]:
        raise ValueError(f"weights {shape_str(weights)} do not match tokens {shape_str(batch.tokens)}")
    where, dist = batch.repeat_positions()
    return _offset_score(weights, where, dist)


def copying_scores(model: AttentionOnlyTransformer, layer: int) -> torch.Tensor:
    """Elhage et al.'s copying score of each head: sum(eigenvalues) / sum(|eigenvalues|) of its OV circuit
    W_U W_O W_V W_E (V, V); 1 means the head raises the logit of whatever token it attends to, (H,)."""
    out = []
    for h in range(model.num_heads):
        ev = torch.linalg.eigvals(ov_circuit(model, (layer, h)).double())
        out.append((ev.sum().real / ev.abs().sum()).float())
    return torch.stack(out)


@torch.no_grad()
def head_scores(model: AttentionOnlyTransformer, batch: RepeatBatch) -> dict[str, torch.Tensor]:
    """Every score of every head: ``previous_token``, ``prefix_matching`` (N, H) and ``copying`` (N, H),
    with ``repeat_loss`` (a scalar) on ``batch``."""
    logits, weights = model(batch.tokens)
    return {
        "repeat_loss": repeat_loss(logits, batch),
        "previous_token": torch.stack([previous_token_scores(w) for w in weights]),
        "prefix_matching": torch.stack([prefix_matching_scores(w, batch) for w in weights]),
        "copying": torch.stack([copying_scores(model, layer) for layer in range(model.num_layers)]),
    }


# --------------------------------------------------------------------- taking it apart
@torch.no_grad()
def ablation_losses(model: AttentionOnlyTransformer, batch: RepeatBatch, how: str = "zero") -> torch.Tensor:
    """The repeat loss with each head ablated in turn (``"zero"`` or ``"mean"``): (N, H)."""
    out = torch.empty(model.num_layers, model.num_heads)
    for layer in range(model.num_layers):
        for h in range(model.num_heads):
            logits, _ = model(batch.tokens, ablate={(layer, h): how})
            out[layer, h] = repeat_loss(logits, batch)
    return out


@torch.no_grad()
def composition_patching(model: AttentionOnlyTransformer, batch: RepeatBatch, other: RepeatBatch,
                         head: Head) -> dict[str, float]:
    """Path patching: layer ``head[0]``'s head ``head[1]`` writes, into the input of the NEXT layer's keys
    only (or queries only, or values only), what it wrote on ``other`` (another sequence of the same shape);
    the repeat loss of ``batch`` for each path, and unpatched (``"none"``)."""
    _check_head(model, head)
    layer, h = head
    if layer + 1 >= model.num_layers:
        raise ValueError(f"head {head} has no later layer to compose with (the model has {model.num_layers})")
    if other.tokens.shape != batch.tokens.shape:
        raise ValueError(f"other {shape_str(other.tokens)} must have the shape of batch {shape_str(batch.tokens)}")
    x = model.embed_tokens(batch.tokens)
    x_other = model.embed_tokens(other.tokens)
    for lay in range(layer + 1):
        z, _ = model.head_outputs(lay, x)
        z_o, _ = model.head_outputs(lay, x_other)
        if lay == layer:
            own = model.head_writes(lay, z)[:, h]  # (B, T, E)
            theirs = model.head_writes(lay, z_o)[:, h]  # (B, T, E)
        x, x_other = x + model.write(lay, z), x_other + model.write(lay, z_o)
    patched = x - own + theirs  # (B, T, E): the stream with this head's write from the other sequence
    out = {"none": repeat_loss(model(batch.tokens)[0], batch).item()}
    for path in ("key", "query", "value"):
        logits, _ = model(batch.tokens, patch={layer + 1: {path: patched}})
        out[path] = repeat_loss(logits, batch).item()
    return out


def _head_weights(model: AttentionOnlyTransformer, head: Head) -> tuple[torch.Tensor, ...]:
    _check_head(model, head)
    layer, h = head
    mha = model.block(layer)
    D = mha.head_dim
    rows = slice(h * D, (h + 1) * D)
    return (mha.q_proj.weight[rows], mha.k_proj.weight[rows], mha.v_proj.weight[rows],  # (D, E) each
            mha.out_proj.weight[:, rows])  # (E, D)


@torch.no_grad()
def ov_circuit(model: AttentionOnlyTransformer, head: Head) -> torch.Tensor:
    """(V, V): row a is the change in every logit when the head attends fully to token a
    (W_E W_V^T W_O^T W_U^T, bypassing positions)."""
    _, _, W_V, W_O = _head_weights(model, head)
    return model.embed.weight @ W_V.T @ W_O.T @ model.unembed.weight.T  # (V, V)


@torch.no_grad()
def qk_circuit(model: AttentionOnlyTransformer, head: Head, key_head: Head | None = None) -> torch.Tensor:
    """(V, V): the score of a query token (row) for a key token (column), tokens without positions. With
    ``key_head`` (a head of an earlier layer) the key side is what that head writes when it attends to the
    key token: K-composition, the induction head's circuit (row a, column b: "b's successor follows an a")."""
    W_Q, W_K, _, _ = _head_weights(model, head)
    E_tok = model.embed.weight  # (V, E)
    keys = E_tok
    if key_head is not None:
        if key_head[0] >= head[0]:
            raise ValueError(f"key_head {key_head} must be in a layer before head {head}")
        _, _, W_V1, W_O1 = _head_weights(model, key_head)
        keys = E_tok @ W_V1.T @ W_O1.T  # (V, E): what key_head writes when it attends to each token
    return (E_tok @ W_Q.T) @ (keys @ W_K.T).T / math.sqrt(W_Q.shape[0])  # (V, V)


@torch.no_grad()
def positional_qk_circuit(model: AttentionOnlyTransformer, head: Head) -> torch.Tensor:
    """(T, T): the score of query position t (row) for key position s from the learned positions alone,
    causal entries only (the rest 0)."""
    W_Q, W_K, _, _ = _head_weights(model, head)
    P = model.pos.weight  # (T, E)
    scores = (P @ W_Q.T) @ (P @ W_K.T).T / math.sqrt(W_Q.shape[0])  # (T, T)
    return scores.masked_fill(~causal_mask(P.shape[0]), 0.0)


def gradient_attribution(embed_fn: Callable[[], torch.Tensor], score_fn: Callable[[torch.Tensor], torch.Tensor]
                         ) -> torch.Tensor:
    """Gradient times input, per position: |sum_e x[b, s, e] * d score / d x[b, s, e]| (B, S), normalised to
    sum 1 per row. ``embed_fn()`` gives the input embeddings x (B, S, E); ``score_fn(x)`` the scalar per
    sequence (B,) whose attribution is wanted."""
    x = embed_fn().detach().requires_grad_(True)  # (B, S, E)
    score = score_fn(x)
    if score.dim() != 1 or score.shape[0] != x.shape[0]:
        raise ValueError(f"score_fn must return one value per sequence ({x.shape[0]},), got {shape_str(score)}")
    (grad,) = torch.autograd.grad(score.sum(), x)
    attr = (grad * x).sum(-1).abs()  # (B, S)
    return attr / attr.sum(-1, keepdim=True).clamp_min(torch.finfo(attr.dtype).tiny)


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of each row of ``a`` with the same row of ``b`` (both (B, S)): (B,).
    Ties get their order of appearance (enough for continuous weights and attributions)."""
    if a.shape != b.shape or a.dim() != 2 or a.shape[1] < 2:
        raise ValueError(f"a {shape_str(a)} and b {shape_str(b)} must both be (B, S) with S >= 2")
    ra = a.argsort(-1).argsort(-1).double()  # (B, S) ranks
    rb = b.argsort(-1).argsort(-1).double()
    ra, rb = ra - ra.mean(-1, keepdim=True), rb - rb.mean(-1, keepdim=True)
    return ((ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))).float()


# --------------------------------------------------------------------- training, with the scores along the way
@dataclass
class InductionHistory:
    """The metrics of one training run, all at the same ``steps``: ``repeat_loss`` (one float per step) and,
    per step, the (N, H) scores ``previous_token``, ``prefix_matching`` and ``copying``; ``snapshots`` are
    the weights (state dicts) at those steps."""

    steps: list[int] = field(default_factory=list)
    repeat_loss: list[float] = field(default_factory=list)
    previous_token: list[torch.Tensor] = field(default_factory=list)
    prefix_matching: list[torch.Tensor] = field(default_factory=list)
    copying: list[torch.Tensor] = field(default_factory=list)
    snapshots: list[dict[str, torch.Tensor]] = field(default_factory=list)
    config: dict[str, int] = field(default_factory=dict)

    def model_at(self, index: int) -> AttentionOnlyTransformer:
        """The model as it was at ``steps[index]`` (in eval mode)."""
        check_int("index", index, 0, len(self.steps) - 1)
        model = AttentionOnlyTransformer(**self.config)
        model.load_state_dict(self.snapshots[index])
        return model.eval()

    def first_step_below(self, threshold: float) -> int | None:
        """The first recorded step whose repeat loss is under ``threshold`` (None if never)."""
        return next((s for s, v in zip(self.steps, self.repeat_loss) if v < threshold), None)

    def best(self, name: str, layer: int) -> list[float]:
        """Per recorded step, the highest score ``name`` among layer ``layer``'s heads."""
        return [float(s[layer].max()) for s in getattr(self, name)]


def train_induction(*, num_layers: int = 2, num_heads: int = 4, d_model: int = 64, vocab_size: int = 32,
                    seq_len: int = 32, min_length: int = 4, fixed: bool = False, steps: int = 600,
                    batch_size: int = 64, lr: float = 3e-3, seed: int = 0, every: int = 25,
                    ablate: Ablation | None = None, eval_size: int = 256
                    ) -> tuple[AttentionOnlyTransformer, InductionHistory]:
    """Train an :class:`AttentionOnlyTransformer` on next-token prediction over :func:`repeated_sequences`
    (every position is a target; only the second copy is predictable), recording the repeat loss and every
    head's scores on one fixed evaluation batch every ``every`` steps (step 0 included). ``ablate`` keeps
    those heads ablated during training and evaluation (the control with a head removed). Deterministic
    for a seed; draws from its own generators, not the global one."""
    check_int("steps", steps, 0)
    check_int("every", every)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AttentionOnlyTransformer(vocab_size, seq_len, d_model, num_heads, num_layers)
    def data(n: int, generator: torch.Generator) -> RepeatBatch:
        return repeated_sequences(n, seq_len, vocab_size, min_length=min_length, fixed=fixed, generator=generator)

    eval_batch = data(eval_size, torch.Generator().manual_seed(10_000 + seed))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    hist = InductionHistory(config={"vocab_size": vocab_size, "seq_len": seq_len, "d_model": d_model,
                                    "num_heads": num_heads, "num_layers": num_layers})

    def record(step: int) -> None:
        model.eval()
        with torch.no_grad():
            logits, weights = model(eval_batch.tokens, ablate=ablate)
            hist.steps.append(step)
            hist.repeat_loss.append(repeat_loss(logits, eval_batch).item())
            hist.previous_token.append(torch.stack([previous_token_scores(w) for w in weights]))
            hist.prefix_matching.append(torch.stack([prefix_matching_scores(w, eval_batch) for w in weights]))
            hist.copying.append(torch.stack([copying_scores(model, lay) for lay in range(num_layers)]))
            hist.snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        model.train()

    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            record(step)
        if step == steps:
            break
        batch = data(batch_size, g)
        logits, _ = model(batch.tokens, ablate=ablate)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab_size), batch.tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model, hist
