"""Multi-head attention as an ``nn.Module``, batch-first.

Grouped-query attention (GQA) and multi-query attention (MQA) are the same
module with fewer key/value heads than query heads (``num_kv_heads``);
:func:`grouped_decode_attention` is the attention of a decoding step over such
a cache, written so that each key/value head is read once for its group.

Dimension legend:
    B  batch size
    H  number of query heads          (``num_heads``)
    Hkv number of key/value heads     (``num_kv_heads``; H for plain multi-head)
    G  query heads per key/value head (H / Hkv)
    T  query length,  S  key/value length
    D  head dimension (E // H)
    E  model dimension (``d_model``)

Masks are bool, True = may attend, broadcastable to (B, H, T, S); or float,
added to the scores. See :mod:`attnbook.core`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_int, check_module_inputs, check_prob, shape_str
from ._compat import SDPA_HAS_GQA, SDPA_SAFE_SOFTMAX
from .core import check_mask, check_scale, fully_masked_rows, masked_softmax, scaled_dot_product_attention

if TYPE_CHECKING:
    from .kvcache import KVCache

__all__ = ["MultiHeadAttention", "split_heads", "merge_heads", "grouped_decode_attention", "valid_kv_heads"]


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, E) -> (B, H, T, D), with D = E // H."""
    B, T, E = x.shape
    if E % num_heads:
        raise ValueError(f"last dim {E} is not divisible by num_heads={num_heads}")
    x = x.view(B, T, num_heads, E // num_heads)  # (B, T, H, D)
    return x.transpose(1, 2)  # (B, H, T, D)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B, T, H * D). ``contiguous`` is needed because the
    transpose leaves the memory in (B, H, T, D) order, which ``view`` can't merge."""
    B, H, T, D = x.shape
    x = x.transpose(1, 2).contiguous()  # (B, T, H, D)
    return x.view(B, T, H * D)  # (B, T, E)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate Q, K and V projections.

    Args:
        d_model: model dimension E.
        num_heads: number of query heads H; must divide ``d_model``.
        dropout: dropout on the attention weights (training only).
        bias: whether the four projections have a bias.
        num_kv_heads: number of key/value heads (grouped-query attention);
            must divide ``num_heads``. ``None`` means ``num_heads`` (plain
            multi-head attention); 1 is multi-query attention.
        kdim, vdim: widths of the key and value inputs when they differ from
            ``d_model`` (cross-attention from an encoder of another width).

    ``forward(query, key=None, value=None, mask=None)`` returns
    ``(out (B, T, E), weights (B, H, T, S))``; key defaults to query and value
    to key. With ``need_weights=False`` it takes PyTorch's fused kernel and
    returns ``(out, None)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
    ):
        super().__init__()
        check_int("d_model", d_model)
        check_int("num_heads", num_heads)
        if d_model % num_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}: "
                f"each head needs d_model / num_heads features"
            )
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_int("num_kv_heads", num_kv_heads, None)
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads!r} must be a positive divisor of num_heads={num_heads}")
        check_prob("dropout", dropout)
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q
        self.k_proj = nn.Linear(self.kdim, kv_width, bias=bias)  # W^K
        self.v_proj = nn.Linear(self.vdim, kv_width, bias=bias)  # W^V
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # Xavier-uniform on each of W^Q, W^K, W^V separately, zero biases; W^O keeps nn.Linear's default
        # weight (as torch's out_proj). A square (E, E) projection gets weight variance 2/(E + E) = 1/E, so
        # unit-variance inputs give q, k, v entries of variance about 1 and scaled scores q.k / sqrt(D) of
        # std about 1 (the setting of chapter 2's argument; with kdim or fewer kv heads: 2/(fan_in + fan_out)).
        # NOT the same as torch.nn.MultiheadAttention, which applies Xavier once to its fused (3E, E)
        # in_proj_weight: variance 2/(E + 3E) = 1/(2E), half ours, so entries of variance about 0.5 and scaled
        # scores of std about 0.5. Chapter 2 (section 2.4) measures both.
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(lin.weight)
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def extra_repr(self) -> str:
        kv = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        return f"d_model={self.d_model}, num_heads={self.num_heads}{kv}, head_dim={self.head_dim}, dropout={self.dropout}"

    def _check_input(self, name: str, x: torch.Tensor, width: int) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (B, length, {width}), got {x.dtype}")
        if x.dim() != 3 or x.shape[-1] != width:
            raise ValueError(f"{name} must be (B, length, {width}) (batch-first), got {shape_str(x)}")

    def project(
        self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three projections, split into heads: q (B, H, T, D), k and v (B, Hkv, S, D)."""
        key = query if key is None else key
        value = key if value is None else value
        self._check_input("query", query, self.d_model)
        self._check_input("key", key, self.kdim)
        self._check_input("value", value, self.vdim)
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key {shape_str(key)} and value {shape_str(value)} must share (B, S)")
        if query.shape[0] != key.shape[0]:
            raise ValueError(f"query {shape_str(query)} and key {shape_str(key)} must share the batch size B")
        check_module_inputs(self, query=query, key=key, value=value)
        q = split_heads(self.q_proj(query), self.num_heads)  # (B, H, T, D)
        k = split_heads(self.k_proj(key), self.num_kv_heads)  # (B, Hkv, S, D)
        v = split_heads(self.v_proj(value), self.num_kv_heads)  # (B, Hkv, S, D)
        return q, k, v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over already projected heads; returns (out (B, T, E), weights or None).

        With ``need_weights=False`` it takes PyTorch's fused kernel, except for a bool mask with a query
        row that allows no key (the explicit path guarantees that row's zero output on every backend)
        and, on a torch without :data:`attnbook._compat.SDPA_SAFE_SOFTMAX`, for any float mask (a fully
        blocked row would come out NaN)."""
        groups = self.num_heads // self.num_kv_heads
        p = self.dropout if self.training else 0.0
        if mask is not None:
            check_mask(mask, torch.Size((q.shape[0], self.num_heads, q.shape[2], k.shape[2])))
        if need_weights:
            use_fast = False
        elif mask is None:
            use_fast = True
        elif mask.dtype == torch.bool:
            use_fast = not bool(fully_masked_rows(mask).any())  # every query row keeps at least one key
        else:
            use_fast = SDPA_SAFE_SOFTMAX
        if use_fast and groups > 1 and SDPA_HAS_GQA:
            # fused kernel that reads each key/value head once for its whole group of query heads
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, enable_gqa=True)  # (B, H, T, D)
            return self.out_proj(merge_heads(out)), None
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)  # (B, H, S, D): query head h uses key/value head h // groups
            v = v.repeat_interleave(groups, dim=1)  # (B, H, S, D)
        if use_fast:
            # fused kernel; rows with every key masked take the explicit path below
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, H, T, D)
            weights = None
        else:
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p=p)  # (B, H, T, D)
            if not need_weights:
                weights = None
        return self.out_proj(merge_heads(out)), weights  # (B, T, E)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        need_weights: bool = True,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``cache`` (an :class:`attnbook.KVCache` or :class:`attnbook.StaticKVCache`) turns on incremental decoding for
        self-attention: only the new tokens in ``query`` are projected, their keys
        and values are appended to the cache, and the queries attend over
        everything cached. The mask then has S = cached + new keys (see
        ``causal_mask(T, S, offset=S - T)``); with a single new token none is needed."""
        unbatched = isinstance(query, torch.Tensor) and query.dim() == 2
        if unbatched:  # (T, E) -> (1, T, E)
            query = query.unsqueeze(0)
            key = None if key is None else key.unsqueeze(0)
            value = None if value is None else value.unsqueeze(0)
        q, k, v = self.project(query, key, value)  # q (B, H, T, D); k, v (B, Hkv, T_new, D)
        if cache is not None:
            if key is not None or value is not None:
                raise ValueError("a KV cache is for self-attention: pass only query (the new tokens)")
            k, v = cache.append(k, v)  # (B, Hkv, S, D), S = cached + new
        out, weights = self.attend(q, k, v, mask, need_weights)
        if unbatched:
            out = out.squeeze(0)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build one with the same weights as a ``torch.nn.MultiheadAttention``.

        The result (always batch-first) gives the same outputs and per-head
        weights as ``m(q, k, v, attn_mask=~mask, average_attn_weights=False)``
        (transposed when ``m`` is not batch-first).
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no counterpart in attnbook.MultiHeadAttention")
        E = m.embed_dim
        bias = m.in_proj_bias is not None
        new = cls(E, m.num_heads, dropout=m.dropout, bias=bias, kdim=m.kdim, vdim=m.vdim)
        new = new.to(device=m.out_proj.weight.device, dtype=m.out_proj.weight.dtype)
        with torch.no_grad():
            if m._qkv_same_embed_dim:
                wq, wk, wv = m.in_proj_weight.chunk(3, dim=0)
            else:
                wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
            new.q_proj.weight.copy_(wq)
            new.k_proj.weight.copy_(wk)
            new.v_proj.weight.copy_(wv)
            new.out_proj.weight.copy_(m.out_proj.weight)
            if bias:
                bq, bk, bv = m.in_proj_bias.chunk(3)
                new.q_proj.bias.copy_(bq)
                new.k_proj.bias.copy_(bk)
                new.v_proj.bias.copy_(bv)
                new.out_proj.bias.copy_(m.out_proj.bias)
        return new


def grouped_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of queries ``q (B, H, T, D)`` over cached keys and values
    ``(B, Hkv, S, D)`` with H = G * Hkv, query head h using key/value head
    h // G (as ``repeat_interleave(G, dim=1)``), no mask (in a decoding step the
    new token may see every cached one). Each key/value head is read once for
    its G query heads: the G * T queries of a group are stacked into one matrix
    product. Returns ``(B, H, T, D)``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (B, heads, length, D), got {type(x).__name__}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor (B, heads, length, D), got shape {shape_str(x)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % Hkv:
        raise ValueError(f"k and v must be (B, Hkv, S, D) with Hkv dividing H; got q {shape_str(q)}, "
                         f"k {shape_str(k)}, v {shape_str(v)}")
    G = H // Hkv
    qg = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D): the queries of one group, head by head
    scores = torch.matmul(qg * check_scale(None, D), k.transpose(-2, -1))  # (B, Hkv, G*T, S)
    out = masked_softmax(scores, inplace=True) @ v  # (B, Hkv, G*T, D)
    return out.reshape(B, H, T, D)  # (B, H, T, D)


def valid_kv_heads(num_heads: int) -> list[int]:
    """The numbers of key/value heads ``attnbook.MultiHeadAttention`` accepts for
    ``num_heads`` query heads: the divisors of ``num_heads``, smallest first."""
    check_int("num_heads", num_heads)
    return [h for h in range(1, num_heads + 1) if num_heads % h == 0]
