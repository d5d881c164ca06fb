"""A key/value cache for incremental (token-by-token) decoding.

Dimension legend: B batch, Hkv key/value heads, S cached length, D head dim, N layers.

When a decoder generates token t+1 it needs the keys and values of tokens
0..t. They do not change once computed (causal attention: earlier tokens never
see later ones), so instead of re-running the whole prefix every step, each
attention layer stores them and only projects the newest token. With
grouped-query attention the cache holds Hkv heads, not H: that is where
GQA and MQA save memory.

How much memory, counted for a whole model: :func:`kv_cache_bytes_per_token`
and :func:`kv_cache_bytes` (defaults: :data:`MODEL_7B`, the shape of the
7B-class models of 2023-24).
"""

from __future__ import annotations

from typing import TypedDict

import torch

from ._checks import check_int

__all__ = ["KVCache", "kv_cache_bytes_per_token", "kv_cache_bytes", "MODEL_7B", "ModelShape"]



class ModelShape(TypedDict):
    """The sizes of a model that set its KV cache's size (besides the key/value heads)."""

    num_layers: int
    head_dim: int
    dtype: torch.dtype


# a 7B-class model of 2023-24 (Llama 2 7B, Mistral 7B): 32 layers of head dim 128, keys and values in float16
MODEL_7B: ModelShape = {"num_layers": 32, "head_dim": 128, "dtype": torch.float16}


class KVCache:
    """Keys and values of one attention layer, ``(B, Hkv, S, D)`` each, grown by ``append``."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def __repr__(self) -> str:
        shape = None if self.k is None else tuple(self.k.shape)
        return f"KVCache(length={len(self)}, k shape={shape})"

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' keys and values ``(B, Hkv, T_new, D)``; return all of them."""
        if k.dim() != 4 or v.dim() != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k and v must be (B, Hkv, T, D) with matching (B, Hkv, T), got {tuple(k.shape)} and {tuple(v.shape)}")
        if self.k is None:
            self.k, self.v = k, v
        else:
            assert self.v is not None  # keys and values are set together
            if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
                raise ValueError(f"new keys {tuple(k.shape)} do not fit the cache's {tuple(self.k.shape)}")
            self.k = torch.cat([self.k, k], dim=2)  # (B, Hkv, S + T_new, D)
            self.v = torch.cat([self.v, v], dim=2)  # (B, Hkv, S + T_new, Dv)
        return self.k, self.v

    @property
    def nbytes(self) -> int:
        if self.k is None or self.v is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def reset(self) -> None:
        self.k = self.v = None


def kv_cache_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                             dtype: torch.dtype = torch.float16) -> int:
    """Bytes one token adds to the cache of a whole model: keys and values
    (2) x layers x key/value heads x head dim x bytes per number."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_kv_heads * head_dim * itemsize


def kv_cache_bytes(num_kv_heads: int, seq_len: int, *, batch: int = 1, num_layers: int = MODEL_7B["num_layers"],
                   head_dim: int = MODEL_7B["head_dim"], dtype: torch.dtype = MODEL_7B["dtype"]) -> int:
    """Bytes of the KV cache of :data:`MODEL_7B` (or the given sizes) holding
    ``seq_len`` tokens for each of ``batch`` sequences:
    ``batch * seq_len * kv_cache_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)``."""
    for name, val in (("num_kv_heads", num_kv_heads), ("seq_len", seq_len), ("batch", batch)):
        check_int(name, val)
    return batch * seq_len * kv_cache_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
