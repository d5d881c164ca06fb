"""DeepSeek-V4's attention: one shared key-value head, a sliding window, and compressed entries of the whole past
(compressed sparse attention, CSA, and heavily compressed attention, HCA).

Dimension legend (see :mod:`attnbook`; new letters marked *):
    B  batch size;  H  query heads;  T  query length (new tokens);  S  keys read (window + compressed entries)
    D  head dimension (keys = values);  Dr  rotary features (the *last* Dr of each head);  E  model dimension
    Dcq  width of the compressed query (``q_lora_rank``);  Hi, Di  the indexer's heads and head width;  k  top-k
    Rc*  compression rate (source tokens per compressed entry);  Nw*  compressed entries (closed windows)
    Go*  groups of the output projection (``o_groups``);  Ro*  width of each group's projection (``o_lora_rank``)

:class:`CompressedAttention` is one layer of any of DeepSeek-V4's three kinds (``transformers``'
``DeepseekV4Attention``, weights named as its, so its state dict loads 1:1, :meth:`CompressedAttention.from_hf`):

* **One KV head read as key and value.** ``kv = RMSNorm(kv_proj(x))``, D numbers a token, is the key *and* the
  value of all H query heads (multi-query attention with K = V). Queries go through a compressed query
  ``c_q = RMSNorm(q_a_proj(x))`` (Dcq) and ``q_b_proj``, then an RMSNorm without weight per head.
* **Partial RoPE on the trailing features, undone on the output.** The last Dr features of q and kv are rotated
  (interleaved pairs). Since the value is the rotated key, the output's last Dr features are rotated by the
  key's position; rotating them back by the query's position (angle ``-p_q``) leaves them depending on the
  distance ``p_q - p_k`` only.
* **A learned sink per head** (as gpt-oss: :func:`attnbook.llm_attention.softmax_with_sink`) and the scores scaled
  by ``D ** -0.5``.
* **Grouped low-rank output.** The H heads' H * D outputs are split into Go groups, each projected to Ro numbers
  by its own matrix (``o_a_proj``), and the Go * Ro numbers mixed into E (``o_b_proj``).
* **Layer kinds.** ``"sliding"``: every query reads the last ``sliding_window`` tokens (itself included).
  ``"hca"`` (heavily compressed): the window plus one compressed entry per Rc tokens of the whole past
  (Rc = 128 in DeepSeek-V4): entry ``w = RMSNorm(sum_j softmax_j(gate_j + bias_j) * kv_j)`` over window w's Rc
  tokens, feature by feature, rotated at position ``w * Rc``; query p reads the entries of the windows closed by p
  (``w < (p + 1) // Rc``). ``"csa"`` (compressed sparse, Rc = 4): entries over *overlapping* windows (each entry
  mixes the Rc tokens of its window and the Rc before, through two projections of 2D numbers a token), of which a
  lightning indexer (:class:`CompressedIndexer`, the score of DeepSeek-V3.2's,
  :mod:`attnbook.sparse_attention`, over compressed keys of its own) keeps ``index_topk`` per query.

Decoding goes through a :class:`CompressedKVCache`: the last ``sliding_window - 1`` tokens' kv, the compressed
entries so far, the projections of the tokens of a window not yet closed and (CSA) the last closed window's
first half: what ``transformers``' ``DeepseekV4CSACache`` / ``DeepseekV4HCACache`` hold.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn as nn

from ._checks import check_int, check_module_inputs, shape_str
from .llm_attention import softmax_with_sink
from .positional import apply_rotary

__all__ = ["V4_LAYER_KINDS", "Compressor", "CompressedIndexer", "CompressedKVCache", "CompressedAttention"]

#: The layer kinds of DeepSeek-V4, and the names ``transformers``' ``layer_types`` gives them.
V4_LAYER_KINDS = {"sliding": "sliding_attention", "csa": "compressed_sparse_attention",
               "hca": "heavily_compressed_attention"}


def _inv_freq(rope_dim: int, base: float) -> torch.Tensor:
    """``(Dr/2,)`` float64 RoPE frequencies ``base^(-2i / Dr)``."""
    return 1.0 / base ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)


def _rotate_tail(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE on the last ``rope_dim`` features of ``x (..., T, D)`` (interleaved pairs), at ``positions``
    broadcastable to ``x.shape[:-1]``; the other features unchanged."""
    head, tail = x[..., : x.shape[-1] - rope_dim], x[..., x.shape[-1] - rope_dim :]
    tail = apply_rotary(tail.float(), positions, interleaved=True, inv_freq=inv_freq).to(x.dtype)
    return torch.cat([head, tail], dim=-1)


class _CompressorState:
    """One compressor's part of a :class:`CompressedKVCache`."""

    def __init__(self) -> None:
        self.entries: torch.Tensor | None = None  # (B, Nw, D) every entry so far
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (kv, gate) (B, < Rc, Dc) of an open window
        self.overlap: tuple[torch.Tensor, torch.Tensor] | None = None  # CSA: the last closed window's first half
        self.count = 0  # entries emitted


class Compressor(nn.Module):
    """Compresses every ``rate`` (Rc) tokens into one entry of ``head_dim`` (D) numbers.

    ``overlap=False`` (HCA): ``kv_proj`` and ``gate_proj`` give D numbers a token; entry w is
    ``RMSNorm(sum_j softmax_j(gate_j + position_bias_j) * kv_j)`` over the Rc tokens of window w (a softmax per
    feature, over the window). ``overlap=True`` (CSA): they give 2D numbers a token, a first half (its share of
    the *next* window's entry) and a second half (its share of its own window's); entry w is the same softmax
    over 2Rc slots, window w - 1's first halves and window w's second halves. Each entry's last ``rope_dim``
    features are rotated at the position of its window's first token, ``w * Rc``.
    """

    def __init__(self, d_model: int, head_dim: int, rate: int, rope_dim: int, *, overlap: bool,
                 rope_base: float = 160000.0, rms_norm_eps: float = 1e-6) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim)
        self.rate = check_int("rate", rate)
        self.rope_dim = check_int("rope_dim", rope_dim)
        self.overlap = bool(overlap)
        width = (2 if overlap else 1) * head_dim
        self.kv_proj = nn.Linear(check_int("d_model", d_model), width, bias=False)
        self.gate_proj = nn.Linear(d_model, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(rate, width))
        self.kv_norm = nn.RMSNorm(head_dim, eps=rms_norm_eps)
        self.rope_inv_freq = _inv_freq(rope_dim, rope_base)
        self.indexer: nn.Module | None = None  # CSA's main compressor holds the layer's CompressedIndexer

    def forward(self, x: torch.Tensor, state: _CompressorState | None = None) -> torch.Tensor:
        """Every entry ``(B, Nw, D)`` of the windows closed so far: those of ``x (B, T, E)`` alone (the tokens
        of an unclosed last window are dropped), or, with a ``state``, those it held plus the windows that the
        new tokens close (the rest wait in the state)."""
        B = x.shape[0]
        kv, gate = self.kv_proj(x), self.gate_proj(x)  # (B, T, Dc) each, Dc = D or 2D
        first = 0 if state is None else state.count
        if state is not None and state.pending is not None:
            kv, gate = torch.cat([state.pending[0], kv], dim=1), torch.cat([state.pending[1], gate], dim=1)
        Rc, D = self.rate, self.head_dim
        usable = kv.shape[1] // Rc * Rc
        if state is not None:
            state.pending = (kv[:, usable:], gate[:, usable:])
        Nw = usable // Rc
        if Nw:
            kv_w = kv[:, :usable].view(B, Nw, Rc, -1)  # (B, Nw, Rc, Dc)
            gate_w = gate[:, :usable].view(B, Nw, Rc, -1) + self.position_bias  # (B, Nw, Rc, Dc)
            if self.overlap:
                prior_kv = kv_w.new_zeros(B, 1, Rc, D)  # the window before the first: weight 0
                prior_gate = gate_w.new_full((B, 1, Rc, D), float("-inf"))
                if state is not None and state.overlap is not None:
                    prior_kv, prior_gate = state.overlap[0][:, None], state.overlap[1][:, None]
                if state is not None:
                    state.overlap = (kv_w[:, -1, :, :D], gate_w[:, -1, :, :D])
                firsts_kv = torch.cat([prior_kv, kv_w[:, :-1, :, :D]], dim=1)  # (B, Nw, Rc, D): window w - 1
                firsts_gate = torch.cat([prior_gate, gate_w[:, :-1, :, :D]], dim=1)
                kv_w = torch.cat([firsts_kv, kv_w[..., D:]], dim=2)  # (B, Nw, 2Rc, D)
                gate_w = torch.cat([firsts_gate, gate_w[..., D:]], dim=2)  # (B, Nw, 2Rc, D)
            weights = torch.softmax(gate_w.float(), dim=2).to(kv_w.dtype)  # over the window's slots
            new = self.kv_norm((kv_w * weights).sum(dim=2))  # (B, Nw, D)
            positions = (first + torch.arange(Nw, device=x.device)) * Rc  # each window's first token
            new = _rotate_tail(new, positions, self.rope_dim, self.rope_inv_freq)
        else:
            new = kv.new_zeros(B, 0, D)
        if state is None:
            return new
        state.entries = new if state.entries is None else torch.cat([state.entries, new], dim=1)
        state.count += Nw
        return state.entries


class _IndexScorer(nn.Module):
    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.weights_proj = nn.Linear(d_model, num_heads, bias=False)


class CompressedIndexer(Compressor):
    """CSA's lightning indexer: a :class:`Compressor` of its own (overlapping, ``index_head_dim`` Di numbers an
    entry) for the keys, Hi query heads from the compressed query (``q_b_proj``), and the score of
    :mod:`attnbook.sparse_attention`, ``I[t, w] = sum_h w_h(x_t) * ReLU(q_th . k_w) / sqrt(Di)`` with
    ``w(x_t) = weights_proj(x_t) / sqrt(Hi)``, in float32."""

    def __init__(self, d_model: int, q_lora_rank: int, num_heads: int, head_dim: int, rate: int, rope_dim: int, *,
                 rope_base: float = 160000.0, rms_norm_eps: float = 1e-6) -> None:
        super().__init__(d_model, head_dim, rate, rope_dim, overlap=True, rope_base=rope_base,
                         rms_norm_eps=rms_norm_eps)
        self.num_heads = check_int("num_heads", num_heads)
        self.q_b_proj = nn.Linear(check_int("q_lora_rank", q_lora_rank), num_heads * head_dim, bias=False)
        self.scorer = _IndexScorer(d_model, num_heads)

    def scores(self, x: torch.Tensor, q_resid: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``(B, T, Nw)`` float32 index scores of the queries of ``x`` (compressed query ``q_resid``, at
        ``positions (T,)``) against the compressed keys ``(B, Nw, Di)``."""
        B, T, _ = x.shape
        q = self.q_b_proj(q_resid).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, Hi, T, Di)
        q = _rotate_tail(q, positions, self.rope_dim, self.rope_inv_freq).transpose(1, 2)  # (B, T, Hi, Di)
        s = torch.relu(torch.matmul(q.float(), keys.float().transpose(-1, -2).unsqueeze(1)))  # (B, T, Hi, Nw)
        w = self.scorer.weights_proj(x).float() * self.num_heads ** -0.5  # (B, T, Hi)
        return (s * self.head_dim ** -0.5 * w.unsqueeze(-1)).sum(dim=2)  # (B, T, Nw)


class CompressedKVCache:
    """What one :class:`CompressedAttention` layer keeps between decoding steps: the last ``sliding_window - 1``
    tokens' kv ``(B, 1, <W, D)`` with their positions, and for CSA and HCA each compressor's entries, the
    projections of an unclosed window and (CSA) the last closed window's first half."""

    def __init__(self) -> None:
        self.window: torch.Tensor | None = None  # (B, 1, <= W - 1, D)
        self.window_positions: torch.Tensor | None = None  # (<= W - 1,)
        self.length = 0  # tokens seen
        self.compressor = _CompressorState()
        self.indexer = _CompressorState()

    def __len__(self) -> int:
        return self.length

    @property
    def nbytes(self) -> int:
        """Bytes of the window's kv and of the compressed entries (the open windows' projections, fewer than Rc
        tokens, are not counted, as in :mod:`attnbook.configs`)."""
        total = 0
        for t in (self.window, self.compressor.entries, self.indexer.entries):
            if t is not None:
                total += t.numel() * t.element_size()
        return total


class CompressedAttention(nn.Module):
    """One DeepSeek-V4 attention layer (see the module docstring).

    Args:
        d_model: E.  num_heads: H.  head_dim: D (the one KV head's width too).  q_lora_rank: Dcq.
        rope_dim: Dr, the trailing features rotated (even, <= D).  o_groups: Go (divides H * D).
        o_lora_rank: Ro.  sliding_window: W, the tokens a query reads from the window (itself included).
        kind: ``"sliding"``, ``"csa"`` or ``"hca"``.  compress_rate: Rc (CSA and HCA).
        index_num_heads, index_head_dim, index_topk: Hi, Di, k (CSA).
        rope_base: the sliding layers' RoPE base;  compress_rope_base: the CSA and HCA layers' (their queries, kv
            and entries).  rms_norm_eps: every RMSNorm's epsilon.

    ``forward(x, *, cache=None, need_weights=False)`` returns ``(out (B, T, E), weights (B, H, T, S) or None)``:
    the T new tokens, at positions ``len(cache) + arange(T)``, attend over the window's keys then the compressed
    entries (S of them in all).
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int, *, q_lora_rank: int, rope_dim: int,
                 o_groups: int, o_lora_rank: int, sliding_window: int, kind: str = "sliding",
                 compress_rate: int | None = None, index_num_heads: int | None = None,
                 index_head_dim: int | None = None, index_topk: int | None = None, rope_base: float = 10000.0,
                 compress_rope_base: float = 160000.0, rms_norm_eps: float = 1e-6) -> None:
        super().__init__()
        if kind not in V4_LAYER_KINDS:
            raise ValueError(f"kind must be one of {', '.join(V4_LAYER_KINDS)}, got {kind!r}")
        self.kind = kind
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        self.head_dim = check_int("head_dim", head_dim)
        self.rope_dim = check_int("rope_dim", rope_dim)
        if rope_dim % 2 or rope_dim > head_dim:
            raise ValueError(f"rope_dim must be even and <= head_dim={head_dim}, got {rope_dim}")
        self.o_groups = check_int("o_groups", o_groups)
        if (num_heads * head_dim) % o_groups:
            raise ValueError(f"o_groups={o_groups} must divide num_heads * head_dim = {num_heads * head_dim}")
        self.o_lora_rank = check_int("o_lora_rank", o_lora_rank)
        self.sliding_window = check_int("sliding_window", sliding_window)
        self.q_a_proj = nn.Linear(d_model, check_int("q_lora_rank", q_lora_rank), bias=False)
        self.q_a_norm = nn.RMSNorm(q_lora_rank, eps=rms_norm_eps)
        self.q_b_proj = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False)
        self.q_b_norm = nn.RMSNorm(head_dim, eps=rms_norm_eps, elementwise_affine=False)
        self.kv_proj = nn.Linear(d_model, head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(head_dim, eps=rms_norm_eps)
        self.o_a_proj = nn.Linear(num_heads * head_dim // o_groups, o_groups * o_lora_rank, bias=False)
        self.o_b_proj = nn.Linear(o_groups * o_lora_rank, d_model, bias=False)
        self.sinks = nn.Parameter(torch.zeros(num_heads))
        self.scaling = head_dim ** -0.5
        self.rope_inv_freq = _inv_freq(rope_dim, rope_base if kind == "sliding" else compress_rope_base)
        self.compress_rate: int | None = None
        self.index_topk: int | None = None
        self.compressor: Compressor | None = None
        if kind != "sliding":
            self.compress_rate = check_int("compress_rate", compress_rate)
            self.compressor = Compressor(d_model, head_dim, self.compress_rate, rope_dim, overlap=kind == "csa",
                                         rope_base=compress_rope_base, rms_norm_eps=rms_norm_eps)
            if kind == "csa":
                if index_num_heads is None or index_head_dim is None or index_topk is None:
                    raise ValueError("a csa layer needs index_num_heads, index_head_dim and index_topk")
                self.index_topk = check_int("index_topk", index_topk)
                self.compressor.indexer = CompressedIndexer(
                    d_model, q_lora_rank, index_num_heads, index_head_dim, self.compress_rate, rope_dim,
                    rope_base=compress_rope_base, rms_norm_eps=rms_norm_eps)

    def extra_repr(self) -> str:
        return (f"kind={self.kind!r}, d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"rope_dim={self.rope_dim}, sliding_window={self.sliding_window}, compress_rate={self.compress_rate}")

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The grouped low-rank output projection of the heads' outputs ``(B, T, H, D)``: ``(B, T, E)``."""
        B, T = out.shape[:2]
        Go, Ro = self.o_groups, self.o_lora_rank
        grouped = out.reshape(B, T, Go, -1)  # (B, T, Go, H * D / Go)
        w = self.o_a_proj.weight.view(Go, Ro, -1)  # (Go, Ro, H * D / Go): one matrix per group
        low = torch.einsum("btgi,gri->btgr", grouped, w)  # (B, T, Go, Ro)
        return self.o_b_proj(low.reshape(B, T, Go * Ro))  # (B, T, E)

    def forward(
        self, x: torch.Tensor, *, cache: CompressedKVCache | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}) (batch-first), got {shape_str(x)}")
        check_module_inputs(self, x=x)
        if cache is not None and not isinstance(cache, CompressedKVCache):
            raise TypeError(f"cache must be a CompressedKVCache, got {type(cache).__name__}")
        B, T, _ = x.shape
        H, D, W = self.num_heads, self.head_dim, self.sliding_window
        past = 0 if cache is None else cache.length
        pos = past + torch.arange(T, device=x.device)  # (T,)
        q_resid = self.q_a_norm(self.q_a_proj(x))  # (B, T, Dcq)
        q = self.q_b_norm(self.q_b_proj(q_resid).view(B, T, H, D).transpose(1, 2))  # (B, H, T, D)
        q = _rotate_tail(q, pos, self.rope_dim, self.rope_inv_freq)
        kv = _rotate_tail(self.kv_norm(self.kv_proj(x))[:, None], pos, self.rope_dim, self.rope_inv_freq)  # (B, 1, T, D)
        keys, key_pos = kv, pos
        if cache is not None:
            if cache.window is not None and cache.window_positions is not None:
                keys = torch.cat([cache.window, kv], dim=2)  # (B, 1, <= W - 1 + T, D)
                key_pos = torch.cat([cache.window_positions, pos])
            keep = keys.shape[2] - min(keys.shape[2], W - 1)  # the next token's window: the last W - 1
            cache.window, cache.window_positions = keys[:, :, keep:], key_pos[keep:]
            cache.length += T
        d = pos[:, None] - key_pos[None, :]  # (T, Sw): query position minus key position
        allowed = ((d >= 0) & (d < W))[None].expand(B, T, -1)  # (B, T, Sw) the window
        if self.compressor is not None:
            entries = self.compressor(x, None if cache is None else cache.compressor)  # (B, Nw, D)
            assert self.compress_rate is not None
            closed = torch.arange(entries.shape[1], device=x.device)[None, :] < ((pos + 1) // self.compress_rate)[:, None]
            visible = closed[None].expand(B, T, -1)  # (B, T, Nw): windows closed by each query
            if self.kind == "csa":
                indexer = self.compressor.indexer
                assert isinstance(indexer, CompressedIndexer) and self.index_topk is not None
                index_keys = indexer(x, None if cache is None else cache.indexer)  # (B, Nw, Di)
                scores = indexer.scores(x, q_resid, index_keys, pos).masked_fill(~visible, float("-inf"))
                k = min(self.index_topk, entries.shape[1])
                chosen = torch.zeros_like(visible).scatter(-1, scores.topk(k, dim=-1).indices, True)
                visible = visible & chosen  # the top k of the closed entries
            keys = torch.cat([keys, entries[:, None]], dim=2)  # (B, 1, S, D)
            allowed = torch.cat([allowed, visible], dim=-1)  # (B, T, S)
        scores_ = torch.matmul(q, keys.transpose(-1, -2)) * self.scaling  # (B, H, T, S): one KV head for all
        weights = softmax_with_sink(scores_, self.sinks, allowed[:, None])  # (B, H, T, S)
        out = torch.matmul(weights, keys)  # (B, H, T, D): the values are the keys
        out = _rotate_tail(out, -pos, self.rope_dim, self.rope_inv_freq)  # rotate back by the query's position
        return self.output(out.transpose(1, 2)), (weights if need_weights else None)

    @classmethod
    def from_hf(cls, module: nn.Module) -> CompressedAttention:
        """A copy of a ``transformers`` ``DeepseekV4Attention`` (same weights, device and dtype); plain RoPE only
        (a YaRN-scaled ``compress`` RoPE raises a ``ValueError``)."""
        try:
            hf_mod = importlib.import_module("transformers.models.deepseek_v4.modeling_deepseek_v4")
            expected: type | None = hf_mod.DeepseekV4Attention
        except ImportError:
            expected = None
        if expected is None or not isinstance(module, expected):
            raise TypeError(f"from_hf expects a transformers DeepseekV4Attention, got {type(module).__name__}")
        hf: Any = module
        config: Any = hf.config
        rope = config.rope_parameters
        for label in ("main", "compress"):
            if rope[label].get("rope_type", "default") != "default":
                raise ValueError(f"only plain RoPE is copied, got {label!r} rope_type {rope[label].get('rope_type')!r}")
        kind = {v: k for k, v in V4_LAYER_KINDS.items()}[hf.layer_type]
        rate = config.compress_rates.get(hf.layer_type) if kind != "sliding" else None
        new = cls(config.hidden_size, config.num_attention_heads, config.head_dim, q_lora_rank=config.q_lora_rank,
                  rope_dim=int(config.head_dim * float(rope["main"].get("partial_rotary_factor", 1.0))),
                  o_groups=config.o_groups, o_lora_rank=config.o_lora_rank, sliding_window=config.sliding_window,
                  kind=kind, compress_rate=rate, index_num_heads=config.index_n_heads,
                  index_head_dim=config.index_head_dim, index_topk=config.index_topk,
                  rope_base=float(rope["main"]["rope_theta"]), compress_rope_base=float(rope["compress"]["rope_theta"]),
                  rms_norm_eps=float(config.rms_norm_eps))
        weight = hf.q_b_proj.weight
        new = new.to(device=weight.device, dtype=weight.dtype)
        new.load_state_dict(module.state_dict(), strict=True)
        return new
