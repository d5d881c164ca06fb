"""Efficient attention: sparse, linear, hashed and tiled variants of softmax(q k^T) v.

Dimension legend:
    B  batch size
    H  number of heads
    T  query length (target)
    S  key/value length (source)
    D  head dimension (queries and keys), Dv value head dimension
    W  sliding-window half-width (``window``)
    Sb keys one query block looks at (sliding window: block + 2W, or + W when causal)
    m  number of random features (Performer's ``num_features``)
    Df width of a feature map's output (D for elu + 1, m for Performer)
    R  number of hash rounds (Reformer's ``n_hashes``)
    Bq, Bk  queries and keys of one flash-attention tile (``query_block_size``, ``block_size``)
    Cs chunk length (linear attention's and Reformer's ``chunk_size``); nc number of chunks
    Cb positions of one sub-chunk (Kimi delta attention's chunkwise form); ns number of sub-chunks
    Gb query blocks of sliding-window attention handled together (a cache-sized group)
    Kb key blocks one BigBird query block attends (global + window + random)
    BH batch and heads merged into one dim (B * H), as flash attention's tiles run them

Every function takes q ``(B, H, T, D)``, k ``(B, H, S, D)`` and v
``(B, H, S, Dv)`` and returns the output ``(B, H, T, Dv)``.

Two families live here:

* **exact** methods give the same numbers as :func:`attnbook.scaled_dot_product_attention`
  with a mask, but never build a ``(T, S)`` matrix: :func:`sliding_window_attention`
  (banded mask), :func:`block_sparse_attention` (BigBird pattern) and
  :func:`flash_attention` (no mask, or causal; tiled with an online softmax, and a
  backward pass that recomputes the tiles from the log-sum-exp, as FlashAttention-2);
* **approximations** change the attention itself: :func:`linear_attention`
  (a positive feature map instead of exp), :func:`performer_attention`
  (random features whose dot product estimates exp), :func:`lsh_attention`
  (each query only sees keys hashed near it), :func:`decayed_linear_attention`
  (causal linear attention whose state fades by a factor gamma per step, an RNN and a
  state-space model at once; a relative of RetNet's retention), :func:`delta_rule_attention`
  (a fixed-size state that overwrites instead of adding: DeltaNet, and with a decay
  gate Gated DeltaNet) and :func:`kimi_delta_attention` (the gated delta rule with a decay
  per key channel: Kimi Linear's KDA); all causal only, so they are not in the registry,
  whose variants all run without a mask too.

The registry, :data:`REGISTRY`, names every variant with the two references
(``"exact"`` and ``"pytorch"``) and says what each is (exact or not, whether
it scores pairs, what its ``window`` means); :func:`attention_call` runs one by
name on :func:`make_inputs`' tensors. The chapter 8 explorer, ``bench/`` and
the benchmarks page all go through it.

Mask convention as everywhere in attnbook: bool, True = may attend; blocked
scores are filled with ``torch.finfo(dtype).min``; a query with no key to
attend to gets a zero output.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.types import Device

from ._checks import check_bool, check_int, shape_str
from .core import check_qkv, check_scale, fully_masked_rows, masked_softmax, scaled_dot_product_attention
from .masks import causal_mask, sliding_window_mask, to_additive
from .measure import cost_curves

__all__ = [
    "sliding_window_attention",
    "bigbird_block_pattern",
    "bigbird_pattern",
    "block_sparse_attention",
    "elu_feature_map",
    "linear_attention",
    "linear_attention_recurrent",
    "linear_attention_quadratic",
    "performer_features",
    "performer_feature_map",
    "performer_attention",
    "lsh_buckets",
    "lsh_attention",
    "flash_attention",
    "flash_attention_with_lse",
    "flash_attention_backward",
    "FlashAttentionFunction",
    "FLASH_BLOCK",
    "FLASH_QUERY_BLOCK",
    "Variant",
    "REGISTRY",
    "NUM_FEATURES",
    "variant",
    "Pattern",
    "ALL_PAIRS",
    "SLIDING_WINDOW_PAIRS",
    "BIGBIRD_PAIRS",
    "LSH_PAIRS",
    "attended_pairs",
    "pair_share",
    "pair_picture",
    "cost_key",
    "measure_costs",
    "attention_call",
    "lsh_n_buckets",
    "make_inputs",
    "decayed_linear_attention",
    "DECAYED_METHODS",
    "delta_rule_attention",
    "l2norm",
    "delta_rule_inputs",
    "delta_rule_costs",
    "DELTA_METHODS",
    "kimi_delta_attention",
]


# ----------------------------------------------------------------------------- helpers


def _check_bhtd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Validate q (B, H, T, D), k (B, H, S, D), v (B, H, S, Dv); return B, H, T, S, D."""
    check_qkv(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, length, dim), got shape {shape_str(t)}")
    if not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
        raise ValueError(
            f"q {shape_str(q)}, k {shape_str(k)} and v {shape_str(v)} must share (B, H) = their first two dims"
        )
    B, H, T, D = q.shape
    return B, H, T, k.shape[2], D


def _check_self_attention(name: str, q: torch.Tensor, k: torch.Tensor) -> None:
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"{name} is self-attention: q {shape_str(q)} and k {shape_str(k)} must have "
            f"the same length, got T={q.shape[-2]} and S={k.shape[-2]}"
        )


def _safe_divide(num: torch.Tensor, den: torch.Tensor, eps: float) -> torch.Tensor:
    """num / (den + eps), never dividing by 0 (den >= 0 here)."""
    return num / (den + eps).clamp_min(torch.finfo(den.dtype).tiny)


# ----------------------------------------------------------------------------- sliding window


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    causal: bool = False,
    block_size: int | None = None,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact attention under a sliding-window mask, in O(T * window) time and memory.

    Query ``i`` may attend key ``j`` when ``|i - j| <= window`` (``0 <= i - j <= window``
    when ``causal``): the same numbers as ::

        scaled_dot_product_attention(q, k, v, masks.sliding_window_mask(T, window, causal=causal))

    but the ``(T, T)`` matrix is never built. The queries are cut into blocks of
    ``block_size`` rows (default ``max(window, 32)``, at most T); block ``n``
    covers queries ``[n*b, n*b + b)`` and can only reach keys
    ``[n*b - W, n*b + b - 1 + W]`` (``[n*b - W, n*b + b - 1]`` when causal), a
    band of ``Sb = b + 2W`` keys. The keys are zero-padded by ``W`` on each side
    and cut into overlapping bands with ``Tensor.unfold`` (a strided view, no
    copy of the sequence per query), so each block does one ``(b, D) @ (D, Sb)``
    product: ``T/b * b * Sb = T * (b + 2W)`` scores in all.

    Self-attention only: q, k and v must have the same length (T == S).
    """
    check_bool("causal", causal)
    B, H, T, S, D = _check_bhtd(q, k, v)
    _check_self_attention("sliding_window_attention", q, k)
    window = check_int("window", window, 0)
    b = min(max(window, 32), T) if block_size is None else check_int("block_size", block_size, 1)
    scale = check_scale(scale, D)
    W = window
    nb = -(-T // b)  # number of query blocks, ceil(T / b)
    Tp = nb * b  # padded length
    right = Tp - T + (0 if causal else W)
    Sb = b + W + (0 if causal else W)  # keys per block

    qb = (F.pad(q, (0, 0, 0, Tp - T)) * scale).view(B, H, nb, b, D)  # (B, H, nb, b, D) scaled once
    kb = F.pad(k, (0, 0, W, right)).unfold(2, Sb, b)  # (B, H, nb, D, Sb)
    vb = F.pad(v, (0, 0, W, right)).unfold(2, Sb, b).transpose(-1, -2)  # (B, H, nb, Sb, Dv)

    # query r of block n is position n*b + r; key c of its band is n*b - W + c,
    # so i - j = W + r - c and the window is 0 <= c - r <= 2W (<= W when causal)
    r = torch.arange(b, device=q.device)[:, None]  # (b, 1)
    c = torch.arange(Sb, device=q.device)[None, :]  # (1, Sb)
    band = (c >= r) & (c - r <= (W if causal else 2 * W))  # (b, Sb)
    j = torch.arange(nb, device=q.device)[:, None] * b - W + c  # (nb, Sb) key positions
    real = (j >= 0) & (j < T)  # (nb, Sb) not padding

    # a few query blocks at a time, so that their scores (about 2 MB) stay in
    # the CPU's cache through the add, the softmax and the second product
    group = max(1, (1 << 19) // (B * H * b * Sb))
    outs = []
    for g0 in range(0, nb, group):
        g = slice(g0, g0 + group)
        allowed = band[None, :, :] & real[g, None, :]  # (Gb, b, Sb) True = may attend
        scores = torch.matmul(qb[:, :, g], kb[:, :, g])  # (B, H, Gb, b, Sb)
        # every real query sees itself, so no real row is fully blocked (padding rows are dropped)
        weights = masked_softmax(scores, allowed, inplace=True)  # (B, H, Gb, b, Sb)
        outs.append(torch.matmul(weights, vb[:, :, g]))  # (B, H, Gb, b, Dv)
    out = torch.cat(outs, dim=2)  # (B, H, nb, b, Dv)
    return out.reshape(B, H, Tp, -1)[:, :, :T]  # (B, H, T, Dv)


# ----------------------------------------------------------------------------- BigBird


def bigbird_block_pattern(
    num_blocks: int,
    window_blocks: int = 1,
    global_blocks: int = 1,
    random_blocks: int = 1,
    seed: int = 0,
) -> torch.Tensor:
    """BigBird's block-level pattern: bool ``(num_blocks, num_blocks)``, entry
    ``[a, c]`` True when query block ``a`` attends key block ``c``.

    * window: ``|a - c| <= window_blocks``;
    * global: the first ``global_blocks`` blocks attend every block and every
      block attends them (row and column all True);
    * random: each other query block adds ``random_blocks`` key blocks drawn
      without replacement among those not already selected (fewer when fewer
      are left), from a generator seeded with ``seed`` (same pattern for every
      batch element and head).
    """
    nb = check_int("num_blocks", num_blocks, 1)
    window_blocks = check_int("window_blocks", window_blocks, 0)
    global_blocks = check_int("global_blocks", global_blocks, 0)
    random_blocks = check_int("random_blocks", random_blocks, 0)
    a = torch.arange(nb)
    pattern = (a[:, None] - a[None, :]).abs() <= window_blocks  # (nb, nb)
    g = min(global_blocks, nb)
    pattern[:g, :] = True
    pattern[:, :g] = True
    if random_blocks:
        gen = torch.Generator().manual_seed(seed)
        for row in range(g, nb):
            free = (~pattern[row]).nonzero().flatten()  # key blocks not yet chosen
            pick = free[torch.randperm(len(free), generator=gen)[:random_blocks]]
            pattern[row, pick] = True
    return pattern


def bigbird_pattern(
    T: int,
    block_size: int,
    window_blocks: int = 1,
    global_blocks: int = 1,
    random_blocks: int = 1,
    seed: int = 0,
) -> torch.Tensor:
    """The token-level mask, bool ``(T, T)``, True = may attend: query ``i``
    attends key ``j`` when block ``i // block_size`` attends block
    ``j // block_size`` in :func:`bigbird_block_pattern` (the last block may be
    shorter than ``block_size``). Only for tests and plots: the attention
    itself never builds it."""
    T = check_int("T", T, 1)
    block_size = check_int("block_size", block_size, 1)
    nb = -(-T // block_size)
    blocks = bigbird_block_pattern(nb, window_blocks, global_blocks, random_blocks, seed)  # (nb, nb)
    idx = torch.arange(T) // block_size  # (T,) block of each position
    return blocks[idx[:, None], idx[None, :]]  # (T, T)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int,
    window_blocks: int = 1,
    global_blocks: int = 1,
    random_blocks: int = 1,
    seed: int = 0,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """BigBird block-sparse self-attention, exact under :func:`bigbird_pattern`'s mask.

    The sequence is cut into blocks of ``block_size`` (zero-padded at the end;
    the padding is never attended). The global query blocks attend all T keys.
    Every other query block gathers only its selected key blocks, at most
    ``Kb = global + 2 * window + 1 + random`` of them, into one ``(Kb * block, D)``
    tensor and does a single dense product with it, so the cost is
    O(T * Kb * block) instead of O(T^2). Self-attention only (T == S).
    """
    B, H, T, S, D = _check_bhtd(q, k, v)
    _check_self_attention("block_sparse_attention", q, k)
    bs = check_int("block_size", block_size, 1)
    scale = check_scale(scale, D)
    nb = -(-T // bs)
    Tp = nb * bs
    pattern = bigbird_block_pattern(nb, window_blocks, global_blocks, random_blocks, seed).to(q.device)
    g = min(global_blocks, nb)
    outs = []
    if g:
        # global query blocks attend everything: dense, but only g * bs rows
        qg = q[:, :, : g * bs]  # (B, H, g*bs, D)
        outs.append(scaled_dot_product_attention(qg, k, v, scale=scale)[0])  # (B, H, g*bs, Dv)
    if g < nb:
        rows = pattern[g:]  # (nr, nb) key blocks of each remaining query block
        nr = nb - g
        Kb = int(rows.sum(dim=-1).max())
        # selected block ids first (stable sort puts True before False), then padding slots
        order = torch.argsort((~rows).to(torch.int8), dim=-1, stable=True)[:, :Kb]  # (nr, Kb)
        chosen = rows.gather(1, order)  # (nr, Kb) False for the padding slots
        kp = F.pad(k, (0, 0, 0, Tp - T)).view(B, H, nb, bs, D)  # (B, H, nb, bs, D)
        vp = F.pad(v, (0, 0, 0, Tp - T)).view(B, H, nb, bs, -1)  # (B, H, nb, bs, Dv)
        kg = kp[:, :, order].reshape(B, H, nr, Kb * bs, D)  # (B, H, nr, Kb*bs, D)
        vg = vp[:, :, order].reshape(B, H, nr, Kb * bs, -1)  # (B, H, nr, Kb*bs, Dv)
        qr = F.pad(q, (0, 0, 0, Tp - T)).view(B, H, nb, bs, D)[:, :, g:]  # (B, H, nr, bs, D)
        key_pos = order[:, :, None] * bs + torch.arange(bs, device=q.device)  # (nr, Kb, bs)
        allowed = (chosen[:, :, None] & (key_pos < T)).reshape(nr, 1, Kb * bs)  # (nr, 1, Kb*bs)
        scores = torch.matmul(qr, kg.transpose(-1, -2)) * scale  # (B, H, nr, bs, Kb*bs)
        weights = masked_softmax(scores, allowed, inplace=True)  # (B, H, nr, bs, Kb*bs)
        out_r = torch.matmul(weights, vg)  # (B, H, nr, bs, Dv)
        outs.append(out_r.reshape(B, H, nr * bs, -1))  # (B, H, nr*bs, Dv)
    return torch.cat(outs, dim=2)[:, :, :T]  # (B, H, T, Dv)


# ----------------------------------------------------------------------------- linear attention


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1, positive everywhere (Katharopoulos et al., 2020).

    Computed as exp(min(x, 0)) + relu(x), the same function (x + 1 for x > 0,
    exp(x) otherwise) with the same gradient, several times faster than
    ``F.elu`` on a CPU."""
    return x.clamp(max=0.0).exp_() + F.relu(x)


_CAUSAL_METHODS = ("chunkwise", "cumsum")


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    phi_q: Callable[[torch.Tensor], torch.Tensor],
    phi_k: Callable[[torch.Tensor], torch.Tensor],
    causal: bool,
    eps: float,
    chunk_size: int,
    method: str = "chunkwise",
) -> torch.Tensor:
    """Linear attention out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps), with
    S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j) over all j (non-causal)
    or over j <= i (causal). ``phi_q`` and ``phi_k`` act row by row and are
    applied a chunk of rows at a time, so no temporary is larger than a chunk
    (the cache keeps it, and nothing of size T but the output is allocated).

    The normaliser rides along as an extra column of ones in v: the last
    column of phi(q_i)^T [S_i | z_i] is phi(q_i)^T z_i.

    Non-causal: [S | z] = sum over key chunks of phi(K_c)^T [V_c | 1], a
    (Df, Dv+1) matrix, then phi(Q_c) [S | z] for each query chunk.

    Causal (T == S), chunk by chunk, carrying [S | z] of the chunks before.
    Inside a chunk of Cs positions:

    * ``"cumsum"``: the states S_i of every position, a cumsum of the outer
      products phi(k_j) v_j^T plus the carried state; memory O(Cs * Df * Dv);
    * ``"chunkwise"``: phi(q_i)^T S_i = phi(q_i)^T S_carried + sum_{j <= i in
      the chunk} (phi(q_i) . phi(k_j)) v_j, the second term a (Cs, Cs) lower
      triangle times the chunk's values. The same numbers without building Cs
      states: memory O(Cs * (Cs + Df + Dv) + Df * Dv), and plain matrix products
      (about 10x faster on a CPU).
    """
    B, H, T, D = q.shape
    S, Dv = k.shape[2], v.shape[-1]
    ones = v.new_ones(B, H, max(chunk_size, 1), 1)  # (B, H, Cs, 1)

    def with_ones(v_c: torch.Tensor) -> torch.Tensor:
        return torch.cat([v_c, ones[:, :, : v_c.shape[2]]], dim=-1)  # (B, H, c, Dv+1)

    def normalise(o: torch.Tensor) -> torch.Tensor:  # (B, H, c, Dv+1) -> (B, H, c, Dv)
        return _safe_divide(o[..., :-1], o[..., -1:], eps)

    outs = []
    if not causal:
        state = None
        for start in range(0, S, chunk_size):
            sl = slice(start, start + chunk_size)
            part = torch.matmul(phi_k(k[:, :, sl]).transpose(-2, -1), with_ones(v[:, :, sl]))  # (B, H, Df, Dv+1)
            state = part if state is None else state + part
        assert state is not None  # S >= 1
        for start in range(0, T, chunk_size):
            outs.append(normalise(torch.matmul(phi_q(q[:, :, start : start + chunk_size]), state)))  # (B, H, c, Dv)
        return torch.cat(outs, dim=2)  # (B, H, T, Dv)

    state = None  # (B, H, Df, Dv+1) prefix sum [S | z] of the chunks before
    for start in range(0, T, chunk_size):
        sl = slice(start, start + chunk_size)
        fq_c, fk_c, v_c = phi_q(q[:, :, sl]), phi_k(k[:, :, sl]), with_ones(v[:, :, sl])  # (B, H, Cs, Df), (B, H, Cs, Dv+1)
        if state is None:
            state = fq_c.new_zeros(B, H, fq_c.shape[-1], Dv + 1)  # (B, H, Df, Dv+1)
        if method == "cumsum":
            outer = fk_c.unsqueeze(-1) * v_c.unsqueeze(-2)  # (B, H, Cs, Df, Dv+1)
            states = outer.cumsum(dim=2) + state.unsqueeze(2)  # (B, H, Cs, Df, Dv+1) S_i for each i
            out_c = torch.einsum("bhcf,bhcfe->bhce", fq_c, states)  # (B, H, Cs, Dv+1)
            state = states[:, :, -1]  # (B, H, Df, Dv+1)
        else:
            A = torch.matmul(fq_c, fk_c.transpose(-2, -1)).tril()  # (B, H, Cs, Cs) phi(q_i).phi(k_j), j <= i
            out_c = torch.matmul(fq_c, state) + torch.matmul(A, v_c)  # (B, H, Cs, Dv+1)
            state = state + torch.matmul(fk_c.transpose(-2, -1), v_c)  # (B, H, Df, Dv+1)
        outs.append(normalise(out_c))  # (B, H, Cs, Dv)
    return torch.cat(outs, dim=2)  # (B, H, T, Dv)


def _check_causal_lengths(fn: str, q: torch.Tensor, k: torch.Tensor, causal: bool) -> None:
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(
            f"{fn} with causal=True needs q {shape_str(q)} and k {shape_str(k)} of the same length, "
            f"got T={q.shape[2]} and S={k.shape[2]}"
        )


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    eps: float = 1e-6,
    *,
    chunk_size: int | None = None,
    method: str = "chunkwise",
) -> torch.Tensor:
    """Linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al., 2020)::

        out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)

    Why this is cheaper: softmax(Q K^T) V cannot be reassociated, because the
    exp (and the row normalisation) acts on every entry of the (T, S) matrix
    Q K^T, which must therefore be built first: O(T S D). Replacing
    exp(q . k) by the kernel phi(q) . phi(k) makes the unnormalised weights a
    plain matrix product phi(Q) phi(K)^T, and by associativity of matrix
    products ``(phi(Q) phi(K)^T) V = phi(Q) (phi(K)^T V)``. The right-hand side
    first forms the (D, Dv) matrix phi(K)^T V, so the cost goes from
    O(T^2 D) to O(T D^2) and no (T, S) matrix exists. The normaliser is the
    same trick with V replaced by a column of ones.

    The rows are processed ``chunk_size`` at a time (default: 128 when
    causal, else as many as keep a temporary near 256 KB), so nothing of
    size T but the output is allocated and the temporaries stay in the cache.

    With ``causal=True`` (T == S) the sums run over j <= i: prefix sums
    S_i = sum_{j <= i} phi(k_j) v_j^T, taken ``chunk_size`` positions at a
    time with the sum of the earlier chunks carried along. ``method="cumsum"``
    builds the S_i of a chunk with a cumsum of the outer products (memory
    O(chunk_size * D * Dv)); the default ``"chunkwise"`` gets the same
    phi(q_i)^T S_i from the carried state plus a (chunk, chunk) lower
    triangle of phi(q_i) . phi(k_j), which avoids the per-position states and
    is much faster. Both equal the RNN of :func:`linear_attention_recurrent`
    and the quadratic form :func:`linear_attention_quadratic`.
    """
    check_bool("causal", causal)
    _check_bhtd(q, k, v)
    _check_causal_lengths("linear_attention", q, k, causal)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, 1)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if method not in _CAUSAL_METHODS:
        raise ValueError(f"method must be one of {_CAUSAL_METHODS}, got {method!r}")
    if chunk_size is None and causal:
        chunk_size = 128
    elif chunk_size is None:  # rows per step: about 256 KB of float32 per temporary, which stays in the cache
        B, H, _, D = q.shape
        chunk_size = max(64, (1 << 16) // (B * H * max(D, v.shape[-1] + 1)))
    return _linear_attention(q, k, v, elu_feature_map, elu_feature_map, causal, eps, chunk_size, method)


def linear_attention_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Causal linear attention as an RNN, one position at a time (T == S)::

        S_i = S_{i-1} + phi(k_i) v_i^T      (D, Dv) state
        z_i = z_{i-1} + phi(k_i)            (D,) normaliser
        out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)

    O(T D Dv) time and O(D Dv) state: a transformer decoder run this way is an
    RNN. Slow in Python (a loop over T); it is the reference the chunked
    :func:`linear_attention` is tested against."""
    B, H, T, S, D = _check_bhtd(q, k, v)
    _check_causal_lengths("linear_attention_recurrent", q, k, True)
    fq, fk = elu_feature_map(q), elu_feature_map(k)  # (B, H, T, D)
    state = q.new_zeros(B, H, D, v.shape[-1])  # (B, H, D, Dv)
    z = q.new_zeros(B, H, D)  # (B, H, D)
    outs = []
    for i in range(T):
        state = state + fk[:, :, i, :, None] * v[:, :, i, None, :]  # (B, H, D, Dv)
        z = z + fk[:, :, i]  # (B, H, D)
        num = torch.einsum("bhd,bhde->bhe", fq[:, :, i], state)  # (B, H, Dv)
        den = (fq[:, :, i] * z).sum(dim=-1, keepdim=True)  # (B, H, 1)
        outs.append(_safe_divide(num, den, eps))
    return torch.stack(outs, dim=2)  # (B, H, T, Dv)


def linear_attention_quadratic(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """The same attention in its O(T^2) form: weights phi(Q) phi(K)^T (causal:
    lower triangle kept), each row divided by its sum (+ eps), times V. For
    teaching and testing on small inputs."""
    check_bool("causal", causal)
    _check_bhtd(q, k, v)
    _check_causal_lengths("linear_attention_quadratic", q, k, causal)
    A = torch.matmul(elu_feature_map(q), elu_feature_map(k).transpose(-2, -1))  # (B, H, T, S)
    if causal:
        A = A.tril()  # (B, H, T, S)
    return _safe_divide(torch.matmul(A, v), A.sum(dim=-1, keepdim=True), eps)  # (B, H, T, Dv)


# ----------------------------------------------------------------------------- Performer (FAVOR+)


def performer_features(
    num_features: int,
    head_dim: int,
    orthogonal: bool = True,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """The random projection of FAVOR+, ``(num_features, head_dim)`` = (m, D),
    drawn from a generator seeded with ``seed`` (same seed, same matrix).

    Rows are i.i.d. N(0, I_D) when ``orthogonal=False``. With ``orthogonal=True``
    they come in blocks of D exactly orthogonal directions (Q factor of a
    gaussian matrix), the last block truncated, and each row is rescaled to
    the length of an independent gaussian vector (chi-distributed with D
    degrees of freedom), so every row still has the N(0, I_D) distribution
    but the rows of a block are orthogonal: a lower-variance estimate.
    """
    check_bool("orthogonal", orthogonal)
    m = check_int("num_features", num_features, 1)
    D = check_int("head_dim", head_dim, 1)
    gen = torch.Generator().manual_seed(seed)
    if not orthogonal:
        w = torch.randn(m, D, generator=gen, dtype=torch.float64)
    else:
        blocks = []
        for _ in range(-(-m // D)):
            g = torch.randn(D, D, generator=gen, dtype=torch.float64)
            qmat, rmat = torch.linalg.qr(g)  # (D, D) orthonormal columns
            # fix the signs (diag(R) > 0) so that Q is uniformly (Haar) distributed
            qmat = qmat * torch.sign(torch.diagonal(rmat))[None, :]
            blocks.append(qmat.T)  # (D, D) rows orthonormal
        w = torch.cat(blocks, dim=0)[:m]  # (m, D) unit rows
        lengths = torch.randn(m, D, generator=gen, dtype=torch.float64).norm(dim=1)  # (m,) ~ chi(D)
        w = w * lengths[:, None]  # (m, D)
    return w.to(dtype=dtype, device=device)


def performer_feature_map(x: torch.Tensor, projection: torch.Tensor, is_query: bool) -> torch.Tensor:
    """Positive random features phi(x) = exp(w^T x - |x|^2 / 2) / sqrt(m), with
    x = input / D**0.25, so that E[phi(q) . phi(k)] = exp(q . k / sqrt(D)).

    Returns ``(B, H, length, m)``. Numerically stabilised: before the exp a
    max is subtracted, per row for queries (a per-query factor, cancelled by
    the row normalisation) and over all keys and features of a (batch, head)
    for keys (a common factor, cancelled too, and the same for every position
    so causal attention stays causal). The results equal phi up to those
    factors, which attention never sees.
    """
    check_bool("is_query", is_query)
    D = x.shape[-1]
    if projection.dim() != 2 or projection.shape[1] != D:
        raise ValueError(f"projection must be (m, D={D}), got {shape_str(projection)}")
    m = projection.shape[0]
    x = x * D**-0.25
    wx = torch.matmul(x, projection.to(x.dtype).T)  # (B, H, length, m)
    wx = wx - 0.5 * (x * x).sum(dim=-1, keepdim=True)  # (B, H, length, m)
    if is_query:
        stab = wx.amax(dim=-1, keepdim=True)  # (B, H, length, 1)
    else:
        stab = wx.amax(dim=(-2, -1), keepdim=True)  # (B, H, 1, 1)
    return torch.exp(wx - stab.detach()) / math.sqrt(m)  # (B, H, length, m)


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_features: int = 64,
    orthogonal: bool = True,
    seed: int = 0,
    causal: bool = False,
    *,
    chunk_size: int = 128,
) -> torch.Tensor:
    """Performer (FAVOR+, Choromanski et al., 2021): a random-feature
    approximation of softmax attention in O(T m D) instead of O(T S D).

    exp(q . k / sqrt(D)) = E_w[phi(q) . phi(k)] with the positive features of
    :func:`performer_feature_map` (w ~ N(0, I), orthogonal rows by default,
    see :func:`performer_features`). With those features, attention is linear
    attention (:func:`linear_attention`'s reordering phi(Q) (phi(K)^T V)),
    numerator and normaliser alike. Both are unbiased estimates of softmax
    attention's; their ratio, the output, is not exactly unbiased but its
    error falls like 1/sqrt(num_features). The features are positive, so the
    normaliser never goes negative (the trouble with sin/cos features).
    ``causal=True`` (T == S) uses the same chunked prefix sums. The random
    matrix depends only on ``seed``: get it with :func:`performer_features`.
    """
    check_bool("orthogonal", orthogonal)
    check_bool("causal", causal)
    B, H, T, S, D = _check_bhtd(q, k, v)
    _check_causal_lengths("performer_attention", q, k, causal)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    w = performer_features(num_features, D, orthogonal, seed, dtype=q.dtype, device=q.device)  # (m, D)
    fq = performer_feature_map(q, w, is_query=True)  # (B, H, T, m)
    fk = performer_feature_map(k, w, is_query=False)  # (B, H, S, m)
    return _linear_attention(fq, fk, v, _identity, _identity, causal, 0.0, chunk_size if causal else max(q.shape[2], k.shape[2]))


# ----------------------------------------------------------------------------- Reformer (LSH)


def lsh_buckets(x: torch.Tensor, n_buckets: int, n_hashes: int = 1, seed: int = 0) -> torch.Tensor:
    """Angular LSH of Reformer: bucket ids ``(B, H, R, T)`` (long) for x (B, H, T, D).

    For each of the R = ``n_hashes`` rounds a random rotation ``Rot`` (D, n_buckets/2),
    seeded by ``seed``, is applied to the normalised vectors and the bucket is
    ``argmax([x Rot ; -x Rot])``: vectors pointing the same way tend to share a
    bucket. ``n_buckets`` must be even, or 1 (everything in bucket 0).
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        what = f"a {x.dtype} tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point torch.Tensor, got {what}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (B, H, T, D), got shape {shape_str(x)}")
    n_buckets = check_int("n_buckets", n_buckets, 1)
    n_hashes = check_int("n_hashes", n_hashes, 1)
    B, H, T, D = x.shape
    if n_buckets == 1:
        return torch.zeros(B, H, n_hashes, T, dtype=torch.long, device=x.device)
    if n_buckets % 2:
        raise ValueError(f"n_buckets must be even (or 1): buckets come in +/- pairs, got {n_buckets}")
    gen = torch.Generator().manual_seed(seed)
    rot = torch.randn(n_hashes, D, n_buckets // 2, generator=gen, dtype=torch.float64)
    rot = rot.to(dtype=x.dtype, device=x.device)  # (R, D, n_buckets/2)
    xn = F.normalize(x.detach(), dim=-1)  # (B, H, T, D)
    rotated = torch.einsum("bhtd,rdn->bhrtn", xn, rot)  # (B, H, R, T, n_buckets/2)
    return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)  # (B, H, R, T)


def _look_back(x: torch.Tensor, fill: float) -> torch.Tensor:
    """Each chunk of ``x (..., nc, Cs, ...)`` (chunk axis 3) next to the one before it: ``(..., nc, 2Cs, ...)``;
    chunk 0 gets a "previous" chunk of ``fill``."""
    prev = torch.cat([torch.full_like(x[:, :, :, :1], fill), x[:, :, :, :-1]], dim=3)
    return torch.cat([prev, x], dim=4)  # (B, H, R, nc, 2Cs, ...)


def _lsh_chunk_mask(pc: torch.Tensor, T: int, causal: bool) -> torch.Tensor:
    """Reformer's rule for which keys a query of a chunk attends, from the positions ``pc (B, H, R, nc, Cs)``
    of the sorted, chunked sequence (``T`` marks padding): the keys of its own chunk and of the previous
    one, never padding, only earlier positions when ``causal``, and never itself unless it has no other
    key (its query and key are nearly parallel, so self would dominate). Bool ``(B, H, R, nc, Cs, 2Cs)``.
    :func:`lsh_attention` attends by it and :func:`attended_pairs` draws it."""
    pq = pc.unsqueeze(-1)  # (B, H, R, nc, Cs, 1)
    pk = _look_back(pc, T).unsqueeze(-2)  # (B, H, R, nc, 1, 2Cs)
    allowed = pk < T  # (B, H, R, nc, 1, 2Cs) real keys
    if causal:
        allowed = allowed & (pk <= pq)  # (B, H, R, nc, Cs, 2Cs)
    is_self = pk == pq  # (B, H, R, nc, Cs, 2Cs)
    others = allowed & ~is_self
    alone = fully_masked_rows(others)  # (B, H, R, nc, Cs, 1) nobody else to attend
    return others | (allowed & is_self & alone)  # (B, H, R, nc, Cs, 2Cs)


def _lsh_sorted_positions(buckets: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable sort by (bucket, position): the order ``(B, H, R, T)`` and the sorted positions cut into
    chunks ``(B, H, R, nc, Cs)``, padded with T."""
    T = buckets.shape[-1]
    nc = -(-T // chunk_size)
    pos = torch.arange(T, device=buckets.device)
    order = torch.argsort(buckets * T + pos, dim=-1)  # (B, H, R, T) sort by bucket, then position
    spos = F.pad(order, (0, nc * chunk_size - T), value=T)  # (B, H, R, nc*Cs), T marks padding
    return order, spos.unflatten(-1, (nc, chunk_size))  # (B, H, R, T), (B, H, R, nc, Cs)


def lsh_attention(
    qk: torch.Tensor,
    v: torch.Tensor,
    n_buckets: int = 8,
    chunk_size: int = 32,
    n_hashes: int = 1,
    seed: int = 0,
    causal: bool = False,
    *,
    return_buckets: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reformer's LSH self-attention (Kitaev et al., 2020), shared-QK.

    Queries and keys are the same projection ``qk`` (B, H, T, D): the query is
    ``qk_i``, the key is ``qk_j / |qk_j|`` (normalised, as in Reformer), the
    score is their dot product / sqrt(D). Steps, per hash round:

    1. hash every position into a bucket (:func:`lsh_buckets`);
    2. stable-sort positions by (bucket, position);
    3. cut the sorted sequence into chunks of ``chunk_size``; each chunk
       attends to itself and to the previous chunk (the first chunk only to
       itself). Tokens of a neighbouring bucket that fall in that window are
       attended too, as in Reformer's implementation;
    4. a token does not attend to itself unless it has no other key (its
       query and key are nearly parallel, so self would dominate); with
       ``causal`` it attends only to earlier positions;
    5. undo the sort.

    With several rounds (``n_hashes`` > 1) the per-round outputs are combined
    with weights softmax over rounds of their log-sum-exp, i.e. a softmax over
    all keys found in any round (a key found in r rounds counts r times).
    Cost O(T * chunk_size * D * n_hashes).

    Returns the output ``(B, H, T, Dv)``, and with ``return_buckets=True`` also
    the bucket ids ``(B, H, n_hashes, T)``.
    """
    check_bool("causal", causal)
    check_bool("return_buckets", return_buckets)
    B, H, T, S, D = _check_bhtd(qk, qk, v)
    if v.shape[2] != T:
        raise ValueError(f"qk {shape_str(qk)} and v {shape_str(v)} must have the same length T")
    Cs = check_int("chunk_size", chunk_size, 1)
    buckets = lsh_buckets(qk, n_buckets, n_hashes, seed)  # (B, H, R, T)
    R = buckets.shape[2]
    Dv = v.shape[-1]
    nc = -(-T // Cs)
    Tp = nc * Cs

    order, pc = _lsh_sorted_positions(buckets, Cs)  # (B, H, R, T), (B, H, R, nc, Cs)
    sq = qk.unsqueeze(2).expand(B, H, R, T, D).gather(3, order[..., None].expand(B, H, R, T, D))  # (B, H, R, T, D)
    sv = v.unsqueeze(2).expand(B, H, R, T, Dv).gather(3, order[..., None].expand(B, H, R, T, Dv))  # (B, H, R, T, Dv)
    sq = F.pad(sq, (0, 0, 0, Tp - T))  # (B, H, R, Tp, D)
    sv = F.pad(sv, (0, 0, 0, Tp - T))  # (B, H, R, Tp, Dv)
    sk = F.normalize(sq, dim=-1)  # (B, H, R, Tp, D) keys: unit length

    qc = sq.view(B, H, R, nc, Cs, D)  # (B, H, R, nc, Cs, D)
    kc = sk.view(B, H, R, nc, Cs, D)  # (B, H, R, nc, Cs, D)
    vc = sv.view(B, H, R, nc, Cs, Dv)  # (B, H, R, nc, Cs, Dv)

    kw = _look_back(kc, 0.0)  # (B, H, R, nc, 2Cs, D)
    vw = _look_back(vc, 0.0)  # (B, H, R, nc, 2Cs, Dv)
    mask = _lsh_chunk_mask(pc, T, causal)  # (B, H, R, nc, Cs, 2Cs)

    scores = torch.matmul(qc, kw.transpose(-1, -2)) / math.sqrt(D)  # (B, H, R, nc, Cs, 2Cs)
    weights = masked_softmax(scores, mask, inplace=R == 1)  # (B, H, R, nc, Cs, 2Cs); the scores stay for R > 1
    out = torch.matmul(weights, vw).reshape(B, H, R, Tp, Dv)[:, :, :, :T]  # (B, H, R, T, Dv)

    undo = torch.argsort(order, dim=-1)  # (B, H, R, T) inverse permutation
    out = out.gather(3, undo[..., None].expand(B, H, R, T, Dv))  # (B, H, R, T, Dv)
    if R > 1:
        lowest = torch.finfo(scores.dtype).min
        lse = torch.logsumexp(scores.masked_fill(~mask, lowest), dim=-1)  # (B, H, R, nc, Cs)
        lse = lse.reshape(B, H, R, Tp)[:, :, :, :T].gather(3, undo)  # (B, H, R, T)
        mix = torch.softmax(lse, dim=2)  # (B, H, R, T) weight of each round
        out = (mix.unsqueeze(-1) * out).sum(dim=2)  # (B, H, T, Dv)
    else:
        out = out[:, :, 0]  # (B, H, T, Dv)
    return (out, buckets) if return_buckets else out


# ----------------------------------------------------------------------------- FlashAttention

_LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))


def _flash_blocks(T: int, bq: int | None, bk: int) -> int:
    """The query block size: ``bq`` (default :data:`FLASH_QUERY_BLOCK`) rounded up to a multiple of the
    key block ``bk``, and no larger than T rounded up to one (so a short sequence is one query block)."""
    bq = FLASH_QUERY_BLOCK if bq is None else check_int("query_block_size", bq, 1)
    bq = -(-bq // bk) * bk  # a multiple of bk: a key block never straddles two query blocks' diagonals
    return max(bk, min(bq, -(-T // bk) * bk))


def _flash_diagonal_bias(bq: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(bq, bq)`` additive bias of a query block against the keys at the same positions:
    0 where key c <= query r (may attend), ``finfo.min`` above the diagonal."""
    tri = torch.ones(bq, bq, dtype=torch.bool, device=device).tril()  # (bq, bq) key c <= query r
    return to_additive(tri, dtype)  # (bq, bq)


def _flash_key_blocks(a: int, ae: int, S: int, bk: int, causal: bool) -> Iterator[tuple[int, int, bool]]:
    """The key blocks ``[c, ce)`` that the query block ``[a, ae)`` meets, and whether the tile needs the
    causal bias. Causal (top-left, key j <= query i): blocks that start after the block's last query
    ``ae - 1`` are skipped; a block that reaches past its first query ``a`` is a diagonal tile."""
    end = min(S, ae) if causal else S
    for c in range(0, end, bk):
        ce = min(c + bk, S)
        yield c, ce, causal and ce - 1 > a


def _flash_forward_3d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, bq: int, bk: int,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward pass on ``(BH, T, D)``, ``(BH, S, D)``, ``(BH, S, Dv)`` tensors of a float dtype of at
    least 32 bits; returns the output ``(BH, T, Dv)`` and the base-2 log-sum-exp ``(BH, T, 1)``."""
    BH, T, D = q.shape
    S, Dv = k.shape[1], v.shape[-1]
    lowest = torch.finfo(q.dtype).min
    q2 = q * (scale * _LOG2E)  # (BH, T, D) scores in base 2: exp2(q2 k) = exp(scale q k)
    kt = k.transpose(1, 2)  # (BH, D, S) a view
    diagonal = _flash_diagonal_bias(bq, q.dtype, q.device) if causal else None
    out = torch.empty(BH, T, Dv, dtype=q.dtype, device=q.device)  # (BH, T, Dv)
    lse2 = torch.empty(BH, T, 1, dtype=q.dtype, device=q.device)  # (BH, T, 1)
    for a in range(0, T, bq):  # one query block at a time: its m, l and acc stay small (in the CPU's cache)
        ae = min(a + bq, T)
        qa = q2[:, a:ae]  # (BH, Bq, D)
        m = torch.full((BH, ae - a, 1), lowest, dtype=q.dtype, device=q.device)  # (BH, Bq, 1) running max
        l = torch.zeros(BH, ae - a, 1, dtype=q.dtype, device=q.device)  # (BH, Bq, 1) running sum of exp2
        acc = torch.zeros(BH, ae - a, Dv, dtype=q.dtype, device=q.device)  # (BH, Bq, Dv) unnormalised output
        for c, ce, diag in _flash_key_blocks(a, ae, S, bk, causal):
            s = torch.bmm(qa, kt[:, :, c:ce])  # (BH, Bq, Bk) one tile of scores (base 2)
            if diag:
                assert diagonal is not None
                s.add_(diagonal[: ae - a, c - a : ce - a])  # blocked: finfo.min (key c + x > query a + r)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (BH, Bq, 1)
            # every query row has seen key 0 in the first tile, so m_new is a real score and a blocked
            # entry gives exp2(finfo.min - m_new) = 0 exactly
            p = s.sub_(m_new).exp2_()  # (BH, Bq, Bk) in place: the tile of scores becomes its weights
            alpha = m.sub_(m_new).exp2_()  # (BH, Bq, 1) rescales what was summed against the old max
            l.mul_(alpha).add_(p.sum(dim=-1, keepdim=True))
            acc.mul_(alpha).baddbmm_(p, v[:, c:ce])  # acc * alpha + p @ v_block
            m = m_new
        torch.div(acc, l.clamp_min(torch.finfo(q.dtype).tiny), out=out[:, a:ae])  # (BH, Bq, Dv)
        torch.add(m, l.log2(), out=lse2[:, a:ae])  # (BH, Bq, 1) log2 sum_j exp2(s_ij)
    return out, lse2


def _flash_backward_3d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse2: torch.Tensor,
                       dout: torch.Tensor, causal: bool, bq: int, bk: int,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward pass on ``(BH, length, dim)`` tensors (as :func:`_flash_forward_3d`'s, plus the output,
    its base-2 log-sum-exp and the output's gradient ``dout``); returns dq, dk, dv."""
    T, S = q.shape[1], k.shape[1]
    q2 = q * (scale * _LOG2E)  # (BH, T, D) as in the forward pass: the same tiles of scores
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # (BH, D, S), (BH, Dv, S) views
    delta = (dout * out).sum(dim=-1, keepdim=True)  # (BH, T, 1) D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij
    diagonal = _flash_diagonal_bias(bq, q.dtype, q.device) if causal else None
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)  # (BH, T, D), (BH, S, D), (BH, S, Dv)
    for a in range(0, T, bq):
        ae = min(a + bq, T)
        qa, q2a, doa = q[:, a:ae], q2[:, a:ae], dout[:, a:ae]  # (BH, Bq, D), (BH, Bq, D), (BH, Bq, Dv)
        lse_a, delta_a, dqa = lse2[:, a:ae], delta[:, a:ae], dq[:, a:ae]  # (BH, Bq, 1) x 2, (BH, Bq, D) a view
        for c, ce, diag in _flash_key_blocks(a, ae, S, bk, causal):
            s = torch.bmm(q2a, kt[:, :, c:ce])  # (BH, Bq, Bk) the forward pass's tile, recomputed
            if diag:
                assert diagonal is not None
                s.add_(diagonal[: ae - a, c - a : ce - a])
            p = s.sub_(lse_a).exp2_()  # (BH, Bq, Bk) P_ij = exp(s_ij - lse_i): the final weights, at once
            dv[:, c:ce].baddbmm_(p.transpose(1, 2), doa)  # dV_j += P^T dO
            dp = torch.bmm(doa, vt[:, :, c:ce])  # (BH, Bq, Bk) dP = dO V^T
            ds = dp.sub_(delta_a).mul_(p)  # (BH, Bq, Bk) dS = P * (dP - D), in place
            dqa.baddbmm_(ds, k[:, c:ce])  # dQ_i += dS K (times scale below)
            dk[:, c:ce].baddbmm_(ds.transpose(1, 2), qa)  # dK_j += dS^T Q (times scale below)
    return dq.mul_(scale), dk.mul_(scale), dv


class FlashAttentionFunction(torch.autograd.Function):
    """:func:`flash_attention` as an autograd function: the forward pass saves q, k, v, the output and the
    per-query log-sum-exp, nothing of size T x S; the backward pass recomputes each tile's weights from
    them (FlashAttention-2). Call it through :func:`flash_attention`, which checks the arguments."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_size: int,
                query_block_size: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, T, D = q.shape
        S, Dv = k.shape[2], v.shape[-1]
        work = torch.promote_types(q.dtype, torch.float32)  # float16/bfloat16 tiles are computed in float32
        q3 = q.reshape(B * H, T, D).to(work)  # (BH, T, D)
        k3 = k.reshape(B * H, S, D).to(work)  # (BH, S, D)
        v3 = v.reshape(B * H, S, Dv).to(work)  # (BH, S, Dv)
        out3, lse2 = _flash_forward_3d(q3, k3, v3, causal, query_block_size, block_size, scale)
        out = out3.view(B, H, T, Dv).to(q.dtype)  # (B, H, T, Dv)
        lse = (lse2 / _LOG2E).view(B, H, T)  # (B, H, T) natural log: log sum_j exp(scale q_i k_j)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = (causal, block_size, query_block_size, scale)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        causal, block_size, query_block_size, scale = ctx.settings
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, dout, causal, block_size, scale,
                                              query_block_size=query_block_size)
        return dq, dk, dv, None, None, None, None


FLASH_BLOCK = 256
"""Default key block (``block_size``) of :func:`flash_attention`: the keys of one tile."""
FLASH_QUERY_BLOCK = 512
"""Default query block (``query_block_size``) of :func:`flash_attention`: the queries of one tile."""


def _flash_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                query_block_size: int | None, scale: float | None) -> tuple[int, int, float]:
    """Check flash's arguments; return the key block, the query block and the scale."""
    _B, _H, T, _S, D = _check_bhtd(q, k, v)
    bk = check_int("block_size", block_size, 1)
    return bk, _flash_blocks(T, query_block_size, bk), check_scale(scale, D)


def flash_attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_size: int = FLASH_BLOCK,
    scale: float | None = None,
    *,
    query_block_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flash_attention`'s output ``(B, H, T, Dv)`` and the per-query log-sum-exp ``(B, H, T)``,
    ``lse_i = log sum_j exp(scale * q_i . k_j)`` over the keys query i may attend: everything the
    backward pass keeps besides q, k and v. The output is differentiable (the log-sum-exp is not)."""
    check_bool("causal", causal)
    bk, bq, scale = _flash_args(q, k, v, block_size, query_block_size, scale)
    out, lse = FlashAttentionFunction.apply(q, k, v, bool(causal), bk, bq, scale)
    return out, lse


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_size: int = FLASH_BLOCK,
    scale: float | None = None,
    *,
    query_block_size: int | None = None,
) -> torch.Tensor:
    """Exact softmax attention, tiled with an online softmax, with its own backward pass
    (FlashAttention-2, Dao 2023), in plain PyTorch. Returns ``(B, H, T, Dv)``, equal to
    ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``, and so are its gradients.

    **Forward.** Queries are cut into blocks of ``query_block_size`` rows (default
    :data:`FLASH_QUERY_BLOCK`, rounded up to a multiple of ``block_size``) and keys into blocks of
    ``block_size`` (default :data:`FLASH_BLOCK`). Each query block visits the key blocks one at a
    time and keeps three running quantities per query: the max score so far ``m``, the sum of
    ``exp(score - m)`` so far ``l`` and the unnormalised output ``acc``. A key block whose tile of
    scores is ``s`` updates them as::

        m_new = max(m, rowmax(s))
        p     = exp(s - m_new)
        l     = exp(m - m_new) * l   + rowsum(p)
        acc   = exp(m - m_new) * acc + p @ v_block

    (``exp(m - m_new)`` rescales what was summed against the old max) and at the end
    ``out = acc / l`` and ``lse = m + log(l)``, the log-sum-exp of the query's scores. The GPU kernel
    runs the query blocks in parallel; here the loop over query blocks is the outer one (as in
    FlashAttention-2), so one query block's ``m``, ``l``, ``acc`` and its ``(query block, key block)``
    tile of scores stay small enough for the CPU's cache, and the tile is turned into its weights in
    place. The exponentials are ``exp2`` on scores in base 2 (``scale * log2(e)`` is folded into q once):
    the same numbers, and ``exp2`` is the cheaper instruction (as in the CUDA kernels).

    **Causal** (query i sees keys j <= i, top-left aligned as in PyTorch, also when T != S): key
    blocks that start after a query block's last query are skipped (about half the tiles), and only
    the tiles on the diagonal get a bias of ``finfo.min`` above it.

    **What the backward pass keeps.** q, k, v, the output and ``lse``, one number per query: O(T * D)
    memory, no ``(T, S)`` matrix and no tile (autograd through the loop would keep every tile, as much
    as the explicit path). The log-sum-exp is all the backward pass needs because

    * the final weights are ``P_ij = exp(s_ij - lse_i)``: recomputing a tile's scores
      ``s = scale * q_i . k_j`` (one more matrix product) and subtracting ``lse_i`` gives that
      tile's weights at once, already normalised, without replaying the running max and sum;
    * the softmax's gradient needs, besides P and ``dP = dO V^T``, only one number per query,
      ``D_i = sum_j P_ij dP_ij = dO_i . O_i`` (because ``O_i = sum_j P_ij v_j``), which the output
      and its gradient give without any tile.

    Then, tile by tile: ``dV_j += P^T dO``, ``dP = dO V_j^T``, ``dS = P * (dP - D)``,
    ``dQ_i += scale * dS K_j``, ``dK_j += scale * dS^T Q_i``: five matrix products per tile against the
    forward pass's two, and at most two tiles alive (P and dS).

    float32 and float64 are computed in their own dtype; float16 and bfloat16 in float32 (returned in
    the input's dtype). No masks other than ``causal``. Use :func:`flash_attention_with_lse` for the
    log-sum-exp too, and :func:`flash_attention_backward` to run the backward pass by hand.
    """
    check_bool("causal", causal)
    return flash_attention_with_lse(q, k, v, causal, block_size, scale, query_block_size=query_block_size)[0]


def flash_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    block_size: int = FLASH_BLOCK,
    scale: float | None = None,
    *,
    query_block_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention-2's backward pass by hand: the gradients ``(dq, dk, dv)`` of attention with
    respect to q ``(B, H, T, D)``, k ``(B, H, S, D)`` and v ``(B, H, S, Dv)``, given the output
    ``out (B, H, T, Dv)`` and log-sum-exp ``lse (B, H, T)`` of :func:`flash_attention_with_lse` and the
    output's gradient ``grad_out (B, H, T, Dv)``. It is what ``flash_attention(...).backward()`` runs;
    see :func:`flash_attention` for the algorithm."""
    check_bool("causal", causal)
    bk, bq, scale = _flash_args(q, k, v, block_size, query_block_size, scale)
    B, H, T, D = q.shape
    S, Dv = k.shape[2], v.shape[-1]
    for name, t, shape in (("out", out, (B, H, T, Dv)), ("grad_out", grad_out, (B, H, T, Dv)), ("lse", lse, (B, H, T))):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {shape} for q {shape_str(q)} and v {shape_str(v)}, got {shape_str(t)}")
    work = torch.promote_types(q.dtype, torch.float32)
    dq, dk, dv = _flash_backward_3d(
        q.reshape(B * H, T, D).to(work),  # (BH, T, D)
        k.reshape(B * H, S, D).to(work),  # (BH, S, D)
        v.reshape(B * H, S, Dv).to(work),  # (BH, S, Dv)
        out.reshape(B * H, T, Dv).to(work),  # (BH, T, Dv)
        lse.reshape(B * H, T, 1).to(work) * _LOG2E,  # (BH, T, 1) base 2, as the forward pass computed it
        grad_out.reshape(B * H, T, Dv).to(work),  # (BH, T, Dv)
        bool(causal), bq, bk, scale,
    )
    return dq.view(B, H, T, D).to(q.dtype), dk.view(B, H, S, D).to(k.dtype), dv.view(B, H, S, Dv).to(v.dtype)


# ----------------------------------------------------------------------------- which pairs each variant scores


def _overlap(T: int, size: int, P: int) -> torch.Tensor:
    """(P, n): the share of each of P equal cells of 0..T that falls in each of the n = ceil(T / size)
    blocks of ``size`` positions (rows sum to 1)."""
    edges = torch.arange(P + 1, dtype=torch.float64) * T / P  # (P+1,) cell edges
    starts = torch.arange(0, T, size, dtype=torch.float64)  # (n,) block starts
    ends = (starts + size).clamp(max=T)
    lo = torch.maximum(edges[:-1, None], starts[None, :])
    hi = torch.minimum(edges[1:, None], ends[None, :])
    return (hi - lo).clamp(min=0) / (T / P)  # (P, n)


def _pool(pairs: torch.Tensor, P: int) -> torch.Tensor:
    """A bool ``(T, T)`` pattern as the share of attended pairs in each of ``(P, P)`` cells."""
    return F.adaptive_avg_pool2d(pairs.float()[None], P)[0]  # (P, P)


@dataclass(frozen=True)
class Pattern:
    """Which (query, key) pairs a variant scores in a self-attention of length T.

    Attributes:
        pairs: ``pairs(T, window, seed)`` -> bool ``(T, T)``, True where query i scores key j.
        count: ``count(T, window, seed)`` -> how many pairs, without building ``(T, T)``.
        picture: ``picture(T, window, P, seed)`` -> float ``(P, P)``, the share of each cell's pairs that
            are scored (pooling :attr:`pairs`, computed without it where the pattern allows).
    """

    pairs: Callable[[int, int, int], torch.Tensor]
    count: Callable[[int, int, int], int]
    picture: Callable[[int, int, int, int], torch.Tensor]


ALL_PAIRS = Pattern(
    pairs=lambda T, window, seed: torch.ones(T, T, dtype=torch.bool),
    count=lambda T, window, seed: T * T,
    picture=lambda T, window, P, seed: torch.ones(P, P),
)
"""Exact attention's pattern (and FlashAttention's: every pair, a tile at a time)."""


def _window_count(T: int, window: int, seed: int) -> int:
    i = torch.arange(T)
    return int(((i + window).clamp(max=T - 1) - (i - window).clamp(min=0) + 1).sum())


def _window_picture(T: int, window: int, P: int, seed: int) -> torch.Tensor:
    if T % P:
        return _pool(sliding_window_mask(T, window), P)
    f = T // P  # positions per cell side; the share depends only on the cell diagonal d = b - a
    delta = torch.arange(-(f - 1), f)  # (2f-1,) j - i within a pair of cells
    d = torch.arange(-(P - 1), P)[:, None]  # (2P-1, 1)
    inside = ((d * f + delta).abs() <= window).double()  # (2P-1, 2f-1)
    share = inside @ (f - delta.abs()).double() / (f * f)  # (2P-1,)
    a = torch.arange(P)
    return share[(a[None, :] - a[:, None]) + P - 1].float()  # (P, P)


SLIDING_WINDOW_PAIRS = Pattern(
    pairs=lambda T, window, seed: sliding_window_mask(T, window),
    count=_window_count,
    picture=_window_picture,
)
"""|i - j| <= window: :func:`sliding_window_attention`'s pattern."""


def _bigbird_count(T: int, window: int, seed: int) -> int:
    nb = -(-T // window)  # block sizes times the block-level pattern
    sizes = torch.full((nb,), float(window), dtype=torch.float64)
    sizes[-1] = T - window * (nb - 1)
    blocks = bigbird_block_pattern(nb).double()  # (nb, nb), the registry's defaults
    return round(float(sizes @ blocks @ sizes))


def _bigbird_picture(T: int, window: int, P: int, seed: int) -> torch.Tensor:
    if T % P:
        return _pool(bigbird_pattern(T, window), P)
    A = _overlap(T, window, P)  # (P, nb): pool the block-level pattern, no (T, T) mask needed
    blocks = bigbird_block_pattern(A.shape[1]).double()  # (nb, nb)
    return (A @ blocks @ A.T).float()  # (P, P)


BIGBIRD_PAIRS = Pattern(
    pairs=lambda T, window, seed: bigbird_pattern(T, window),
    count=_bigbird_count,
    picture=_bigbird_picture,
)
"""BigBird with blocks of ``window`` (one window block each side, one global, one random):
:func:`block_sparse_attention`'s pattern with its defaults, as the registry runs it."""


@functools.lru_cache(maxsize=16)
def _lsh_pair_index(T: int, window: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query positions, key positions) of the pairs the registry's LSH attention scores on
    ``make_inputs(T, seed=seed)``, head 0, one hash round (the same rule: :func:`_lsh_chunk_mask`)."""
    qk = make_inputs(T, seed=seed)[0][:1, :1]  # (1, 1, T, D): head 0 of the shared query/key
    buckets = lsh_buckets(qk, lsh_n_buckets(T, window), 1, seed=0)  # (1, 1, R=1, T)
    _, pc = _lsh_sorted_positions(buckets, window)  # (1, 1, 1, nc, Cs)
    mask = _lsh_chunk_mask(pc, T, causal=False)[0, 0, 0]  # (nc, Cs, 2Cs)
    pq = pc[0, 0, 0].unsqueeze(-1).expand_as(mask)  # (nc, Cs, 2Cs) query positions
    pk = _look_back(pc, T)[0, 0, 0].unsqueeze(-2).expand_as(mask)  # (nc, Cs, 2Cs) key positions
    real = mask & (pq < T)  # padding queries (position T) are dropped, as lsh_attention drops their rows
    return pq[real], pk[real]


def _lsh_pairs(T: int, window: int, seed: int) -> torch.Tensor:
    pairs = torch.zeros(T, T, dtype=torch.bool)
    pairs[_lsh_pair_index(T, window, seed)] = True
    return pairs


def _lsh_picture(T: int, window: int, P: int, seed: int) -> torch.Tensor:
    if T % P:
        return _pool(_lsh_pairs(T, window, seed), P)
    f = T // P  # count the pairs in each cell
    qi, kj = _lsh_pair_index(T, window, seed)
    counts = torch.bincount((qi // f) * P + kj // f, minlength=P * P)  # (P*P,)
    return counts.view(P, P).float() / (f * f)  # (P, P)


LSH_PAIRS = Pattern(
    pairs=_lsh_pairs,
    count=lambda T, window, seed: len(_lsh_pair_index(T, window, seed)[0]),
    picture=_lsh_picture,
)
"""Reformer's data-dependent pairs: head 0's on :func:`make_inputs` ``(T, seed=seed)``, one hash round,
``T / window`` buckets, chunks of ``window`` (as the registry runs :func:`lsh_attention`)."""


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Variant:
    """One way of computing attention, as the explorer, the benchmarks and the report run it.

    Attributes:
        name: its key in :data:`REGISTRY`, e.g. ``"sliding window"``.
        exact: gives the numbers of softmax attention (under its pattern, if it has one); the
            approximations (linear, Performer, LSH) do not.
        window: what the ``window`` argument of :func:`attention_call` means for it (``"window
            half-width"``, ``"block size"``, ...), or ``None`` when it takes none.
        causal: whether it has a causal form (``causal=True``).
        run: ``run(q, k, v, window, causal)`` -> the output ``(B, H, T, Dv)``.
        pattern: the (query, key) pairs it scores, declared next to ``run`` (:class:`Pattern`); ``None``
            for linear attention and Performer, which never score a pair (keys are summed into a state).
    """

    name: str
    exact: bool
    window: str | None
    causal: bool
    run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, bool], torch.Tensor] = field(repr=False)
    pattern: Pattern | None = field(repr=False)

    @property
    def scores_pairs(self) -> bool:
        """Whether it computes (query, key) scores at all."""
        return self.pattern is not None


NUM_FEATURES = 64  # Performer's random features in the registry


def lsh_n_buckets(T: int, window: int) -> int:
    """Reformer's choice: about one chunk of ``window`` positions per bucket, so
    ``T // window`` buckets, made even (buckets come in +/- pairs), or 1."""
    n = max(1, T // window)
    return n if n == 1 or n % 2 == 0 else n + 1


def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device) if causal else None
    return scaled_dot_product_attention(q, k, v, mask)[0]


def _block_sparse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    if causal:
        raise ValueError("block_sparse_attention has no causal form")
    return block_sparse_attention(q, k, v, window)


def _lsh(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    out = lsh_attention(q, v, lsh_n_buckets(q.shape[2], window), window, causal=causal)  # shared queries/keys: q
    assert isinstance(out, torch.Tensor)
    return out


REGISTRY: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("exact", True, None, True, _exact, ALL_PAIRS),
        Variant("pytorch", True, None, True,
                lambda q, k, v, window, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal), ALL_PAIRS),
        Variant("sliding window", True, "window half-width", True,
                lambda q, k, v, window, causal: sliding_window_attention(q, k, v, window, causal=causal),
                SLIDING_WINDOW_PAIRS),
        Variant("block sparse", True, "block size", False, _block_sparse, BIGBIRD_PAIRS),
        Variant("linear", False, None, True,
                lambda q, k, v, window, causal: linear_attention(q, k, v, causal=causal), None),
        Variant("performer", False, None, True,
                lambda q, k, v, window, causal: performer_attention(q, k, v, NUM_FEATURES, causal=causal), None),
        Variant("LSH", False, "chunk size", True, _lsh, LSH_PAIRS),
        Variant("flash", True, "tile size", True,
                lambda q, k, v, window, causal: flash_attention(q, k, v, causal=causal, block_size=window), ALL_PAIRS),
    )
}
"""Every attention variant by name: ``"exact"`` (:func:`attnbook.scaled_dot_product_attention`, which
builds the (T, S) weights) and ``"pytorch"`` (``F.scaled_dot_product_attention``, PyTorch's fused kernel)
as the references, then the variants of this module."""


def variant(name: str) -> Variant:
    """The :class:`Variant` called ``name``; a ``ValueError`` names the known ones."""
    if not isinstance(name, str):
        raise TypeError(f"variant name must be a str, got {type(name).__name__}")
    if name not in REGISTRY:
        raise ValueError(f"variant must be one of {tuple(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


def attention_call(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 64, *,
                   causal: bool = False) -> Callable[[], torch.Tensor]:
    """A zero-argument callable computing variant ``name`` (a key of :data:`REGISTRY`) on q, k, v
    ``(B, H, T, D)`` with its ``window`` (ignored by the variants that take none); returns the output
    ``(B, H, T, Dv)``. For timing: the arguments are bound once, the call does only the attention."""
    check_bool("causal", causal)
    run = variant(name).run
    if causal and not REGISTRY[name].causal:
        raise ValueError(f"variant {name!r} has no causal form")
    return lambda: run(q, k, v, window, causal)


def make_inputs(seq_len: int, *, batch_size: int = 1, num_heads: int = 2, head_dim: int = 32, seed: int = 0,
                dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inputs the variants are compared on: random q, k, v, each ``(B, H, T, D)`` = ``(batch_size,
    num_heads, seq_len, head_dim)``, from a generator seeded with ``seed`` (the same seed, the same
    tensors), in ``dtype`` (default: torch's default dtype)."""
    sizes = [check_int(name, val) for name, val in (("batch_size", batch_size), ("num_heads", num_heads),
                                                     ("seq_len", seq_len), ("head_dim", head_dim))]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*sizes, generator=g, dtype=dtype) for _ in range(3))  # (B, H, T, D) each
    return q, k, v


def attended_pairs(name: str, T: int, window: int = 64, *, seed: int = 0) -> torch.Tensor | None:
    """Bool ``(T, T)``, True where query i scores key j under variant ``name`` (its :class:`Pattern`);
    ``None`` for ``"linear"`` and ``"performer"``, which never score a pair. LSH's pairs depend on the
    data: these are head 0's on ``make_inputs(T, seed=seed)``, one hash round."""
    pattern = variant(name).pattern
    T, window = check_int("T", T), check_int("window", window)
    return None if pattern is None else pattern.pairs(T, window, seed)


def pair_share(name: str, T: int, window: int = 64, *, seed: int = 0) -> float | None:
    """The share of the T * T (query, key) pairs that variant ``name`` scores; ``None`` for
    ``"linear"`` and ``"performer"``."""
    pattern = variant(name).pattern
    T, window = check_int("T", T), check_int("window", window)
    return None if pattern is None else pattern.count(T, window, seed) / (T * T)


def pair_picture(name: str, T: int, window: int = 64, resolution: int = 128, *, seed: int = 0) -> torch.Tensor:
    """Float ``(P, P)``, P = min(resolution, T): the share of the (query, key) pairs in each cell that
    variant ``name`` scores (the pattern itself when P == T); all NaN for ``"linear"`` and ``"performer"``.
    Computed without building the ``(T, T)`` pattern where it can be (it equals pooling
    :func:`attended_pairs`)."""
    pattern = variant(name).pattern
    T, window = check_int("T", T), check_int("window", window)
    P = min(check_int("resolution", resolution), T)
    if pattern is None:
        return torch.full((P, P), float("nan"))
    return _cached_picture(name, T, window, P, seed).clone()


@functools.lru_cache(maxsize=64)
def _cached_picture(name: str, T: int, window: int, P: int, seed: int) -> torch.Tensor:
    pattern = REGISTRY[name].pattern
    assert pattern is not None
    return pattern.picture(T, window, P, seed)


def cost_key(name: str, T: int, window: int) -> tuple:
    """The key of a measurement: ``(name, T, window)``, window ``None`` for the variants that take
    none (exact, pytorch, linear, performer)."""
    return (name, T, window if variant(name).window is not None else None)


def measure_costs(
    names: Sequence[str],
    t_values: Sequence[int],
    window: int = 64,
    *,
    rounds: int = 3,
    memory: bool = True,
    threads: int | None = 1,
    seed: int = 0,
    batch_size: int = 1,
    num_heads: int = 2,
    head_dim: int = 32,
    reduce: str = "min",
) -> dict[tuple, dict]:
    """Time (and track the memory of) each variant in ``names`` at each T, on ``make_inputs(T)``:
    :func:`attnbook.measure.cost_curves` of :func:`attention_call`. Returns ``{cost_key(name, T,
    window): {"time_s", "peak_bytes", "largest_bytes"}}`` (no memory keys with ``memory=False``). All
    variants of one T are timed together, interleaved, with ``threads`` torch threads (default 1, as
    ``bench/``: steadier on a shared machine; ``None`` keeps the current setting; restored afterwards);
    ``reduce`` keeps the fastest round (``"min"``) or the median (``"median"``, as chapter 8 and ``bench/``)."""
    check_bool("memory", memory)
    for name in names:
        variant(name)

    def calls_at(T: int) -> dict[tuple, Any]:
        q, k, v = make_inputs(T, batch_size=batch_size, num_heads=num_heads, head_dim=head_dim, seed=seed)
        return {cost_key(name, T, window): attention_call(name, q, k, v, window) for name in names}

    return cost_curves(calls_at, t_values, rounds=rounds, memory=memory, threads=threads, reduce=reduce)


# ----------------------------------------------------------------------------- linear attention with decay


DECAYED_METHODS = ("chunkwise", "parallel", "recurrent")


def _check_gamma(gamma: float | torch.Tensor, H: int, like: torch.Tensor) -> torch.Tensor:
    """gamma as a (1, H, 1, 1) tensor of like's dtype and device; each value in (0, 1]."""
    if isinstance(gamma, bool) or not isinstance(gamma, (float, int, torch.Tensor)):
        raise TypeError(f"gamma must be a float or a (H,) tensor of floats, got {type(gamma).__name__} {gamma!r}")
    g = torch.as_tensor(gamma, dtype=like.dtype, device=like.device)
    if g.dim() == 0:
        g = g.expand(H)
    if g.shape != (H,):
        raise ValueError(f"gamma must be a float or one value per head (H,) = ({H},), got shape {shape_str(g)}")
    if not bool(((g > 0) & (g <= 1)).all()):
        raise ValueError(f"gamma must be in (0, 1], got {g.tolist()}")
    return g.view(1, H, 1, 1)  # (1, H, 1, 1)


def _decay_matrix(log_gamma: torch.Tensor, T: int, S: int | None = None) -> torch.Tensor:
    """gamma^(i-j) where j <= i, else 0: (1, H, T, S) from log gamma (1, H, 1, 1)."""
    S = T if S is None else S
    i = torch.arange(T, device=log_gamma.device)[:, None]  # (T, 1)
    j = torch.arange(S, device=log_gamma.device)[None, :]  # (1, S)
    dist = (i - j).clamp_min(0).to(log_gamma.dtype)  # (T, S)
    return torch.where(j <= i, torch.exp(log_gamma * dist), torch.zeros((), dtype=log_gamma.dtype,
                                                                       device=log_gamma.device))  # (1, H, T, S)


def decayed_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: float | torch.Tensor,
    eps: float = 1e-6,
    *,
    method: str = "chunkwise",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Causal linear attention whose memory fades by ``gamma`` per step (T == S)::

        S_t = gamma S_{t-1} + phi(k_t) v_t^T       (D, Dv) state
        z_t = gamma z_{t-1} + phi(k_t)             (D,) normaliser
        out_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps)

    with phi(x) = elu(x) + 1 as in :func:`linear_attention`. A key seen d steps ago counts gamma^d as
    much as the current one. Two relatives: RetNet's retention (Sun et al., 2023) decays its state the
    same way, with a fixed gamma per head, but has no feature map and no normaliser (o_t = q_t^T S_t, with a
    GroupNorm on each head's output); Mamba-2 (Dao & Gu, 2024) computes its decay from the input at every
    step, so this function is its case of a decay that does not depend on the input.
    ``gamma`` is a float in (0, 1] or one value per head, a tensor ``(H,)``. With ``gamma = 1`` it is
    :func:`linear_attention` with ``causal=True``.

    One function, three ways of computing it (``method``), equal up to rounding:

    * ``"parallel"``: attention with a decay mask, O(T^2 D): weights phi(Q) phi(K)^T times the matrix
      gamma^(i-j) (zero above the diagonal), each row divided by its sum (+ eps), times V;
    * ``"recurrent"``: the RNN above, one position at a time, O(T D Dv) and a state of fixed size
      (a Python loop: slow, but what a decoder does per generated token);
    * ``"chunkwise"`` (default): ``chunk_size`` positions at a time, parallel inside a chunk and recurrent
      between chunks: out = gamma^(r+1) phi(q_r)^T S_carried + the chunk's own decayed (Cs, Cs) block, and
      S_carried <- gamma^Cs S_carried + sum_j gamma^(Cs-1-j) phi(k_j) v_j^T; O(T Cs D) time.
    """
    B, H, T, S, D = _check_bhtd(q, k, v)
    _check_causal_lengths("decayed_linear_attention", q, k, True)
    if method not in DECAYED_METHODS:
        raise ValueError(f"method must be one of {DECAYED_METHODS}, got {method!r}")
    check_int("chunk_size", chunk_size, 1)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    g = _check_gamma(gamma, H, q)  # (1, H, 1, 1)
    log_g = torch.log(g)  # (1, H, 1, 1)
    fq, fk = elu_feature_map(q), elu_feature_map(k)  # (B, H, T, D)
    ones = v.new_ones(B, H, T, 1)  # (B, H, T, 1)
    v1 = torch.cat([v, ones], dim=-1)  # (B, H, T, Dv+1): the last column carries the normaliser z

    def normalise(o: torch.Tensor) -> torch.Tensor:  # (B, H, t, Dv+1) -> (B, H, t, Dv)
        return _safe_divide(o[..., :-1], o[..., -1:], eps)

    if method == "parallel":
        A = torch.matmul(fq, fk.transpose(-2, -1)) * _decay_matrix(log_g, T)  # (B, H, T, T)
        return normalise(torch.matmul(A, v1))  # (B, H, T, Dv)
    if method == "recurrent":
        state = q.new_zeros(B, H, D, v1.shape[-1])  # (B, H, D, Dv+1) [S_t | z_t]
        outs = []
        for t in range(T):
            state = g * state + fk[:, :, t, :, None] * v1[:, :, t, None, :]  # (B, H, D, Dv+1)
            outs.append(torch.matmul(fq[:, :, t, None, :], state))  # (B, H, 1, Dv+1)
        return normalise(torch.cat(outs, dim=2))  # (B, H, T, Dv)
    state = q.new_zeros(B, H, D, v1.shape[-1])  # (B, H, D, Dv+1) carried between chunks
    outs = []
    for start in range(0, T, chunk_size):
        sl = slice(start, start + chunk_size)
        fq_c, fk_c, v_c = fq[:, :, sl], fk[:, :, sl], v1[:, :, sl]  # (B, H, Cs, D), (B, H, Cs, Dv+1)
        Cs = fq_c.shape[2]
        r = torch.arange(Cs, device=q.device, dtype=q.dtype)  # (Cs,)
        into = torch.exp(log_g * (r[:, None] + 1))  # (1, H, Cs, 1) gamma^(r+1): the carried state's weight
        out_c = into * torch.matmul(fq_c, state)  # (B, H, Cs, Dv+1)
        A = torch.matmul(fq_c, fk_c.transpose(-2, -1)) * _decay_matrix(log_g, Cs)  # (B, H, Cs, Cs)
        outs.append(normalise(out_c + torch.matmul(A, v_c)))  # (B, H, Cs, Dv)
        out_of = torch.exp(log_g * (Cs - 1 - r)[:, None])  # (1, H, Cs, 1) gamma^(Cs-1-j): key j at chunk end
        state = torch.exp(log_g * Cs) * state + torch.matmul((fk_c * out_of).transpose(-2, -1), v_c)
    return torch.cat(outs, dim=2)  # (B, H, T, Dv)


# ----------------------------------------------------------------------------- the delta rule


DELTA_METHODS = ("chunkwise", "recurrent")


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    """``x`` scaled to unit length along ``dim`` as the delta-rule kernels do it, ``x * rsqrt(sum(x^2) + eps)``:
    the eps inside the square root, as flash-linear-attention's ``l2norm`` and ``transformers``' Qwen3-Next
    (not ``F.normalize``'s ``x / max(|x|, eps)``, which differs for short vectors: a key of norm 4e-4 becomes
    a unit key there, and one of length 0.37 here)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_int("dim", dim, None)
    if isinstance(eps, bool) or not isinstance(eps, (float, int)) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def _per_step(name: str, x: float | torch.Tensor, B: int, H: int, T: int, like: torch.Tensor, low: float,
              high: float, what: str) -> torch.Tensor:
    """``x`` (a float, or a tensor that broadcasts to (B, H, T)) as a (B, H, T) tensor of like's dtype and
    device, every value in [low, high]."""
    if isinstance(x, bool) or not isinstance(x, (float, int, torch.Tensor)):
        raise TypeError(f"{name} must be a float or a (B, H, T) tensor, got {type(x).__name__} {x!r}")
    if isinstance(x, torch.Tensor) and not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    t = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    try:
        t = torch.broadcast_to(t, (B, H, T))  # (B, H, T)
    except RuntimeError:
        raise ValueError(f"{name} must be a float or broadcast to (B, H, T) = ({B}, {H}, {T}), "
                         f"got shape {shape_str(t)}") from None
    if not bool(((t >= low) & (t <= high)).all()):
        raise ValueError(f"{name} must be in [{low}, {high}] ({what}), got values from {t.min().item()} "
                         f"to {t.max().item()}")
    return t

def _delta_initial_state(initial_state: torch.Tensor | None, q: torch.Tensor, B: int, H: int, D: int,
                         Dv: int) -> torch.Tensor:
    """The delta rules' starting state (B, H, D, Dv): zeros, or ``initial_state`` checked against q's sizes and dtype."""
    if initial_state is None:
        return q.new_zeros(B, H, D, Dv)  # (B, H, D, Dv)
    if not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"initial_state must be a torch.Tensor or None, got {type(initial_state).__name__}")
    if initial_state.shape != (B, H, D, Dv):
        raise ValueError(f"initial_state must be (B, H, D, Dv) = ({B}, {H}, {D}, {Dv}), "
                         f"got shape {shape_str(initial_state)}")
    if initial_state.dtype != q.dtype:
        raise TypeError(f"initial_state must have q's dtype {q.dtype}, got {initial_state.dtype}")
    return initial_state


@overload
def delta_rule_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float | torch.Tensor, *,
    gate: float | torch.Tensor | None = ..., method: str = ..., chunk_size: int = ..., scale: float | None = ...,
    use_qk_l2norm: bool = ..., initial_state: torch.Tensor | None = ..., output_final_state: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def delta_rule_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float | torch.Tensor, *,
    gate: float | torch.Tensor | None = ..., method: str = ..., chunk_size: int = ..., scale: float | None = ...,
    use_qk_l2norm: bool = ..., initial_state: torch.Tensor | None = ..., output_final_state: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def delta_rule_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float | torch.Tensor, *,
    gate: float | torch.Tensor | None = ..., method: str = ..., chunk_size: int = ..., scale: float | None = ...,
    use_qk_l2norm: bool = ..., initial_state: torch.Tensor | None = ..., output_final_state: bool = ...,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def delta_rule_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: float | torch.Tensor,
    *,
    gate: float | torch.Tensor | None = None,
    method: str = "chunkwise",
    chunk_size: int = 64,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Causal linear attention whose fixed-size memory overwrites: the delta rule (DeltaNet, Schlag et al.,
    2021; chunkwise training, Yang et al., 2024), and with ``gate`` the gated delta rule (Gated DeltaNet,
    Yang et al., 2025; the linear layers of Qwen3-Next; Kimi Linear's KDA gives each key channel its own
    decay, a finer gate than this one per head and step). T == S. Per step t, with the state S a (D, Dv)
    matrix per head, as in :func:`decayed_linear_attention`::

        S' = alpha_t S_{t-1}                              decay (alpha_t = 1 without a gate)
        u_t = beta_t (v_t - S'^T k_t)                     what S' misses of v_t, times the write strength
        S_t = S' + k_t u_t^T                              write only that correction
        out_t = S_t^T (scale q_t)

    Plain linear attention adds k_t v_t^T whatever the state already holds for k_t; the delta rule first
    reads what it holds (S'^T k_t) and writes the difference. With a unit key and ``beta_t = 1``, reading
    k_t afterwards gives exactly v_t: the old value is overwritten, not mixed in. In matrix form
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, a step of gradient descent on
    |S^T k_t - v_t|^2 / 2 with learning rate beta_t.

    This is the rule inside a Gated DeltaNet layer, not the layer. What Qwen3-Next's layer
    (``Qwen3NextGatedDeltaNet`` in ``transformers``) adds around it, and this function leaves to its caller:
    the input projections (``in_proj_qkvz``, ``in_proj_ba``); a short causal depthwise convolution (kernel 4)
    with SiLU over q, k and v; more value heads than key heads (32 of 128 dims against 16 key heads; q and k are
    repeated to the value heads with ``repeat_interleave``: call this with q and k already repeated, one H for
    all three); ``beta = sigmoid(b)``; the decay ``g = -exp(A_log) * softplus(a + dt_bias)``, passed here as
    ``gate=g.exp()``; the gated RMSNorm of each head's output, ``RMSNorm(o) * silu(z)``; and ``out_proj``.

    Args:
        q, k: ``(B, H, T, D)``; v: ``(B, H, T, Dv)``. The update is stable for unit keys: normalise them
            (and the queries) first, or pass ``use_qk_l2norm=True``, which does both (Qwen3-Next calls its
            kernels with ``use_qk_l2norm_in_kernel=True``).
        beta: the write strength, a float or a tensor broadcasting to ``(B, H, T)``, in [0, 2]. Models
            make it ``sigmoid(...)``, in (0, 1) (DeltaNet, Qwen3-Next); 0 writes nothing (a pure read);
            up to 2 the step ``I - beta k k^T`` still does not grow a unit key's direction (its eigenvalue
            ``1 - beta`` is in [-1, 1]; Grazzi et al., 2025, train with beta in (0, 2)).
        gate: the decay alpha_t, a float or a tensor broadcasting to ``(B, H, T)``, in [0, 1]; ``None``: no
            decay. Qwen3-Next's ``g`` is its log (``g = -exp(A_log) * softplus(a + dt_bias)``): pass
            ``gate=g.exp()``. 0 forgets everything (taken as the smallest positive float of the dtype).
        method: ``"recurrent"`` (the loop above, one position at a time: what a decoder runs per token) or
            ``"chunkwise"`` (default): ``chunk_size`` positions at a time. Inside a chunk the writes u_r
            depend on each other only through a unit lower-triangular system, solved for all chunks at
            once; the loop then takes one step per chunk. This is the WY representation of the chunk's
            product of Householder-like factors ``I - beta_r k_r k_r^T`` (Yang et al., 2024, "Parallelizing
            Linear Transformers with the Delta Rule over Sequence Length"), with the triangular inverse
            ``(I + A)^-1`` of the UT transform (Joffrain et al., 2006), here a triangular solve.
        scale: queries are multiplied by it; default ``1 / sqrt(D)``, as Qwen3-Next (after the l2 norm).
        use_qk_l2norm: scale q and k to unit length first with :func:`l2norm` (the eps inside the square
            root, as fla's and ``transformers``' kernels).
        initial_state: the state before position 0, ``(B, H, D, Dv)``; default zeros.
        output_final_state: also return the state after the last position.

    float16 and bfloat16 inputs are computed in float32 (as fla's kernels and ``transformers``' reference
    do): the output comes back in the input dtype, the final state in float32 (the state a decoder carries
    to the next step); ``initial_state`` may then be float32 or the input dtype.

    Returns:
        the output ``(B, H, T, Dv)``, and with ``output_final_state=True`` the tuple (output, final state
        ``(B, H, D, Dv)``).

    The chunkwise form, for one chunk of positions r = 0 .. Cs-1 entered with state S_0, where
    gamma_r = alpha_0 ... alpha_r (the decay from the chunk's start) and gamma_r / gamma_j the decay from j
    to r: unrolling the recurrence gives
    u_r = beta_r v_r - beta_r gamma_r S_0^T k_r - sum_{j<r} beta_r (gamma_r / gamma_j) (k_r . k_j) u_j, i.e.
    (I + A) U = diag(beta) V - diag(beta gamma) K S_0 with A strictly lower triangular, A_rj =
    beta_r (gamma_r / gamma_j) k_r . k_j. So U = W_v - W_k S_0 with W_v = (I + A)^-1 diag(beta) V and
    W_k = (I + A)^-1 diag(beta gamma) K, which need no S_0: one triangular solve per chunk, all chunks in
    parallel. Then, chunk after chunk: U = W_v - W_k S_0; out_r = gamma_r S_0^T q_r +
    sum_{j<=r} (gamma_r / gamma_j)(q_r . k_j) u_j; S_0 <- gamma_last S_0 + sum_j (gamma_last / gamma_j) k_j u_j^T.
    O(T Cs (D + Dv) + T D Dv) time, a Python loop of T / Cs steps instead of T. A T that is not a multiple
    of ``chunk_size`` is padded with steps that write nothing (beta = 0) and do not decay (alpha = 1).
    """
    check_bool("use_qk_l2norm", use_qk_l2norm)
    check_bool("output_final_state", output_final_state)
    B, H, T, S, D = _check_bhtd(q, k, v)
    _check_causal_lengths("delta_rule_attention", q, k, True)
    if q.dtype in (torch.float16, torch.bfloat16):  # computed in float32, as fla and transformers do
        if initial_state is not None and isinstance(initial_state, torch.Tensor) and initial_state.dtype == q.dtype:
            initial_state = initial_state.float()
        beta32 = beta.float() if isinstance(beta, torch.Tensor) else beta
        gate32 = gate.float() if isinstance(gate, torch.Tensor) else gate
        out32, state32 = delta_rule_attention(
            q.float(), k.float(), v.float(), beta32, gate=gate32, method=method, chunk_size=chunk_size,
            scale=scale, use_qk_l2norm=use_qk_l2norm, initial_state=initial_state, output_final_state=True)
        check_bool("output_final_state", output_final_state)
        return (out32.to(q.dtype), state32) if output_final_state else out32.to(q.dtype)
    if method not in DELTA_METHODS:
        raise ValueError(f"method must be one of {DELTA_METHODS}, got {method!r}")
    chunk_size = check_int("chunk_size", chunk_size, 1)
    scale = check_scale(scale, D)
    Dv = v.shape[-1]
    b = _per_step("beta", beta, B, H, T, q, 0.0, 2.0, "the write strength")  # (B, H, T)
    if gate is None:
        log_a = q.new_zeros(B, H, T)  # (B, H, T) log alpha = 0: no decay
    else:
        a = _per_step("gate", gate, B, H, T, q, 0.0, 1.0, "the decay alpha")  # (B, H, T)
        log_a = torch.log(a.clamp_min(torch.finfo(q.dtype).tiny))  # (B, H, T), finite
    state = _delta_initial_state(initial_state, q, B, H, D, Dv)  # (B, H, D, Dv)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)  # (B, H, T, D) unit rows (eps inside the root, as fla and transformers)
    q = q * scale  # (B, H, T, D)

    if method == "recurrent":
        alpha = log_a.exp()[..., None, None]  # (B, H, T, 1, 1)
        outs = []
        # one position at a time; unbind once (indexing step t would make autograd zero-fill a full gradient)
        steps = zip(q[:, :, :, None].unbind(2), k[:, :, :, None].unbind(2), v[:, :, :, None].unbind(2),
                    alpha.unbind(2), b[..., None, None].unbind(2))
        for q_t, k_t, v_t, alpha_t, beta_t in steps:  # (B, H, 1, D), (B, H, 1, D), (B, H, 1, Dv), (B, H, 1, 1) x2
            state = alpha_t * state  # (B, H, D, Dv)
            read = torch.matmul(k_t, state)  # (B, H, 1, Dv) what the state holds for k_t
            u = beta_t * (v_t - read)  # (B, H, 1, Dv) the correction
            state = state + k_t.transpose(-2, -1) * u  # (B, H, D, Dv) rank-one write
            outs.append(torch.matmul(q_t, state))  # (B, H, 1, Dv)
        out = torch.cat(outs, dim=2)  # (B, H, T, Dv)
        return (out, state) if output_final_state else out

    Cs = min(chunk_size, T)
    nc = -(-T // Cs)  # number of chunks
    pad = nc * Cs - T
    # padding steps: zero q, k, v, beta = 0 (no write) and log alpha = 0 (no decay)
    qc = F.pad(q, (0, 0, 0, pad)).view(B, H, nc, Cs, D)  # (B, H, nc, Cs, D)
    kc = F.pad(k, (0, 0, 0, pad)).view(B, H, nc, Cs, D)  # (B, H, nc, Cs, D)
    vc = F.pad(v, (0, 0, 0, pad)).view(B, H, nc, Cs, Dv)  # (B, H, nc, Cs, Dv)
    bc = F.pad(b, (0, pad)).view(B, H, nc, Cs, 1)  # (B, H, nc, Cs, 1)
    kb = kc * bc  # (B, H, nc, Cs, D) beta_r k_r
    kk = torch.matmul(kb, kc.transpose(-2, -1))  # (B, H, nc, Cs, Cs) beta_r k_r . k_j
    qk = torch.matmul(qc, kc.transpose(-2, -1))  # (B, H, nc, Cs, Cs) q_r . k_j
    if gate is None:  # gamma = 1 everywhere
        lower = kk  # only its strict lower triangle is read (unitriangular solve)
        scores = qk.tril()  # (B, H, nc, Cs, Cs) j <= r
        kg, q_in, k_out, chunk_decay = kb, qc, kc.transpose(-2, -1), None  # k_out (B, H, nc, D, Cs)
    else:
        cum = F.pad(log_a, (0, pad)).view(B, H, nc, Cs).cumsum(dim=-1)  # (B, H, nc, Cs) log gamma_r
        causal = torch.ones(Cs, Cs, dtype=torch.bool, device=q.device).tril()  # (Cs, Cs) j <= r
        log_ratio = cum[..., :, None] - cum[..., None, :]  # (B, H, nc, Cs, Cs) log(gamma_r / gamma_j)
        decay = log_ratio.masked_fill(~causal, -math.inf).exp()  # (B, H, nc, Cs, Cs), 0 above the diagonal
        gamma = cum.exp()[..., None]  # (B, H, nc, Cs, 1) gamma_r <= 1
        lower = kk * decay  # (B, H, nc, Cs, Cs)
        scores = qk * decay  # (B, H, nc, Cs, Cs) (gamma_r / gamma_j) q_r . k_j
        kg = kb * gamma  # (B, H, nc, Cs, D) beta_r gamma_r k_r
        q_in = qc * gamma  # (B, H, nc, Cs, D) reads the carried state, decayed to r
        to_end = (cum[..., -1:] - cum).exp()[..., None]  # (B, H, nc, Cs, 1) gamma_last / gamma_j <= 1
        k_out = (kc * to_end).transpose(-2, -1)  # (B, H, nc, D, Cs) writes, decayed to the chunk's end
        chunk_decay = cum[..., -1].exp()[..., None, None]  # (B, H, nc, 1, 1) gamma_last
    # (I + A)^-1 [diag(beta) V | diag(beta gamma) K], A the strict lower triangle of `lower`
    w = torch.linalg.solve_triangular(lower, torch.cat([vc * bc, kg], dim=-1), upper=False,
                                      unitriangular=True)  # (B, H, nc, Cs, Dv + D)
    w_v, w_k = w.split([Dv, D], dim=-1)  # (B, H, nc, Cs, Dv), (B, H, nc, Cs, D)

    outs = []
    # unbind once: indexing chunk c inside the loop would make autograd zero-fill a full-size gradient per use
    per_chunk = zip(w_v.unbind(2), w_k.unbind(2), q_in.unbind(2), scores.unbind(2), k_out.unbind(2))
    for c, (w_v_c, w_k_c, q_in_c, scores_c, k_out_c) in enumerate(per_chunk):
        if c == 0 and initial_state is None:  # an empty state: nothing to read or to correct for
            u = w_v_c  # (B, H, Cs, Dv)
            outs.append(torch.matmul(scores_c, u))  # (B, H, Cs, Dv)
            state = torch.matmul(k_out_c, u)  # (B, H, D, Dv)
            continue
        u = w_v_c - torch.matmul(w_k_c, state)  # (B, H, Cs, Dv) the chunk's corrections
        outs.append(torch.matmul(q_in_c, state) + torch.matmul(scores_c, u))  # (B, H, Cs, Dv)
        if chunk_decay is not None:
            state = chunk_decay[:, :, c] * state  # (B, H, D, Dv)
        state = state + torch.matmul(k_out_c, u)  # (B, H, D, Dv)
    out = torch.cat(outs, dim=2)[:, :, :T]  # (B, H, T, Dv)
    return (out, state) if output_final_state else out


# ----------------------------------------------------------------------------- Kimi Delta Attention


_KDA_SUBCHUNK = 16  # positions of one sub-chunk in kimi_delta_attention's chunkwise form


def _log_decay(g: float | torch.Tensor, B: int, H: int, T: int, D: int, like: torch.Tensor) -> torch.Tensor:
    """``g`` (a float, or a tensor that broadcasts to (B, H, T, D)), the log of a per-channel decay, as a
    (B, H, T, D) tensor of like's dtype and device, every value <= 0 (-inf: forget, taken as the log of the
    dtype's smallest positive float)."""
    if isinstance(g, bool) or not isinstance(g, (float, int, torch.Tensor)):
        raise TypeError(f"g must be a float or a (B, H, T, D) tensor, got {type(g).__name__} {g!r}")
    if isinstance(g, torch.Tensor) and not g.dtype.is_floating_point:
        raise TypeError(f"g must be a floating-point tensor, got {g.dtype}")
    t = torch.as_tensor(g, dtype=like.dtype, device=like.device)
    try:
        t = torch.broadcast_to(t, (B, H, T, D))  # (B, H, T, D)
    except RuntimeError:
        raise ValueError(f"g must be a float or broadcast to (B, H, T, D) = ({B}, {H}, {T}, {D}), "
                         f"got shape {shape_str(t)}") from None
    if not bool((t <= 0).all()):  # NaN fails too
        raise ValueError(f"g must be <= 0 (the log of a decay alpha in (0, 1]), got values from {t.min().item()} "
                         f"to {t.max().item()}")
    return t.clamp_min(math.log(torch.finfo(like.dtype).tiny))  # (B, H, T, D), finite


def _decayed_scores(xs: Sequence[torch.Tensor], y: torch.Tensor, cum: torch.Tensor) -> list[torch.Tensor]:
    """For each x of ``xs``, ``sum_c x_rc y_jc exp(cum_rc - cum_jc)`` for ``j <= r`` and 0 above the diagonal:
    ``(..., Cs, Cs)`` from x, y and ``cum`` ``(..., Cs, D)``, with ``cum`` non-increasing along Cs (a cumulative log
    decay), never exponentiating a positive number. The decays are computed once for all of ``xs``.

    Factoring the decay as ``(x_r exp(cum_r)) . (y_j exp(-cum_j))`` would turn the whole matrix into one
    product but overflows: ``exp(-cum_j)`` is 1 / (the decay since the chunk's start), e^320 after 64 steps of
    alpha = e^-5. So the Cs positions are cut into sub-chunks of ``_KDA_SUBCHUNK``: for the rows of sub-chunk a,
    with ``ref`` the cumulative decay just before a, ``exp(cum_r - ref)`` and ``exp(ref - cum_j)`` are both <= 1
    for every earlier key j (one matrix product per sub-chunk), and the pairs inside a sub-chunk take their
    decays ``exp(cum_r - cum_j)`` one by one, a (Cb, Cb, D) tensor per sub-chunk (Cb = _KDA_SUBCHUNK)."""
    *lead, Cs, D = y.shape
    Cb = min(_KDA_SUBCHUNK, Cs)
    ns = -(-Cs // Cb)  # number of sub-chunks
    p = ns * Cb - Cs
    # padding positions: zero x and y, cum held at its last value (steps that neither decay nor count)
    y = F.pad(y, (0, 0, 0, p))  # (..., ns*Cb, D)
    cum = torch.cat([cum, cum[..., -1:, :].expand(*lead, p, D)], dim=-2)  # (..., ns*Cb, D)
    yb, cb = y.reshape(*lead, ns, Cb, D), cum.reshape(*lead, ns, Cb, D)  # (..., ns, Cb, D)
    # ref of sub-chunk a: cum at its previous position (0 before the first: no decay at the chunk's start)
    ref = torch.cat([torch.zeros_like(cb[..., :1, -1:, :]), cb[..., :-1, -1:, :]], dim=-3)  # (..., ns, 1, D)
    into = (cb - ref).exp()  # (..., ns, Cb, D) decay from ref to r: <= 1
    # every key decayed from j to each sub-chunk's ref; only j before the sub-chunk is kept, the rest is clamped
    # (its exponent would be positive) and masked below
    y_out = y[..., None, :, :] * (ref - cum[..., None, :, :]).clamp_max(0).exp()  # (..., ns, ns*Cb, D)
    starts = torch.arange(ns, device=y.device) * Cb  # (ns,) each sub-chunk's first position
    before = torch.arange(ns * Cb, device=y.device)[None, :] < starts[:, None]  # (ns, ns*Cb) key j before a
    # inside a sub-chunk: each pair's decays exp(cum_r - cum_j) (j <= r), 0 above the diagonal
    tri = torch.ones(Cb, Cb, dtype=torch.bool, device=y.device).tril()  # (Cb, Cb) j <= r
    diff = (cb[..., :, None, :] - cb[..., None, :, :]).masked_fill(~tri[:, :, None], -math.inf)  # (.., ns, Cb, Cb, D)
    y_in = yb[..., None, :, :] * diff.exp()  # (..., ns, Cb, Cb, D) key j decayed to row r, inside a sub-chunk
    same = torch.eye(ns, dtype=y.dtype, device=y.device)[:, None, :, None]  # (ns, 1, ns, 1) sub-chunk a's own
    out = []
    for x in xs:
        xb = F.pad(x, (0, 0, 0, p)).reshape(*lead, ns, Cb, D)  # (..., ns, Cb, D)
        band = torch.matmul(xb * into, y_out.transpose(-2, -1))  # (..., ns, Cb, ns*Cb)
        band = band * before[:, None, :].to(band.dtype)  # (..., ns, Cb, ns*Cb) keys before the sub-chunk
        inside = (xb[..., :, None, :] * y_in).sum(-1)  # (..., ns, Cb, Cb)
        full = band.view(*lead, ns, Cb, ns, Cb) + inside[..., :, :, None, :] * same  # (..., ns, Cb, ns, Cb)
        out.append(full.reshape(*lead, ns * Cb, ns * Cb)[..., :Cs, :Cs])  # (..., Cs, Cs)
    return out


@overload
def kimi_delta_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: float | torch.Tensor, beta: float | torch.Tensor, *,
    method: str = ..., chunk_size: int = ..., scale: float | None = ..., use_qk_l2norm: bool = ...,
    initial_state: torch.Tensor | None = ..., output_final_state: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def kimi_delta_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: float | torch.Tensor, beta: float | torch.Tensor, *,
    method: str = ..., chunk_size: int = ..., scale: float | None = ..., use_qk_l2norm: bool = ...,
    initial_state: torch.Tensor | None = ..., output_final_state: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def kimi_delta_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: float | torch.Tensor, beta: float | torch.Tensor, *,
    method: str = ..., chunk_size: int = ..., scale: float | None = ..., use_qk_l2norm: bool = ...,
    initial_state: torch.Tensor | None = ..., output_final_state: bool = ...,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def kimi_delta_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: float | torch.Tensor,
    beta: float | torch.Tensor,
    *,
    method: str = "chunkwise",
    chunk_size: int = 64,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Kimi Delta Attention (KDA; Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient Attention
    Architecture"): the gated delta rule of :func:`delta_rule_attention` with a decay per key channel instead of
    one per head. T == S. Per step t, with the state S a (D, Dv) matrix per head and alpha_t = exp(g_t) in
    (0, 1]^D::

        S' = Diag(alpha_t) S_{t-1}                        row c of the state fades by alpha_t[c]
        u_t = beta_t (v_t - S'^T k_t)                     what S' misses of v_t, times the write strength
        S_t = S' + k_t u_t^T                              write only that correction
        out_t = S_t^T (scale q_t)

    i.e. S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T. With g the same in every channel
    it is :func:`delta_rule_attention` with ``gate=exp(g)``; with g = 0 (no decay) the plain delta rule.

    This is the rule inside a KDA layer, not the layer. What ``KimiLinearDeltaAttention`` in ``transformers``
    adds around it: the q, k, v projections and a short causal depthwise convolution (kernel 4) with SiLU over
    them; ``beta = sigmoid(b_proj(x))``, one per head; the decay ``g = -exp(A_log) * softplus(f_b_proj(f_a_proj(x))
    + dt_bias)`` (``KimiLinearForgetGate``: a low-rank projection to one value per head and channel, A_log one per
    head), passed here as ``g``; its kernels run with ``use_qk_l2norm_in_kernel=True``; a gated RMSNorm of each
    head's output, ``RMSNorm(o) * sigmoid(z)`` with z from a low-rank projection (``g_a_proj``, ``g_b_proj``); and
    ``o_proj``. (``tests/test_kda.py`` rebuilds a tiny layer's forward pass from those parts around this function.)

    Args:
        q, k: ``(B, H, T, D)``; v: ``(B, H, T, Dv)``. Unit keys keep the update stable: pass
            ``use_qk_l2norm=True`` (:func:`l2norm` on q and k, as Kimi Linear) or normalise them first.
        g: the log of the decay, ``(B, H, T, D)`` or anything that broadcasts to it (a float: the same decay
            everywhere), every value <= 0, as ``transformers``' and fla's ``g``; -inf forgets the channel.
        beta: the write strength, a float or a tensor broadcasting to ``(B, H, T)``, in [0, 2]
            (:func:`delta_rule_attention` says why 2).
        method: ``"recurrent"`` (the loop above, one position at a time: what a decoder runs per token) or
            ``"chunkwise"`` (default, ``chunk_size`` positions at a time; below).
        scale: queries are multiplied by it; default ``1 / sqrt(D)``, as Kimi Linear (after the l2 norm).
        use_qk_l2norm: scale q and k to unit length first with :func:`l2norm`.
        initial_state: the state before position 0, ``(B, H, D, Dv)``; default zeros.
        output_final_state: also return the state after the last position.

    float16 and bfloat16 inputs are computed in float32 (as fla and ``transformers``): the output comes back in
    the input dtype, the final state in float32; ``initial_state`` may then be float32 or the input dtype.

    Returns:
        the output ``(B, H, T, Dv)``, and with ``output_final_state=True`` the tuple (output, final state
        ``(B, H, D, Dv)``).

    The chunkwise form is :func:`delta_rule_attention`'s (the WY representation: one unit lower-triangular
    solve per chunk, then one loop step per chunk) with the scalar decay ratio gamma_r / gamma_j replaced by a
    vector: with cum_r = g_0 + ... + g_r (per channel, from the chunk's start), the decay from j to r is
    exp(cum_r - cum_j) in (0, 1]^D, and it sits *inside* every dot product,
    A_rj = beta_r sum_c k_rc k_jc exp(cum_rc - cum_jc) and the scores sum_c q_rc k_jc exp(cum_rc - cum_jc).
    A scalar ratio comes out of the dot product as a factor on the (Cs, Cs) matrix (q_r . k_j) (the
    gated delta rule multiplies that matrix by a decay mask); a per-channel one does not, so these matrices are
    built from keys and queries rescaled by their cumulative decays, in log space and relative to a reference
    inside the chunk so that no factor exceeds 1 (sub-chunks of 16 positions; fla's ``chunk_kda`` also cuts
    its chunks into sub-chunks). The carried state is read with q_r * exp(cum_r) and k_r * exp(cum_r), and moves on as
    Diag(exp(cum_last)) S_0 + sum_j (k_j * exp(cum_last - cum_j)) u_j^T. A T that is not a multiple of
    ``chunk_size`` is padded with steps that write nothing (beta = 0) and do not decay (g = 0).
    """
    check_bool("use_qk_l2norm", use_qk_l2norm)
    check_bool("output_final_state", output_final_state)
    B, H, T, S, D = _check_bhtd(q, k, v)
    _check_causal_lengths("kimi_delta_attention", q, k, True)
    if q.dtype in (torch.float16, torch.bfloat16):  # computed in float32, as fla and transformers do
        if isinstance(initial_state, torch.Tensor) and initial_state.dtype == q.dtype:
            initial_state = initial_state.float()
        g32 = g.float() if isinstance(g, torch.Tensor) else g
        beta32 = beta.float() if isinstance(beta, torch.Tensor) else beta
        out32, state32 = kimi_delta_attention(
            q.float(), k.float(), v.float(), g32, beta32, method=method, chunk_size=chunk_size, scale=scale,
            use_qk_l2norm=use_qk_l2norm, initial_state=initial_state, output_final_state=True)
        return (out32.to(q.dtype), state32) if output_final_state else out32.to(q.dtype)
    if method not in DELTA_METHODS:
        raise ValueError(f"method must be one of {DELTA_METHODS}, got {method!r}")
    chunk_size = check_int("chunk_size", chunk_size, 1)
    scale = check_scale(scale, D)
    Dv = v.shape[-1]
    log_a = _log_decay(g, B, H, T, D, q)  # (B, H, T, D)
    b = _per_step("beta", beta, B, H, T, q, 0.0, 2.0, "the write strength")  # (B, H, T)
    state = _delta_initial_state(initial_state, q, B, H, D, Dv)  # (B, H, D, Dv)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)  # (B, H, T, D) unit rows (eps inside the root, as fla and transformers)
    q = q * scale  # (B, H, T, D)

    if method == "recurrent":
        alpha = log_a.exp()[..., None]  # (B, H, T, D, 1) one decay per row of the state
        outs = []
        # one position at a time; unbind once (indexing step t would make autograd zero-fill a full gradient)
        steps = zip(q[:, :, :, None].unbind(2), k[:, :, :, None].unbind(2), v[:, :, :, None].unbind(2),
                    alpha.unbind(2), b[..., None, None].unbind(2))
        for q_t, k_t, v_t, alpha_t, beta_t in steps:  # (B, H, 1, D) x2, (B, H, 1, Dv), (B, H, D, 1), (B, H, 1, 1)
            state = alpha_t * state  # (B, H, D, Dv) row c times alpha_t[c]
            read = torch.matmul(k_t, state)  # (B, H, 1, Dv) what the state holds for k_t
            u = beta_t * (v_t - read)  # (B, H, 1, Dv) the correction
            state = state + k_t.transpose(-2, -1) * u  # (B, H, D, Dv) rank-one write
            outs.append(torch.matmul(q_t, state))  # (B, H, 1, Dv)
        out = torch.cat(outs, dim=2)  # (B, H, T, Dv)
        return (out, state) if output_final_state else out

    Cs = min(chunk_size, T)
    nc = -(-T // Cs)  # number of chunks
    pad = nc * Cs - T
    # padding steps: zero q, k, v, beta = 0 (no write) and g = 0 (no decay)
    qc = F.pad(q, (0, 0, 0, pad)).view(B, H, nc, Cs, D)  # (B, H, nc, Cs, D)
    kc = F.pad(k, (0, 0, 0, pad)).view(B, H, nc, Cs, D)  # (B, H, nc, Cs, D)
    vc = F.pad(v, (0, 0, 0, pad)).view(B, H, nc, Cs, Dv)  # (B, H, nc, Cs, Dv)
    bc = F.pad(b, (0, pad)).view(B, H, nc, Cs, 1)  # (B, H, nc, Cs, 1)
    cum = F.pad(log_a, (0, 0, 0, pad)).view(B, H, nc, Cs, D).cumsum(dim=-2)  # (B, H, nc, Cs, D) log gamma_r
    # (B, H, nc, Cs, Cs) each: k_r . Diag(gamma_r / gamma_j) k_j and q_r . Diag(gamma_r / gamma_j) k_j, j <= r
    kk, scores = _decayed_scores((kc, qc), kc, cum)
    lower = bc * kk  # (B, H, nc, Cs, Cs) A_rj (only j < r is read)
    gamma = cum.exp()  # (B, H, nc, Cs, D) gamma_r <= 1, per channel
    kg = kc * bc * gamma  # (B, H, nc, Cs, D) beta_r gamma_r * k_r: reads the carried state
    q_in = qc * gamma  # (B, H, nc, Cs, D) reads the carried state, decayed to r
    k_out = (kc * (cum[..., -1:, :] - cum).exp()).transpose(-2, -1)  # (B, H, nc, D, Cs) writes decayed to the end
    chunk_decay = cum[..., -1, :].exp()[..., None]  # (B, H, nc, D, 1) gamma_last, per row of the state
    # (I + A)^-1 [diag(beta) V | diag(beta) (gamma * K)], A the strict lower triangle of `lower`
    w = torch.linalg.solve_triangular(lower, torch.cat([vc * bc, kg], dim=-1), upper=False,
                                      unitriangular=True)  # (B, H, nc, Cs, Dv + D)
    w_v, w_k = w.split([Dv, D], dim=-1)  # (B, H, nc, Cs, Dv), (B, H, nc, Cs, D)

    outs = []
    # unbind once: indexing chunk c inside the loop would make autograd zero-fill a full-size gradient per use
    per_chunk = zip(w_v.unbind(2), w_k.unbind(2), q_in.unbind(2), scores.unbind(2), k_out.unbind(2),
                    chunk_decay.unbind(2))
    for w_v_c, w_k_c, q_in_c, scores_c, k_out_c, decay_c in per_chunk:
        u = w_v_c - torch.matmul(w_k_c, state)  # (B, H, Cs, Dv) the chunk's corrections
        outs.append(torch.matmul(q_in_c, state) + torch.matmul(scores_c, u))  # (B, H, Cs, Dv)
        state = decay_c * state + torch.matmul(k_out_c, u)  # (B, H, D, Dv)
    out = torch.cat(outs, dim=2)[:, :, :T]  # (B, H, T, Dv)
    return (out, state) if output_final_state else out


def delta_rule_inputs(seq_len: int, *, batch_size: int = 1, num_heads: int = 2, head_dim: int = 32, seed: int = 0,
                      dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The inputs of :func:`delta_rule_attention` as a gated delta layer makes them, for timing and tests:
    ``{"q", "k", "v"}`` from :func:`make_inputs` (``(B, H, T, D)``), ``"beta"`` = sigmoid of a normal
    ``(B, H, T)`` and ``"gate"`` = exp(-softplus of a normal), in (0, 1), ``(B, H, T)``, all from a generator
    seeded with ``seed``. Unnormalised q, k: call with ``use_qk_l2norm=True``."""
    q, k, v = make_inputs(seq_len, batch_size=batch_size, num_heads=num_heads, head_dim=head_dim, seed=seed,
                          dtype=dtype)
    g = torch.Generator().manual_seed(seed + 1)
    beta = torch.randn(batch_size, num_heads, seq_len, generator=g, dtype=q.dtype).sigmoid()  # (B, H, T)
    gate = torch.exp(-F.softplus(torch.randn(batch_size, num_heads, seq_len, generator=g, dtype=q.dtype)))  # (B, H, T)
    return {"q": q, "k": k, "v": v, "beta": beta, "gate": gate}


def delta_rule_costs(
    t_values: Sequence[int] = (256, 512, 1024, 2048, 4096),
    *,
    methods: Sequence[str] = DELTA_METHODS,
    chunk_size: int = 64,
    rounds: int = 3,
    threads: int | None = 1,
    batch_size: int = 1,
    num_heads: int = 2,
    head_dim: int = 32,
    seed: int = 0,
) -> dict[tuple[str, int], float]:
    """Seconds per call of :func:`delta_rule_attention` (gated, ``use_qk_l2norm=True``) by each of
    ``methods`` at each T, on :func:`delta_rule_inputs`: ``{(method, T): seconds}``, the fastest of
    ``rounds`` interleaved rounds (:func:`attnbook.measure.time_calls` through
    :func:`attnbook.measure.cost_curves`), with ``threads`` torch threads (default 1; ``None`` keeps the
    current setting; restored afterwards)."""
    for m in methods:
        if m not in DELTA_METHODS:
            raise ValueError(f"methods must be among {DELTA_METHODS}, got {m!r}")
    check_int("chunk_size", chunk_size, 1)

    def calls_at(T: int) -> dict[tuple[str, int], Callable[[], object]]:
        x = delta_rule_inputs(check_int("T", T), batch_size=batch_size, num_heads=num_heads, head_dim=head_dim,
                              seed=seed)
        return {(m, T): functools.partial(delta_rule_attention, x["q"], x["k"], x["v"], x["beta"], gate=x["gate"],
                                          method=m, chunk_size=chunk_size, use_qk_l2norm=True) for m in methods}

    curves = cost_curves(calls_at, t_values, rounds=rounds, memory=False, threads=threads)
    return {key: entry["time_s"] for key, entry in curves.items()}
