"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): MLA whose queries each read only the top-k keys that a
cheap "lightning indexer" picks.

Dimension legend (see :mod:`attnbook`; new letters marked *):
    B    batch size;  H  heads of the attention;  T  query length (new tokens);  S  key length (cached + new)
    E    model dimension (``d_model``);  Dcq  width of the compressed query (``q_lora_rank``)
    Dr   rotary width (``qk_rope_head_dim``), shared by the attention and the indexer
    Hi*  the indexer's heads (``index_n_heads``);  Di*  its head width (``index_head_dim``)
    k*   keys each query reads (``index_topk``, at most S)

The layer is chapter 12's :class:`attnbook.latent.MultiHeadLatentAttention` plus an indexer
(:class:`LightningIndexer`) with its own small projections:

1. **Indexer keys.** Every token gets one key of Di numbers, ``LayerNorm(W_k x)``, whose first Dr features are
   rotated by RoPE (half-split pairs ``(i, i + Dr/2)``, where the attention's own rope features pair neighbours),
   and cached beside the latent (:class:`IndexKeyCache`): Di more numbers per token and layer.
2. **Indexer queries** come from the attention's compressed query ``c_q = RMSNorm(W_DQ x)`` (Dcq), so they cost
   one ``Dcq -> Hi * Di`` product: Hi heads of Di, rotated the same way.
3. **Score.** ``I[t, s] = sum_h w_h(x_t) * ReLU(q_th . k_s / sqrt(Di))`` with per-token head weights
   ``w(x_t) = W_w x_t / sqrt(Hi)``: a few ReLU heads instead of H softmax heads, computed in float32.
4. **Selection.** Each query keeps the k keys of highest score among the keys its mask allows; its attention is
   MLA's, masked to those keys. The rest of the cache is stored but not read: a query reads ``min(k, allowed)``
   keys however long the context (:func:`keys_read`).

Weights are named as Hugging Face's ``DeepseekV32Attention`` (the MLA's names, and ``indexer.wq_b``,
``indexer.wk``, ``indexer.k_norm``, ``indexer.weights_proj``), so its state dict loads 1:1
(:meth:`SparseLatentAttention.from_hf`). DeepSeek's kernels rotate the indexer's queries and keys by a Hadamard
transform and score them in fp8; the transform is orthogonal (scores unchanged) and fp8 a precision choice, so
neither is done here (nor in ``transformers``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn

from ._checks import check_int, check_module_inputs, shape_str
from .latent import LatentKVCache, MultiHeadLatentAttention
from .positional import apply_rotary

__all__ = ["IndexKeyCache", "LightningIndexer", "SparseLatentAttention", "keys_read"]


class IndexKeyCache:
    """The indexer's cached keys, ``(B, S, Di)``, grown by :meth:`append` (the companion of a
    :class:`attnbook.latent.LatentKVCache`)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def append(self, k: torch.Tensor) -> torch.Tensor:
        """Append new keys ``(B, T, Di)``; returns all ``(B, S, Di)``."""
        if not isinstance(k, torch.Tensor) or k.dim() != 3:
            raise ValueError(f"indexer keys must be (B, T, Di), got {shape_str(k)}")
        if self.keys is not None and (k.shape[0], k.shape[2]) != (self.keys.shape[0], self.keys.shape[2]):
            raise ValueError(f"new indexer keys {shape_str(k)} do not match the cached {shape_str(self.keys)}")
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=1)  # (B, S, Di)
        return self.keys

    @property
    def nbytes(self) -> int:
        """Bytes held (as :attr:`attnbook.latent.LatentKVCache.nbytes`)."""
        return 0 if self.keys is None else self.keys.numel() * self.keys.element_size()


class LightningIndexer(nn.Module):
    """The indexer of DeepSeek Sparse Attention: Hi ReLU heads of width Di that score every (query, key) pair.

    Args:
        d_model: E.  q_lora_rank: Dcq, the width of the compressed query it reads.
        num_heads: Hi.  head_dim: Di.  rope_dim: Dr, the features of Di that RoPE rotates (even, <= Di).
    """

    def __init__(self, d_model: int, q_lora_rank: int, num_heads: int, head_dim: int, rope_dim: int) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        self.head_dim = check_int("head_dim", head_dim)
        self.rope_dim = check_int("rope_dim", rope_dim)
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"rope_dim must be even and <= head_dim={head_dim}, got {rope_dim}")
        self.wq_b = nn.Linear(check_int("q_lora_rank", q_lora_rank), num_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(d_model, num_heads, bias=False)
        self.softmax_scale = head_dim ** -0.5

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
        """RoPE on the first Dr features of ``x`` ``(..., T, Di)``, half-split pairs."""
        rot, rest = x.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        rot = apply_rotary(rot, positions, interleaved=False, inv_freq=inv_freq, attention_factor=factor)
        return torch.cat([rot, rest], dim=-1)

    def keys(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
        """Each token's indexer key ``(B, T, Di)``, rotated at ``positions`` ``(T,)`` or ``(B, T)``."""
        return self._rotate(self.k_norm(self.wk(x)), positions, inv_freq, factor)  # (B, T, Di)

    def scores(self, x: torch.Tensor, q_resid: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
               inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
        """The index score ``I (B, T, S)`` in float32 of the queries of ``x (B, T, E)`` (their compressed query
        ``q_resid (B, T, Dcq)``, at ``positions``) against ``keys (B, S, Di)``."""
        B, T, _ = x.shape
        q = self.wq_b(q_resid).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, Hi, T, Di)
        pos = positions[:, None, :] if positions.dim() == 2 else positions  # (B, 1, T) or (T,)
        q = self._rotate(q, pos, inv_freq, factor)  # (B, Hi, T, Di)
        s = torch.matmul(q.transpose(1, 2).float(), keys.transpose(-1, -2).float().unsqueeze(1))  # (B, T, Hi, S)
        s = torch.relu(s * self.softmax_scale)
        w = self.weights_proj(x).float() * self.num_heads ** -0.5  # (B, T, Hi)
        return torch.matmul(w.unsqueeze(-2), s).squeeze(-2)  # (B, T, S): sum_h w_h ReLU(q_h . k / sqrt(Di))


def _select(scores: torch.Tensor, allowed: torch.Tensor | None, topk: int) -> torch.Tensor:
    """Bool ``(B, 1, T, S)``, True at the ``topk`` highest ``scores (B, T, S)`` among the ``allowed`` keys."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    k = min(topk, scores.shape[-1])
    idx = scores.topk(k, dim=-1).indices  # (B, T, k)
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, idx, True)  # (B, T, S)
    if allowed is not None:
        chosen &= allowed  # fewer than k allowed keys: topk also returned blocked ones
    return chosen[:, None]  # (B, 1, T, S)


def keys_read(selected: torch.Tensor) -> torch.Tensor:
    """How many keys each query reads, ``(B, T)``, from a selection ``(B, 1, T, S)`` (as
    :meth:`SparseLatentAttention.forward` returns with ``need_selection=True``)."""
    if not isinstance(selected, torch.Tensor) or selected.dtype != torch.bool or selected.dim() != 4:
        raise ValueError(f"selected must be a bool (B, 1, T, S) tensor, got {shape_str(selected)}")
    return selected.sum(dim=-1)[:, 0]  # (B, T)


class SparseLatentAttention(MultiHeadLatentAttention):
    """DeepSeek Sparse Attention: :class:`attnbook.latent.MultiHeadLatentAttention` (with a compressed query)
    plus a :class:`LightningIndexer` (``index_num_heads`` Hi, ``index_head_dim`` Di) that keeps ``index_topk``
    keys per query. The other arguments are MLA's.

    ``forward(x, positions=None, mask=None, *, cache=None, index_cache=None, need_weights=False,
    need_selection=False)`` returns ``(out (B, T, E), weights (B, H, T, S) or None, selected (B, 1, T, S) or
    None)``.
    """

    def __init__(self, d_model: int, num_heads: int, *, q_lora_rank: int, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, index_num_heads: int, index_head_dim: int,
                 index_topk: int, rope_base: float = 10000.0, rope_scaling: dict[str, Any] | None = None,
                 attention_bias: bool = False, rms_norm_eps: float = 1e-6) -> None:
        if q_lora_rank is None:
            raise ValueError("DeepSeek Sparse Attention's indexer reads the compressed query: q_lora_rank is needed")
        super().__init__(d_model, num_heads, q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
                         qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=qk_rope_head_dim,
                         v_head_dim=v_head_dim, rope_base=rope_base, rope_scaling=rope_scaling,
                         rope_interleave=True, attention_bias=attention_bias, rms_norm_eps=rms_norm_eps)
        self.index_topk = check_int("index_topk", index_topk)
        self.indexer = LightningIndexer(d_model, q_lora_rank, index_num_heads, index_head_dim, qk_rope_head_dim)
        # the indexer's RoPE: the attention's frequencies over Dr, half-split pairs
        self._index_rope = (self.rope_inv_freq, self.rope_attention_factor)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        positions: torch.Tensor | Sequence[float] | None = None,
        mask: torch.Tensor | None = None,
        *,
        cache: LatentKVCache | None = None,
        index_cache: IndexKeyCache | None = None,
        need_weights: bool = False,
        need_selection: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Sparse self-attention of ``x (B, T, E)``.

        Args:
            x: the new tokens' inputs.  positions: ``(T,)`` or ``(B, T)``; default ``len(cache) + arange(T)``.
            mask: bool, True = may attend, broadcastable to ``(B, 1, T, S)`` (one mask for every head: the
                indexer chooses among the allowed keys; a prompt needs ``causal_mask(T, S, offset=S - T)``).
            cache, index_cache: a :class:`LatentKVCache` and an :class:`IndexKeyCache`, both or neither; the new
                tokens' latents and indexer keys are appended and the queries attend over all S.
            need_weights: return the attention weights.  need_selection: return which keys each query read.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}) (batch-first), got {shape_str(x)}")
        check_module_inputs(self, x=x)
        if (cache is None) != (index_cache is None):
            raise ValueError("pass cache and index_cache together (the latents and the indexer's keys), or neither")
        if cache is not None and not isinstance(cache, LatentKVCache):
            raise TypeError(f"cache must be a LatentKVCache, got {type(cache).__name__}")
        if index_cache is not None and not isinstance(index_cache, IndexKeyCache):
            raise TypeError(f"index_cache must be an IndexKeyCache, got {type(index_cache).__name__}")
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool):
            raise TypeError(f"mask must be a bool tensor (True = may attend), got {shape_str(mask)}")
        B, T, _ = x.shape
        q_pos, k_pos = self._positions(positions, B, T, 0 if cache is None else len(cache), x.device)
        assert self.q_a_proj is not None and self.q_a_layernorm is not None
        q_resid = self.q_a_layernorm(self.q_a_proj(x))  # (B, T, Dcq)
        q_nope, q_rope = self.queries(x, q_pos)  # (B, H, T, Dn), (B, H, T, Dr)
        c_kv, k_rope = self.latents(x, k_pos)  # (B, T, Dc), (B, T, Dr)
        inv_freq, factor = self._index_rope
        k_index = self.indexer.keys(x, k_pos, inv_freq, factor)  # (B, T, Di)
        if cache is None or index_cache is None:
            latent = torch.cat([c_kv, k_rope], dim=-1)  # (B, S, Dc + Dr), S = T
            keys = k_index
        else:
            cache.append(c_kv, k_rope)
            assert cache.latent is not None
            latent = cache.latent  # (B, S, Dc + Dr)
            keys = index_cache.append(k_index)  # (B, S, Di)
        S = latent.shape[1]
        allowed = None
        if mask is not None:
            try:
                allowed = mask.expand(B, 1, T, S)[:, 0]  # (B, T, S)
            except RuntimeError as err:
                raise ValueError(f"mask {shape_str(mask)} does not broadcast to (B, 1, T, S) = ({B}, 1, {T}, {S})") from err
        scores = self.indexer.scores(x, q_resid, keys, k_pos if k_pos.dim() == 2 else q_pos, inv_freq, factor)
        selected = _select(scores, allowed, self.index_topk)  # (B, 1, T, S)
        out, weights = self.attend_naive(q_nope, q_rope, latent, selected)
        return out, (weights if need_weights else None), (selected if need_selection else None)

    @classmethod
    def from_hf(cls, module: nn.Module) -> SparseLatentAttention:
        """A copy of a Hugging Face ``transformers`` ``DeepseekV32Attention`` (same weights, device and dtype);
        plain RoPE only (another ``rope_type`` raises a ``ValueError``)."""
        try:
            hf = importlib.import_module("transformers.models.deepseek_v32.modeling_deepseek_v32")
            expected: type | None = hf.DeepseekV32Attention
        except ImportError:
            expected = None
        if expected is None or not isinstance(module, expected):
            raise TypeError(f"from_hf expects a transformers DeepseekV32Attention, got {type(module).__name__}")
        hf_attn: Any = module
        config: Any = hf_attn.config
        rope = dict(getattr(config, "rope_parameters", None) or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"only plain RoPE is copied, got rope_type {rope.get('rope_type')!r}")
        new = cls(config.hidden_size, config.num_attention_heads, q_lora_rank=config.q_lora_rank,
                  kv_lora_rank=config.kv_lora_rank, qk_nope_head_dim=config.qk_nope_head_dim,
                  qk_rope_head_dim=config.qk_rope_head_dim, v_head_dim=config.v_head_dim,
                  index_num_heads=config.index_n_heads, index_head_dim=config.index_head_dim,
                  index_topk=config.index_topk, rope_base=float(rope.get("rope_theta", 10000.0)),
                  attention_bias=bool(config.attention_bias), rms_norm_eps=float(hf_attn.kv_a_layernorm.variance_epsilon))
        assert new.q_a_layernorm is not None
        new.q_a_layernorm.eps = float(hf_attn.q_a_layernorm.variance_epsilon)
        weight = hf_attn.kv_b_proj.weight
        new = new.to(device=weight.device, dtype=weight.dtype)
        new.load_state_dict(module.state_dict(), strict=True)
        return new
