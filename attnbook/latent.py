"""Multi-head latent attention (MLA, DeepSeek-V2 and V3): a KV cache of one small vector per token.

Dimension legend (new letters marked *):
    B    batch size
    H    number of heads (``num_heads``)
    T    query length (new tokens);  S  key/value length (cached + new)
    E    model dimension (``d_model``, Hugging Face's ``hidden_size``)
    Dn*  per-head query/key width without position (``qk_nope_head_dim``)
    Dr*  per-head query width, and shared key width, that RoPE rotates (``qk_rope_head_dim``)
    D    query/key head dim, ``Dn + Dr`` (Hugging Face's ``qk_head_dim``)
    Dv   value head dim (``v_head_dim``)
    Dc*  width of the compressed key/value latent c_kv (``kv_lora_rank``, the paper's d_c)
    Dcq* width of the compressed query (``q_lora_rank``, the paper's d_c')

The arithmetic, step by step (DeepSeek-AI, "DeepSeek-V2", 2024, section 2.1; the same layer in V3):

1. **Compression.** Each token's input x (E) goes down to a latent ``c_kv = RMSNorm(W_DKV x)`` of only Dc
   numbers, and every head's key and value come back *up* from it: ``k_nope_h = W_UK_h c_kv`` (Dn) and
   ``v_h = W_UV_h c_kv`` (Dv). ``W_UK`` and ``W_UV`` are stored in one matrix, ``kv_b_proj``
   (Dc -> H * (Dn + Dv)), but not as two halves: its output rows go head by head, ``[head 0's k_nope (Dn) |
   head 0's v (Dv) | head 1's k_nope | head 1's v | ...]``, so W_UK_h and W_UV_h are the first Dn and the
   next Dv rows of head h's block (:meth:`MultiHeadLatentAttention.absorbed_weights` cuts them out). The
   queries may be compressed the same way (``q_lora_rank``; ``None`` = one plain projection, as in
   DeepSeek-V2-Lite), which saves parameters and activations, not cache; ``q_proj`` / ``q_b_proj`` rows
   alternate likewise, head by head ``[q_nope (Dn) | q_rope (Dr)]``.
2. **Decoupled RoPE.** Position enters through separate, extra features: each head's query has Dr more,
   and the token has one Dr-wide key ``k_rope`` shared by all heads (multi-query style), both rotated by
   :func:`attnbook.positional.apply_rotary`. The score of head h is
   ``(q_nope_h . k_nope_h + q_rope_h . k_rope) / sqrt(Dn + Dr)``: the scale is ``qk_head_dim ** -0.5``, as
   in Hugging Face; under YaRN (``rope_scaling``, DeepSeek-V3's x40) the rope frequencies are
   :func:`attnbook.positional.rope_frequencies`' and the scale is multiplied by
   ``yarn_mscale(factor, mscale_all_dim) ** 2`` (1.874 for DeepSeek-V3), as DeepSeek's own code does.
3. **Latent cache** (:class:`LatentKVCache`). What a later token needs from this one is c_kv and the
   rotated k_rope: ``Dc + Dr`` numbers per token and layer, whatever H is (DeepSeek-V3: 512 + 64 = 576,
   where multi-head attention with 128 heads of 128 caches 32768; :func:`mla_cache_elements_per_token`).
4. **Three ways to decode.** *Naive* (what Hugging Face's ``DeepseekV3Attention`` does with its cache):
   push the whole latent cache through ``kv_b_proj`` at every step, into per-head keys and values
   (B, H, S, D) and (B, H, S, Dv), then attend. *Expanded cache* (DeepSeek-V3's ``attn_impl="naive"``):
   cache those per-head keys and values themselves (a :class:`attnbook.KVCache` passed as ``cache``), so
   each step expands only the new token, and reads ``H * (D + Dv)`` numbers per cached token. *Absorbed*: matrix products
   associate, so ``q_nope . (W_UK c) = (W_UK^T q_nope) . c``: one small product turns the query into a
   query in latent space, and its score against a cached token is ``q_latent . c_kv + q_rope . k_rope``, a
   dot product with the cached row ``[c_kv | k_rope]`` itself. Likewise ``sum_s w_s (W_UV c_s) =
   W_UV (sum_s w_s c_s)``: attend over the c_kv rows, then apply W_UV once per head. Decoding becomes
   multi-query attention with ONE key/value head of width Dc + Dr whose values are the first Dc features
   of its keys, and per-head keys and values are never built (:meth:`MultiHeadLatentAttention.attend_absorbed`;
   DeepSeek-V3's ``attn_impl="absorb"``). :func:`mla_step_cost` counts the multiply-adds and the bytes read
   of each form, for a decoding step and for a prefill.
5. **Why RoPE had to be decoupled** (:func:`absorb_through_rotated_key`): rotate the up-projected key
   instead, and the matrix to fold becomes ``R_(s-t) W_UK``: one per distance between query and key, not
   one per layer.

Weights: the submodules are named as in Hugging Face's ``DeepseekV3Attention`` (``q_proj`` or ``q_a_proj``,
``q_a_layernorm``, ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``; ``o_proj``), so its
state dict loads 1:1 (:meth:`MultiHeadLatentAttention.from_hf`).

Masks are bool, True = may attend, broadcastable to (B, H, T, S); or float, added to the scores (see
:mod:`attnbook.core`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import torch
import torch.nn as nn

from ._checks import check_int, check_module_inputs, shape_str
from .core import check_mask, scaled_dot_product_attention
from .kvcache import KVCache
from .mha import merge_heads
from .positional import apply_rotary, rope_frequencies, yarn_mscale

__all__ = [
    "MultiHeadLatentAttention",
    "LatentKVCache",
    "absorb_through_rotated_key",
    "RotatedKeyAbsorption",
    "mla_cache_elements_per_token",
    "mla_cache_bytes_per_token",
    "LatentConfig",
    "DEEPSEEK_V3_MLA",
    "DEEPSEEK_V3_ROPE",
    "MLA_FORMS",
    "mla_step_cost",
]


class LatentConfig(TypedDict):
    """The sizes that set an MLA model's cache, under the names of its ``config.json``."""

    hidden_size: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_hidden_layers: int


# DeepSeek-V3 (671B): deepseek-ai/DeepSeek-V3's config.json on the Hugging Face Hub
# (https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json); the same values are the defaults of
# transformers' DeepseekV3Config. Its rope is YaRN-scaled (factor 40), which sets no cache size.
DEEPSEEK_V3_MLA: LatentConfig = {
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_hidden_layers": 61,
}


# DeepSeek-V3's rope_scaling in its config.json (with rope_theta 10000 and max_position_embeddings 163840):
# YaRN from the 4096 positions of pre-training to 40 times as many.
DEEPSEEK_V3_ROPE: dict[str, Any] = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


# ----------------------------------------------------------------------------- the cache


class LatentKVCache:
    """The cache of one MLA layer: per token, the normalised latent c_kv (Dc) and the rotated, shared RoPE
    key k_rope (Dr), and nothing else: ``Dc + Dr`` numbers, whatever the number of heads.

    Both live side by side in one tensor, :attr:`latent` ``(B, S, Dc + Dr)``, each row ``[c_kv | k_rope]``
    (as serving kernels such as FlashMLA store it): that row is the one key of the absorbed decoding path,
    and its first Dc features are the values (:meth:`MultiHeadLatentAttention.attend_absorbed`).
    :attr:`c_kv` ``(B, S, Dc)`` and :attr:`k_rope` ``(B, S, Dr)`` are views of it.

    The API is :class:`attnbook.KVCache`'s: ``append`` (returns everything cached), ``len()``, ``nbytes``,
    ``truncate``, ``reset``. With ``max_len=None`` (the default) ``append`` concatenates, copying the whole
    cache each step, as ``KVCache``; with a ``max_len`` the first ``append`` reserves ``max_len`` positions and
    each later one writes only the new tokens in place, as :class:`attnbook.StaticKVCache`
    (``allocated_bytes``); appending past ``max_len`` raises a ``ValueError``.
    """

    def __init__(self, max_len: int | None = None) -> None:
        self.max_len = None if max_len is None else check_int("max_len", max_len, 1)
        self.kv_lora_rank: int | None = None  # Dc, set by the first append
        self._buffer: torch.Tensor | None = None  # (B, S or max_len, Dc + Dr)
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        shape = None if self._buffer is None else (self._buffer.shape[0], len(self), self._buffer.shape[2])
        return f"LatentKVCache(length={len(self)}, max_len={self.max_len}, latent shape={shape})"

    @property
    def latent(self) -> torch.Tensor | None:
        """``(B, S, Dc + Dr)``: one row ``[c_kv | k_rope]`` per cached token (``None`` when empty)."""
        if self._buffer is None or self._length == 0:
            return None
        return self._buffer[:, : self._length]  # (B, S, Dc + Dr) a view

    @property
    def c_kv(self) -> torch.Tensor | None:
        """``(B, S, Dc)``: the normalised latents (a view of :attr:`latent`)."""
        lat = self.latent
        return None if lat is None else lat[..., : self.kv_lora_rank]  # (B, S, Dc)

    @property
    def k_rope(self) -> torch.Tensor | None:
        """``(B, S, Dr)``: the rotated RoPE keys, one per token for all heads (a view of :attr:`latent`)."""
        lat = self.latent
        return None if lat is None else lat[..., self.kv_lora_rank :]  # (B, S, Dr)

    def _check_new(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> None:
        for name, t in (("c_kv", c_kv), ("k_rope", k_rope)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if not t.dtype.is_floating_point:
                raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if c_kv.dim() != 3 or k_rope.dim() != 3 or c_kv.shape[:2] != k_rope.shape[:2]:
            raise ValueError(f"c_kv and k_rope must be (B, T, Dc) and (B, T, Dr) with matching (B, T), "
                             f"got {shape_str(c_kv)} and {shape_str(k_rope)}")
        if c_kv.dtype != k_rope.dtype:
            raise TypeError(f"c_kv and k_rope must share one dtype, got {c_kv.dtype} and {k_rope.dtype}")
        if self._buffer is not None and self._length > 0:
            B, width = self._buffer.shape[0], self._buffer.shape[2]
            if (c_kv.shape[0] != B or c_kv.shape[2] != self.kv_lora_rank
                    or c_kv.shape[2] + k_rope.shape[2] != width):
                raise ValueError(f"new c_kv {shape_str(c_kv)} and k_rope {shape_str(k_rope)} do not fit the cache's "
                                 f"(B, S, Dc + Dr) = ({B}, {self._length}, {self.kv_lora_rank} + "
                                 f"{width - (self.kv_lora_rank or 0)})")
            if c_kv.dtype != self._buffer.dtype:
                raise TypeError(f"new c_kv and k_rope are {c_kv.dtype}, the cache holds {self._buffer.dtype}")

    def append(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' latents ``(B, T, Dc)`` and rotated RoPE keys ``(B, T, Dr)``; return all of
        them, ``(B, S, Dc)`` and ``(B, S, Dr)`` (views of :attr:`latent`)."""
        self._check_new(c_kv, k_rope)
        new = torch.cat([c_kv, k_rope], dim=-1)  # (B, T, Dc + Dr): one row per new token
        S, n = self._length, new.shape[1]
        self.kv_lora_rank = c_kv.shape[2]
        if self.max_len is None:
            old = self.latent
            self._buffer = new if old is None else torch.cat([old, new], dim=1)  # (B, S + T, Dc + Dr): a copy
        else:
            if S + n > self.max_len:
                raise ValueError(f"the cache is full: max_len={self.max_len}, it holds {S} tokens and {n} more do "
                                 f"not fit (make it with a larger max_len)")
            wanted = (new.shape[0], self.max_len, new.shape[2])
            if (self._buffer is None or tuple(self._buffer.shape) != wanted or self._buffer.dtype != new.dtype
                    or self._buffer.device != new.device):
                self._buffer = new.new_empty(wanted)  # (B, max_len, Dc + Dr) reserved once
            self._buffer[:, S : S + n].copy_(new)  # only the new tokens are written
        self._length = S + n
        lat = self.latent
        assert lat is not None
        return lat[..., : self.kv_lora_rank], lat[..., self.kv_lora_rank :]  # (B, S, Dc), (B, S, Dr)

    @property
    def nbytes(self) -> int:
        """Bytes of what is cached: ``B * len(self) * (Dc + Dr) * itemsize``."""
        lat = self.latent
        return 0 if lat is None else lat.numel() * lat.element_size()

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the buffer: ``max_len`` tokens when preallocated, else the cached ones."""
        return 0 if self._buffer is None else self._buffer.numel() * self._buffer.element_size()

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (``0 <= length <= len(self)``): rewind the cache, e.g. to time
        one decoding step again at the same length."""
        length = check_int("length", length, 0, len(self))
        if length == 0 and self.max_len is None:
            self.reset()
            return
        self._length = length

    def reset(self) -> None:
        """Empty the cache (a preallocated buffer is kept for the next ``append``)."""
        self._length = 0
        if self.max_len is None:
            self._buffer = None


# ----------------------------------------------------------------------------- the layer


def _check_rank(name: str, value: object, d_model: int) -> int:
    rank = check_int(name, value)
    if rank > d_model:
        raise ValueError(f"{name}={rank} is larger than d_model={d_model}: the latent compresses the "
                         f"d_model-wide input, so {name} must be <= d_model")
    return rank


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3), weights and names as Hugging Face's ``DeepseekV3Attention``.

    Args:
        d_model: model dimension E (``hidden_size``).
        num_heads: number of heads H (``num_attention_heads``).
        q_lora_rank: width Dcq of the compressed query (``q_a_proj`` E -> Dcq, ``q_a_layernorm``, ``q_b_proj``
            Dcq -> H * D); ``None`` = one projection ``q_proj`` E -> H * D (DeepSeek-V2-Lite).
        kv_lora_rank: width Dc of the latent c_kv, the part of the cache that carries content.
        qk_nope_head_dim: Dn, each head's query/key features without position.
        qk_rope_head_dim: Dr, each head's query features, and the shared key's, that RoPE rotates (even).
        v_head_dim: Dv, each head's value width.
        rope_base: the RoPE base (``rope_theta``).
        rope_scaling: None for plain RoPE, or the rest of the config's ``rope_parameters`` (without
            ``rope_theta``), e.g. DeepSeek-V3's YaRN (:data:`DEEPSEEK_V3_ROPE` less its theta): the
            frequencies and attention factor of :func:`attnbook.positional.rope_frequencies`, and with
            ``mscale_all_dim`` set the softmax scale multiplied by ``yarn_mscale(factor, mscale_all_dim) ** 2``.
        rope_interleave: which features RoPE pairs. ``True`` (DeepSeek's layout and ``DeepseekV3Config``'s
            default): ``(0, 1), (2, 3), ...``, i.e. ``apply_rotary(..., interleaved=True)``; ``False``: ``(i, i +
            Dr/2)``. Hugging Face's interleaved function returns the rotated features de-interleaved (evens, then
            odds) while :func:`attnbook.positional.apply_rotary` keeps them in place; queries and keys are
            permuted alike, so every score, and the output, is the same.
        attention_bias: biases on ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj`` (``attention_bias``).
        rms_norm_eps: epsilon of the two RMSNorms (Hugging Face's attention builds them with 1e-6).

    Submodules: ``kv_a_proj_with_mqa`` (E -> Dc + Dr: the latent and the shared RoPE key, "with MQA" because
    that key is one for all heads), ``kv_a_layernorm`` (RMSNorm over the Dc latent features), ``kv_b_proj``
    (Dc -> H * (Dn + Dv): W_UK and W_UV, head by head), ``o_proj`` (H * Dv -> E), and the query's.

    ``forward(x, positions=None, mask=None, *, cache=None, absorb=False, need_weights=False)`` returns
    ``(out (B, T, E), weights (B, H, T, S) or None)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        q_lora_rank: int | None = None,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        rope_base: float = 10000.0,
        rope_scaling: Mapping[str, Any] | None = None,
        rope_interleave: bool = True,
        attention_bias: bool = False,
        rms_norm_eps: float = 1e-6,
    ):
        super().__init__()
        d_model = check_int("d_model", d_model)
        self.d_model = d_model
        self.num_heads = check_int("num_heads", num_heads)
        self.q_lora_rank = None if q_lora_rank is None else _check_rank("q_lora_rank", q_lora_rank, d_model)
        self.kv_lora_rank = _check_rank("kv_lora_rank", kv_lora_rank, d_model)
        self.qk_nope_head_dim = check_int("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = check_int("qk_rope_head_dim", qk_rope_head_dim)
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs of features), got {qk_rope_head_dim}")
        self.v_head_dim = check_int("v_head_dim", v_head_dim)
        if isinstance(rope_base, bool) or not isinstance(rope_base, (int, float)):
            raise TypeError(f"rope_base must be a number > 1, got {type(rope_base).__name__} {rope_base!r}")
        if not rope_base > 1:
            raise ValueError(f"rope_base must be a number > 1, got {rope_base!r}")
        self.rope_base = float(rope_base)
        for name, flag in (("rope_interleave", rope_interleave), ("attention_bias", attention_bias)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
        self.rope_interleave = rope_interleave
        if isinstance(rms_norm_eps, bool) or not isinstance(rms_norm_eps, (int, float)):
            raise TypeError(f"rms_norm_eps must be a positive number, got {type(rms_norm_eps).__name__} {rms_norm_eps!r}")
        if not rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be a positive number, got {rms_norm_eps!r}")
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim  # D = Dn + Dr
        self.rope_scaling = None if rope_scaling is None else dict(rope_scaling)
        if self.rope_scaling is not None and "rope_theta" in self.rope_scaling:
            raise ValueError(f"rope_scaling must not hold rope_theta ({self.rope_scaling['rope_theta']!r}): "
                             "the base is rope_base")
        rope = {**(self.rope_scaling or {}), "rope_theta": self.rope_base}
        self.rope_inv_freq, self.rope_attention_factor = rope_frequencies(self.qk_rope_head_dim, rope)  # (Dr/2,)
        self.scaling = self.qk_head_dim ** -0.5  # 1 / sqrt(Dn + Dr), as Hugging Face without rope scaling
        if self.rope_scaling is not None and self.rope_scaling.get("mscale_all_dim"):
            # DeepSeek's YaRN temperature goes into the softmax scale (its modelling code's yarn_get_mscale)
            self.scaling *= yarn_mscale(float(self.rope_scaling["factor"]),
                                        float(self.rope_scaling["mscale_all_dim"])) ** 2
        H, D = self.num_heads, self.qk_head_dim

        # queries: E -> H * D, directly or through a Dcq-wide bottleneck
        self.q_proj: nn.Linear | None = None
        self.q_a_proj: nn.Linear | None = None
        self.q_a_layernorm: nn.RMSNorm | None = None
        self.q_b_proj: nn.Linear | None = None
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(d_model, H * D, bias=False)
        else:
            self.q_a_proj = nn.Linear(d_model, self.q_lora_rank, bias=attention_bias)  # W_DQ
            self.q_a_layernorm = nn.RMSNorm(self.q_lora_rank, eps=float(rms_norm_eps))
            self.q_b_proj = nn.Linear(self.q_lora_rank, H * D, bias=False)  # W_UQ, W_QR: per head [q_nope | q_rope]
        # keys and values: E -> [c_kv | k_rope], then c_kv -> every head's k_nope and v
        self.kv_a_proj_with_mqa = nn.Linear(d_model, self.kv_lora_rank + self.qk_rope_head_dim,
                                            bias=attention_bias)  # W_DKV and W_KR
        self.kv_a_layernorm = nn.RMSNorm(self.kv_lora_rank, eps=float(rms_norm_eps))
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, H * (self.qk_nope_head_dim + self.v_head_dim),
                                   bias=False)  # W_UK, W_UV: per head [k_nope | v] rows
        self.o_proj = nn.Linear(H * self.v_head_dim, d_model, bias=attention_bias)  # W_O

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, q_lora_rank={self.q_lora_rank}, "
                f"kv_lora_rank={self.kv_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
                f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, "
                f"rope_interleave={self.rope_interleave}"
                + ("" if self.rope_scaling is None else f", rope_scaling={self.rope_scaling}"))

    # -- the pieces, in the order a token goes through them

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE as this layer applies it: :func:`attnbook.positional.apply_rotary` with the frequencies and
        attention factor of ``rope_base`` and ``rope_scaling`` and ``interleaved=rope_interleave``, over the
        last dim of ``x`` ``(..., T, Dr)``."""
        if x.shape[-1] != self.qk_rope_head_dim:  # the coupled variant of absorb_through_rotated_key: plain RoPE
            return apply_rotary(x, positions, base=self.rope_base, interleaved=self.rope_interleave)
        return apply_rotary(x, positions, interleaved=self.rope_interleave, inv_freq=self.rope_inv_freq,
                            attention_factor=self.rope_attention_factor)

    def _positions(self, positions: torch.Tensor | Sequence[float] | None, B: int, T: int, offset: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions for the queries ``(B, H, T, Dr)`` and the keys ``(B, T, Dr)``: ``(T,)`` for both, or
        ``(B, 1, T)`` and ``(B, T)`` from per-sequence ``(B, T)`` positions."""
        if positions is None:
            pos = torch.arange(offset, offset + T, device=device)  # (T,)
            return pos, pos
        pos = torch.as_tensor(positions, device=device)
        if pos.dim() == 1 and pos.shape[0] == T:
            return pos, pos
        if pos.dim() == 2 and tuple(pos.shape) == (B, T):
            return pos[:, None, :], pos  # (B, 1, T) for the heads, (B, T) for the shared key
        raise ValueError(f"positions must be (T,) = ({T},) or (B, T) = ({B}, {T}), got shape {tuple(pos.shape)}")

    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's query, split: ``q_nope (B, H, T, Dn)`` and the rotated ``q_rope (B, H, T, Dr)``."""
        B, T, _ = x.shape
        if self.q_proj is not None:
            q = self.q_proj(x)  # (B, T, H * D)
        else:
            assert self.q_a_proj is not None and self.q_a_layernorm is not None and self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # (B, T, Dcq) -> (B, T, H * D)
        q = q.view(B, T, self.num_heads, self.qk_head_dim).transpose(1, 2)  # (B, H, T, D)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)  # (B, H, T, Dn), (B, H, T, Dr)
        return q_nope, self.rotate(q_rope, positions)

    def latents(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the cache keeps of each token: ``c_kv (B, T, Dc)``, normalised, and the rotated shared key
        ``k_rope (B, T, Dr)``."""
        kv = self.kv_a_proj_with_mqa(x)  # (B, T, Dc + Dr)
        c_kv, k_rope = kv.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)  # (B, T, Dc), (B, T, Dr)
        return self.kv_a_layernorm(c_kv), self.rotate(k_rope, positions)

    def expand(self, c_kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Up-projection of latents ``(B, S, Dc)`` into every head's ``k_nope (B, H, S, Dn)`` and ``v (B, H, S, Dv)``."""
        B, S, _ = c_kv.shape
        kv = self.kv_b_proj(c_kv)  # (B, S, H * (Dn + Dv))
        kv = kv.view(B, S, self.num_heads, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)  # (B, H, S, Dn + Dv)
        k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)  # (B, H, S, Dn), (B, H, S, Dv)
        return k_nope, v

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj``'s weight cut per head: ``W_UK (H, Dn, Dc)`` and ``W_UV (H, Dv, Dc)`` (views, no copy),
        with ``k_nope_h = W_UK[h] @ c_kv`` and ``v_h = W_UV[h] @ c_kv``."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim,
                                       self.kv_lora_rank)  # (H, Dn + Dv, Dc)
        w_uk, w_uv = w.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)  # (H, Dn, Dc), (H, Dv, Dc)
        return w_uk, w_uv

    # -- two ways to attend over the latents

    def attend_naive(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor,
                     mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention over cached rows ``latent (B, S, Dc + Dr)`` by re-expanding them: per-head keys
        ``[W_UK c_kv | k_rope] (B, H, S, Dn + Dr)`` and values ``W_UV c_kv (B, H, S, Dv)`` for all S tokens
        (``H * (Dn + Dr + Dv)`` numbers per token, built again at every step), then plain attention.
        Returns ``(out (B, T, E), weights (B, H, T, S))``."""
        B, H, T, _ = q_nope.shape
        S = latent.shape[1]
        c_kv, k_rope = latent[..., : self.kv_lora_rank], latent[..., self.kv_lora_rank :]  # (B, S, Dc), (B, S, Dr)
        k_nope, v = self.expand(c_kv)  # (B, H, S, Dn), (B, H, S, Dv)
        k_rope_heads = k_rope[:, None].expand(B, H, S, self.qk_rope_head_dim)  # (B, H, S, Dr): one key, every head
        k = torch.cat([k_nope, k_rope_heads], dim=-1)  # (B, H, S, D)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, D)
        out, weights = scaled_dot_product_attention(q, k, v, mask, scale=self.scaling)  # (B, H, T, Dv), (B, H, T, S)
        return self.o_proj(merge_heads(out)), weights  # (B, T, E)

    def attend_absorbed(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor,
                        mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The same attention with W_UK folded into the query and W_UV applied after it; per-head keys and
        values are never built.

        ``q_nope_h . (W_UK_h c) = (W_UK_h^T q_nope_h) . c``: the query goes to latent space,
        ``q_latent (B, H, T, Dc)``, and the score against cached row ``[c_kv | k_rope]`` is
        ``[q_latent | q_rope] . [c_kv | k_rope]``, scaled by ``1 / sqrt(Dn + Dr)`` as before (the score is
        the same number, computed in another order). With weights w, ``sum_s w_s W_UV_h c_s =
        W_UV_h (sum_s w_s c_s)``: attend over the c_kv rows, then one (Dc -> Dv) product per head.

        So this is multi-query attention with one key/value head of width ``Dc + Dr``, the values being the
        first Dc features of the keys; the H * T queries are stacked and read each cached row once
        (as :func:`attnbook.mha.grouped_decode_attention`). Returns ``(out (B, T, E), weights (B, H, T, S))``."""
        B, H, T, _ = q_nope.shape
        S, width = latent.shape[1], latent.shape[2]  # width = Dc + Dr
        w_uk, w_uv = self.absorbed_weights()  # (H, Dn, Dc), (H, Dv, Dc)
        q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)  # (B, H, T, Dc): W_UK_h^T q_nope_h
        q = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, T, Dc + Dr)
        q = q.reshape(B, 1, H * T, width)  # (B, 1, H*T, Dc + Dr): all heads' queries against the one latent head
        k = latent[:, None]  # (B, 1, S, Dc + Dr)
        v = latent[:, None, :, : self.kv_lora_rank]  # (B, 1, S, Dc): the keys' first Dc features
        if mask is not None:
            check_mask(mask, torch.Size((B, H, T, S)))
            mask = mask.expand(B, H, T, S).reshape(B, 1, H * T, S)  # (B, 1, H*T, S)
        ctx, weights = scaled_dot_product_attention(q, k, v, mask, scale=self.scaling)  # (B, 1, H*T, Dc), (B, 1, H*T, S)
        ctx = ctx.view(B, H, T, self.kv_lora_rank)  # (B, H, T, Dc): sum_s w_s c_s, per head
        out = torch.einsum("bhtc,hvc->bhtv", ctx, w_uv)  # (B, H, T, Dv): W_UV_h applied once
        return self.o_proj(merge_heads(out)), weights.view(B, H, T, S)  # (B, T, E), (B, H, T, S)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | Sequence[float] | None = None,
        mask: torch.Tensor | None = None,
        *,
        cache: LatentKVCache | KVCache | None = None,
        absorb: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention of ``x (B, T, E)``; returns ``(out (B, T, E), weights (B, H, T, S) or None)``.

        Args:
            x: the new tokens' inputs.
            positions: their positions, ``(T,)`` or per sequence ``(B, T)``; default
                ``len(cache) + arange(T)`` (``arange(T)`` without a cache).
            mask: bool (True = may attend) or float, broadcastable to ``(B, H, T, S)``; ``None`` = every key.
                A prompt needs ``causal_mask(T, S, offset=S - T)``; one new token needs none.
            cache: a :class:`LatentKVCache`: the new tokens' ``[c_kv | k_rope]`` rows are appended to it and the
                queries attend over everything it holds (S = cached + new). Or a :class:`attnbook.KVCache`
                (or ``StaticKVCache``): the expanded form, DeepSeek-V3's ``attn_impl="naive"``: only the new
                tokens are expanded, and their per-head keys ``[k_nope | k_rope] (B, H, T, D)`` and values
                ``(B, H, T, Dv)`` are cached (``H * (D + Dv)`` numbers per token); not with ``absorb=True``.
            absorb: ``False``: re-expand the latents into per-head keys and values (:meth:`attend_naive`);
                ``True``: fold W_UK into the query and W_UV into the output (:meth:`attend_absorbed`). The same
                result, up to rounding.
            need_weights: return the attention weights.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}) (batch-first), got {shape_str(x)}")
        check_module_inputs(self, x=x)
        if cache is not None and not isinstance(cache, (LatentKVCache, KVCache)):
            raise TypeError(f"cache must be a LatentKVCache (the latents) or a KVCache (the expanded keys and "
                            f"values), got {type(cache).__name__}")
        if isinstance(cache, KVCache) and absorb:
            raise ValueError("absorb=True reads latents, but cache is a KVCache of expanded keys and values: "
                             "pass a LatentKVCache, or absorb=False")
        B, T, _ = x.shape
        q_pos, k_pos = self._positions(positions, B, T, 0 if cache is None else len(cache), x.device)
        q_nope, q_rope = self.queries(x, q_pos)  # (B, H, T, Dn), (B, H, T, Dr)
        c_kv, k_rope = self.latents(x, k_pos)  # (B, T, Dc), (B, T, Dr)
        if isinstance(cache, KVCache):
            return self._attend_expanded_cache(q_nope, q_rope, c_kv, k_rope, cache, mask, need_weights)
        if cache is None:
            latent = torch.cat([c_kv, k_rope], dim=-1)  # (B, S, Dc + Dr), S = T
        else:
            cache.append(c_kv, k_rope)
            assert cache.latent is not None
            latent = cache.latent  # (B, S, Dc + Dr), S = cached + new
        attend = self.attend_absorbed if absorb else self.attend_naive
        out, weights = attend(q_nope, q_rope, latent, mask)
        return out, (weights if need_weights else None)

    def _attend_expanded_cache(self, q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
                               k_rope: torch.Tensor, cache: KVCache, mask: torch.Tensor | None,
                               need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Expand only the new tokens, cache their per-head keys and values, attend over the whole cache."""
        B, H, T, _ = q_nope.shape
        k_nope, v = self.expand(c_kv)  # (B, H, T, Dn), (B, H, T, Dv): the new tokens only
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, T, self.qk_rope_head_dim)], dim=-1)  # (B, H, T, D)
        k_all, v_all = cache.append(k, v)  # (B, H, S, D), (B, H, S, Dv)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, D)
        out, weights = scaled_dot_product_attention(q, k_all, v_all, mask, scale=self.scaling)  # (B, H, T, Dv)
        return self.o_proj(merge_heads(out)), (weights if need_weights else None)  # (B, T, E)

    @classmethod
    def from_hf(cls, module: nn.Module) -> MultiHeadLatentAttention:
        """A copy of a Hugging Face ``transformers`` ``DeepseekV3Attention`` (same weights, device and dtype).

        The state dict loads 1:1 (strict: every name and shape must match). RoPE may be plain or scaled
        (the config's ``rope_parameters`` in transformers 5.x, ``rope_theta`` and ``rope_scaling`` in 4.x;
        YaRN as DeepSeek-V3's own, or linear: ``rope_scaling``); another
        ``rope_type`` raises a ``ValueError`` naming it, and so do fewer key/value heads than heads (Hugging
        Face's MLA expands every head).
        Dropout on the weights (``attention_dropout``, training only) is not carried over.
        """
        try:
            hf = importlib.import_module("transformers.models.deepseek_v3.modeling_deepseek_v3")
            expected: type | None = hf.DeepseekV3Attention
        except ImportError:  # no transformers: nothing can be a DeepseekV3Attention
            expected = None
        if expected is None or not isinstance(module, expected):
            raise TypeError(f"from_hf expects a transformers DeepseekV3Attention, got {type(module).__name__}")
        hf_attn: Any = module  # its attributes, as transformers names them
        config: Any = hf_attn.config
        rope = dict(getattr(config, "rope_parameters", None) or {})
        if not rope:  # transformers 4.x: rope_theta and rope_scaling side by side
            rope = {**(getattr(config, "rope_scaling", None) or {}), "rope_theta": getattr(config, "rope_theta", 10000.0)}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "yarn" and not rope.get("original_max_position_embeddings"):
            # both versions fall back on max_position_embeddings (4.x when YaRN runs, 5.x when it reads the config)
            rope["original_max_position_embeddings"] = config.max_position_embeddings
        rope_scaling = None
        if rope_type != "default":
            rope_scaling = {k: v for k, v in rope.items()
                            if k not in ("rope_theta", "type", "partial_rotary_factor") and v is not None}
            rope_scaling["rope_type"] = rope_type
        if config.num_key_value_heads != config.num_attention_heads:
            raise ValueError(f"num_key_value_heads={config.num_key_value_heads} must equal num_attention_heads="
                             f"{config.num_attention_heads}")
        new = cls(
            config.hidden_size,
            config.num_attention_heads,
            q_lora_rank=config.q_lora_rank,
            kv_lora_rank=config.kv_lora_rank,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            rope_base=float(rope.get("rope_theta", 10000.0)),
            rope_scaling=rope_scaling,
            rope_interleave=bool(config.rope_interleave),
            attention_bias=bool(config.attention_bias),
            rms_norm_eps=float(hf_attn.kv_a_layernorm.variance_epsilon),
        )
        if new.q_a_layernorm is not None:
            new.q_a_layernorm.eps = float(hf_attn.q_a_layernorm.variance_epsilon)
        weight = hf_attn.kv_b_proj.weight
        new = new.to(device=weight.device, dtype=weight.dtype)
        new.load_state_dict(module.state_dict(), strict=True)
        return new


# ----------------------------------------------------------------------------- why decoupled RoPE


@dataclass(frozen=True)
class RotatedKeyAbsorption:
    """What :func:`absorb_through_rotated_key` found (float tensors on the layer's device and dtype).

    Attributes:
        scores: ``(B, H, T, T)`` the right scores (scaled, before the mask) of the coupled-RoPE variant.
        folded_scores: ``(B, H, T, T)`` the scores with a single W_UK folded into the rotated query.
        score_error_by_key_position: ``(T,)`` largest ``|folded - right|`` over the allowed (causal) pairs
            whose key sits at position s; exact (rounding only) at s = 0, where the key's rotation is the identity.
        score_scale: largest ``|right score|``, to read the errors against.
        per_distance_error: largest ``|score - right|`` when each pair is folded with its own matrix
            ``R_(s-t) W_UK``: rounding only, so the dependence on the distance is the whole story.
        matrix_change_by_distance: ``(T,)`` ``||R_(-d) W_UK - W_UK||_F / ||W_UK||_F`` for d = 0 .. T-1 (all heads):
            how far the matrix to fold at distance d is from the one at distance 0.
        output_error_by_position: ``(T,)`` ``||out_folded - out|| / ||out||`` of each query position's layer
            output (over batch and features).
        output_error: the same over the whole output.
        decoupled_error: the same for the real (decoupled) layer, absorbed against naive: rounding only.
    """

    scores: torch.Tensor
    folded_scores: torch.Tensor
    score_error_by_key_position: torch.Tensor
    score_scale: float
    per_distance_error: float
    matrix_change_by_distance: torch.Tensor
    output_error_by_position: torch.Tensor
    output_error: float
    decoupled_error: float


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def absorb_through_rotated_key(mla: MultiHeadLatentAttention, x: torch.Tensor) -> RotatedKeyAbsorption:
    """Why MLA keeps RoPE in separate features: try absorption when RoPE rotates the up-projected key.

    The variant (same weights as ``mla``, position carried by the Dn "nope" features instead of a separate
    rope part, which it drops): query ``R_t q_t`` with ``q_t`` the query's Dn features, key ``R_s W_UK c_s``,
    value ``W_UV c_s``, scale ``1 / sqrt(Dn)``, causal over ``x (B, T, E)`` at positions 0 .. T-1. ``R_m`` is
    RoPE's rotation at position m (:meth:`MultiHeadLatentAttention.rotate`; Dn must be even). Its right
    score is

        (R_t q_t) . (R_s W_UK c_s) = q_t^T R_t^T R_s W_UK c_s = q_t^T (R_(s-t) W_UK) c_s

    since rotations compose, ``R_t^T R_s = R_(s-t)``. To absorb, a matrix must sit between q and c; here it is
    ``R_(s-t) W_UK``, which changes with the distance between query and key: one matrix per distance, i.e.
    per (query, key) pair of a step, as costly as expanding the keys. Folding anyway with the one matrix a
    layer could precompute, ``W_UK`` (the key's rotation taken at position 0, the identity), gives the score
    ``(W_UK^T R_t q_t) . c_s``: right exactly when s = 0, wrong for every later key. This function computes

    * the right scores and the folded ones, and their gap by key position;
    * the scores folded with the per-distance matrix ``R_(s-t) W_UK`` (they are right: the formula holds);
    * how far ``R_(-d) W_UK`` is from ``W_UK`` at each distance d;
    * how far the layer's output lands from the right one with the folded scores;
    * for contrast, the real layer's absorbed output against its naive one (decoupled: rounding only).

    With decoupled RoPE the rotation acts only on ``q_rope . k_rope``, which is computed as it is (the cached
    k_rope is already rotated), and the part that is folded, ``q_nope . W_UK c``, has no rotation in it.
    """
    if not isinstance(mla, MultiHeadLatentAttention):
        raise TypeError(f"mla must be a MultiHeadLatentAttention, got {type(mla).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != mla.d_model or x.shape[1] < 2:
        raise ValueError(f"x must be (B, T, {mla.d_model}) with T >= 2, got {shape_str(x)}")
    if mla.qk_nope_head_dim % 2:
        raise ValueError(f"the variant rotates the Dn = qk_nope_head_dim features, which must be even; "
                         f"got {mla.qk_nope_head_dim}")
    B, T, _ = x.shape
    H, Dn = mla.num_heads, mla.qk_nope_head_dim
    pos = torch.arange(T, device=x.device)  # (T,)
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T) key s <= query t
    scale = Dn ** -0.5
    with torch.no_grad():
        q_nope, _ = mla.queries(x, pos)  # (B, H, T, Dn), the query's unrotated content features
        c_kv, _ = mla.latents(x, pos)  # (B, T, Dc)
        k_nope, v = mla.expand(c_kv)  # (B, H, T, Dn), (B, H, T, Dv)
        w_uk, _ = mla.absorbed_weights()  # (H, Dn, Dc)
        q_rot = mla.rotate(q_nope, pos)  # (B, H, T, Dn): R_t q_t
        k_rot = mla.rotate(k_nope, pos)  # (B, H, T, Dn): R_s W_UK c_s

        # the right answer: rotate the up-projected keys, attend
        scores = q_rot @ k_rot.transpose(-2, -1) * scale  # (B, H, T, T)
        out_heads, _ = scaled_dot_product_attention(q_rot, k_rot, v, causal, scale=scale)  # (B, H, T, Dv)
        out = mla.o_proj(merge_heads(out_heads))  # (B, T, E)

        # folded anyway: one W_UK for every key, as if each key sat at position 0
        q_latent = torch.einsum("bhtn,hnc->bhtc", q_rot, w_uk)  # (B, H, T, Dc): W_UK^T R_t q_t
        c = c_kv[:, None]  # (B, 1, T, Dc)
        folded = q_latent @ c.transpose(-2, -1) * scale  # (B, H, T, T)
        out_heads_f, _ = scaled_dot_product_attention(q_latent, c, v, causal, scale=scale)  # (B, H, T, Dv)
        out_f = mla.o_proj(merge_heads(out_heads_f))  # (B, T, E)

        # folded right: query t against key s with its own matrix, i.e. the query rotated by t - s
        rows = []
        for t in range(T):
            q_t = q_nope[:, :, t : t + 1].expand(B, H, T, Dn)  # (B, H, T, Dn): query t, once per key s
            q_ts = mla.rotate(q_t, t - pos)  # (B, H, T, Dn): R_(t-s) q_t, so that (R_(t-s) q_t) . W_UK c_s is right
            q_ts_latent = torch.einsum("bhsn,hnc->bhsc", q_ts, w_uk)  # (B, H, T, Dc)
            rows.append((q_ts_latent * c).sum(-1) * scale)  # (B, H, T): scores of query t against every key s
        per_distance = torch.stack(rows, dim=2)  # (B, H, T, T)

        gap = (folded - scores).abs().amax(dim=(0, 1))  # (T, T), largest over batch and heads
        gap = gap.masked_fill(~causal, 0.0)
        by_key = gap.amax(dim=0)  # (T,) over queries t, for each key position s
        per_distance_error = float((per_distance - scores).abs().masked_fill(~causal, 0.0).max())

        w_flat = w_uk.transpose(1, 2)  # (H, Dc, Dn): the Dn-vectors R acts on, one per latent feature
        change = torch.stack([(mla.rotate(w_flat, torch.full((w_flat.shape[1],), -d, device=x.device)) - w_flat).norm()
                              for d in range(T)]) / w_flat.norm()  # (T,)

        by_position = (out_f - out).norm(dim=(0, 2)) / out.norm(dim=(0, 2))  # (T,)
        naive, _ = mla(x, mask=causal)  # the real layer, decoupled RoPE
        absorbed, _ = mla(x, mask=causal, absorb=True)
    return RotatedKeyAbsorption(
        scores=scores,
        folded_scores=folded,
        score_error_by_key_position=by_key,
        score_scale=float(scores.abs().masked_fill(~causal, 0.0).max()),
        per_distance_error=per_distance_error,
        matrix_change_by_distance=change,
        output_error_by_position=by_position,
        output_error=_rel(out_f, out),
        decoupled_error=_rel(absorbed, naive),
    )


# ----------------------------------------------------------------------------- cache accounting


_CONFIG_KEYS = ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "num_hidden_layers")


def _check_config(config: object) -> dict[str, int]:
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping of config.json's names to sizes, got {type(config).__name__}")
    missing = [k for k in _CONFIG_KEYS if k not in config]
    if missing:
        raise ValueError(f"config is missing {missing} (it needs {list(_CONFIG_KEYS)})")
    return {k: check_int(f"config[{k!r}]", config[k]) for k in _CONFIG_KEYS}


def mla_cache_elements_per_token(config: Mapping[str, Any], *, gqa_groups: int = 8) -> dict[str, int]:
    """Numbers cached per token and per layer by MLA and by the classic layouts of the same width.

    ``config`` holds config.json's names (:class:`LatentConfig`, e.g. :data:`DEEPSEEK_V3_MLA`); with H heads,
    Dn, Dr, Dv as in the module's legend and Dc = ``kv_lora_rank``:

    * ``"mla"``: ``Dc + Dr``, the latent and the shared RoPE key (DeepSeek-V3: 512 + 64 = 576);
    * ``"mha"``: multi-head attention "of the same width", as DeepSeek-V2's comparison (its table 1,
      ``2 n_h d_h`` per layer) counts it: H heads, each caching a key of Dn and a value of Dv features,
      ``H * (Dn + Dv)`` (``2 * H * d_h`` when Dn = Dv = d_h; DeepSeek-V3: 2 * 128 * 128 = 32768);
    * ``"mha_expanded"``: MLA's own keys and values, cached after the up-projection (what a plain KV cache
      of this layer holds, as Hugging Face's modelling code used to): ``H * (Dn + Dr) + H * Dv`` (40960);
    * ``"gqa"``: grouped-query attention with ``gqa_groups`` key/value heads of those widths,
      ``gqa_groups * (Dn + Dv)`` (8 groups: 2048);
    * ``"mqa"``: multi-query attention, one key/value head, ``Dn + Dv`` (256).
    """
    c = _check_config(config)
    groups = check_int("gqa_groups", gqa_groups, 1, c["num_attention_heads"])
    H, Dn, Dr, Dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    return {
        "mha_expanded": H * (Dn + Dr) + H * Dv,
        "mha": H * (Dn + Dv),
        "gqa": groups * (Dn + Dv),
        "mqa": Dn + Dv,
        "mla": c["kv_lora_rank"] + Dr,
    }


def mla_cache_bytes_per_token(config: Mapping[str, Any], dtype: torch.dtype = torch.bfloat16, *,
                              all_layers: bool = False, gqa_groups: int = 8) -> dict[str, int]:
    """:func:`mla_cache_elements_per_token` in bytes of ``dtype`` (bfloat16 by default, as DeepSeek-V3's
    cache), per layer, or for the whole model (``num_hidden_layers`` layers) with ``all_layers=True``."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if not isinstance(all_layers, bool):
        raise TypeError(f"all_layers must be a bool, got {type(all_layers).__name__}")
    elements = mla_cache_elements_per_token(config, gqa_groups=gqa_groups)
    itemsize = torch.empty((), dtype=dtype).element_size()
    layers = _check_config(config)["num_hidden_layers"] if all_layers else 1
    return {name: n * itemsize * layers for name, n in elements.items()}


# ----------------------------------------------------------------------------- the work of a step

#: The three ways an MLA layer attends, in :func:`mla_step_cost`'s names.
MLA_FORMS = ("naive", "expanded", "absorbed")

_COST_KEYS = ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def mla_step_cost(config: Mapping[str, Any], S: int, form: str, *, T: int = 1, dtype_bytes: int = 2,
                  batch_size: int = 1) -> dict[str, int]:
    """Multiply-adds and bytes read by one MLA layer's attention for T new tokens over S cached ones
    (T = 1: a decoding step; T = S: a prefill, whose keys are the prompt's own), in one of :data:`MLA_FORMS`.

    Counted: the work that differs between the forms, from the latents of the new tokens
    (``c_kv (T, Dc)``, ``k_rope (T, Dr)``) and the queries (``q_nope (H, T, Dn)``, ``q_rope (H, T, Dr)``)
    to the heads' outputs ``(H, T, Dv)`` (``o_proj`` and the projections from x are the same in every
    form and left out); per sequence, times ``batch_size`` (the weights are read once for the batch).
    Returned, as ints:

    * ``"macs"``: multiply-adds (a causal prefill's masked half is counted too, as a dense kernel does);
    * ``"cache_bytes"``: what the cache holds after the step, at ``dtype_bytes`` a number;
    * ``"built_bytes"``: the per-head keys and values the step builds in memory;
    * ``"bytes_read"``: what the step reads: the cache, ``kv_b_proj`` (``Dc * H * (Dn + Dv)`` numbers), and
      the keys and values it built (read back by the attention, as an unfused implementation does).

    With H, Dn, Dr, Dv, Dc as in the module's legend and D = Dn + Dr:

    * ``"naive"`` (Hugging Face's ``DeepseekV3Attention`` with its cache, and this module's
      ``absorb=False`` with a :class:`LatentKVCache`): re-expand all S latents, ``S * Dc * H * (Dn + Dv)``,
      then attend, ``H * T * S * (D + Dv)``; caches ``S * (Dc + Dr)``, builds ``S * H * (D + Dv)``.
    * ``"expanded"`` (DeepSeek-V3's ``attn_impl="naive"``; a :class:`attnbook.KVCache`): expand only the T
      new tokens, ``T * Dc * H * (Dn + Dv)``, attend the same; caches ``S * H * (D + Dv)``.
    * ``"absorbed"`` (``attn_impl="absorb"``): fold W_UK into the queries, ``H * T * Dn * Dc``, attend
      over the latents, ``H * T * S * ((Dc + Dr) + Dc)``, apply W_UV, ``H * T * Dc * Dv``; caches
      ``S * (Dc + Dr)``, builds nothing per head.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping of config.json's names to sizes, got {type(config).__name__}")
    missing = [k for k in _COST_KEYS if k not in config]
    if missing:
        raise ValueError(f"config is missing {missing} (it needs {list(_COST_KEYS)})")
    c = {k: check_int(f"config[{k!r}]", config[k]) for k in _COST_KEYS}
    if form not in MLA_FORMS:
        raise ValueError(f"form must be one of {MLA_FORMS}, got {form!r}")
    S = check_int("S", S)
    T = check_int("T", T, 1, S)
    nbytes = check_int("dtype_bytes", dtype_bytes)
    batch = check_int("batch_size", batch_size)
    H, Dc, Dn, Dr, Dv = (c["num_attention_heads"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                         c["v_head_dim"])
    D = Dn + Dr
    weights = Dc * H * (Dn + Dv)  # kv_b_proj
    latent_cache = S * (Dc + Dr)
    expanded_cache = S * H * (D + Dv)
    if form == "naive":
        macs = S * weights + H * T * S * (D + Dv)
        held, built = latent_cache, expanded_cache  # every cached token expanded again
    elif form == "expanded":
        macs = T * weights + H * T * S * (D + Dv)
        held, built = expanded_cache, T * H * (D + Dv)  # only the new tokens, which go into the cache
    else:
        macs = H * T * Dn * Dc + H * T * S * ((Dc + Dr) + Dc) + H * T * Dc * Dv
        held, built = latent_cache, 0
    read = held + (built if form == "naive" else 0)
    return {"macs": batch * macs, "cache_bytes": batch * held * nbytes, "built_bytes": batch * built * nbytes,
            "bytes_read": (batch * read + weights) * nbytes}
