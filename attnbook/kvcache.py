"""A key/value cache for incremental (token-by-token) decoding.

Dimension legend: B batch, Hkv key/value heads, S cached length, D head dim (Dv for values),
N layers.

When a decoder generates token t+1 it needs the keys and values of tokens
0..t. They do not change once computed (causal attention: earlier tokens never
see later ones), so instead of re-running the whole prefix every step, each
attention layer stores them and only projects the newest token. With
grouped-query attention the cache holds Hkv heads, not H: that is where
GQA and MQA save memory.

Two caches, side by side: :class:`KVCache` concatenates (each step copies the
whole cache into a new tensor one token longer: simple, and quadratic in
total), :class:`StaticKVCache` preallocates ``max_len`` positions and writes
each new token in place (what serving code does). :func:`copied_bytes_per_step`
measures what each step writes.

How much memory, counted for a whole model: :func:`kv_cache_bytes_per_token`
and :func:`kv_cache_bytes` (defaults: :data:`MODEL_7B`, the shape of the
7B-class models of 2023-24). How long one decoding step's attention takes over
such a cache, with fewer key/value heads (GQA, MQA): :func:`decode_inputs` and
:func:`measure_decode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import torch

from ._checks import check_int, shape_str
from .measure import time_calls
from .mha import grouped_decode_attention, valid_kv_heads

__all__ = ["KVCache", "StaticKVCache", "copied_bytes_per_step", "kv_cache_bytes_per_token", "kv_cache_bytes", "MODEL_7B",
           "ModelShape", "BENCH_DIVISOR", "decode_inputs", "decode_key", "measure_decode"]


class ModelShape(TypedDict):
    """The sizes of a model that set its KV cache's size (besides the key/value heads)."""

    num_layers: int
    head_dim: int
    dtype: torch.dtype


# a 7B-class model of 2023-24 (Llama 2 7B, Mistral 7B): 32 layers of head dim 128, keys and values in float16
MODEL_7B: ModelShape = {"num_layers": 32, "head_dim": 128, "dtype": torch.float16}

BENCH_DIVISOR = 8
""":func:`measure_decode` times a step over S / 8 cached keys: the same shape of cost, a lighter machine load."""


def _check_new(cache: KVCache, k: torch.Tensor, v: torch.Tensor) -> None:
    """New keys and values ``(B, Hkv, T_new, D)`` and ``(B, Hkv, T_new, Dv)`` that fit what ``cache`` holds."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if k.dim() != 4 or v.dim() != 4 or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must be (B, Hkv, T, D) with matching (B, Hkv, T), got {shape_str(k)} and {shape_str(v)}")
    if cache.k is not None and cache.v is not None:
        if k.shape[:2] != cache.k.shape[:2] or k.shape[3] != cache.k.shape[3] or v.shape[3] != cache.v.shape[3]:
            raise ValueError(f"new keys {shape_str(k)} and values {shape_str(v)} do not fit the cache's "
                             f"{shape_str(cache.k)} and {shape_str(cache.v)}")
        if k.dtype != cache.k.dtype or v.dtype != cache.v.dtype:
            raise TypeError(f"new keys and values are {k.dtype} and {v.dtype}, the cache holds {cache.k.dtype}")


class KVCache:
    """Keys and values of one attention layer, ``(B, Hkv, S, D)`` each, grown by ``append``.

    ``append`` concatenates: every step builds new ``(B, Hkv, S + 1, D)`` tensors and copies the
    whole cache into them, so generating n tokens copies about n^2 / 2 tokens' keys and values in
    all (:func:`copied_bytes_per_step` measures it). The simplest correct cache, kept for teaching;
    :class:`StaticKVCache` is what serving code does.
    """

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
        _check_new(self, k, v)
        if self.k is None:
            self.k, self.v = k, v
        else:
            assert self.v is not None  # keys and values are set together
            self.k = torch.cat([self.k, k], dim=2)  # (B, Hkv, S + T_new, D): a new tensor, the old one copied
            self.v = torch.cat([self.v, v], dim=2)  # (B, Hkv, S + T_new, Dv)
        return self.k, self.v

    @property
    def nbytes(self) -> int:
        """Bytes of the cached keys and values (``len(self)`` tokens)."""
        if self.k is None or self.v is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (``0 <= length <= len(self)``): rewind the cache, e.g. to time
        one decoding step again at the same length."""
        length = check_int("length", length, 0, len(self))
        if length == 0:
            self.reset()
        elif self.k is not None and self.v is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]  # (B, Hkv, length, D)

    def reset(self) -> None:
        self.k = self.v = None


class StaticKVCache(KVCache):
    """A KV cache preallocated for ``max_len`` tokens: ``append`` writes the new tokens' keys and
    values in place, into buffers ``(B, Hkv, max_len, D)``, and copies nothing else.

    The buffers are allocated by the first ``append`` (which gives B, Hkv, D, the dtype and the
    device) and kept by :meth:`reset`; ``k`` and ``v`` are views of their first ``len(self)``
    positions, so attention reads the cache without a copy. A step writes one token's keys and values
    whatever the length (:func:`copied_bytes_per_step`), and the memory is reserved once, up front
    (``allocated_bytes``): what serving systems do, Hugging Face's ``StaticCache`` among them. vLLM's
    paged attention goes one step further: fixed-size blocks handed out on demand, so that many
    sequences of unknown lengths share one pool without reserving ``max_len`` for each.
    Appending past ``max_len`` raises a ``ValueError``.
    """

    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len = check_int("max_len", max_len, 1)
        self.k_buffer: torch.Tensor | None = None
        self.v_buffer: torch.Tensor | None = None

    def __repr__(self) -> str:
        shape = None if self.k_buffer is None else tuple(self.k_buffer.shape)
        return f"StaticKVCache(length={len(self)}, max_len={self.max_len}, k buffer shape={shape})"

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens' keys and values ``(B, Hkv, T_new, D)`` after the cached ones; return
        views of all of them, ``(B, Hkv, S + T_new, D)``."""
        _check_new(self, k, v)
        S, n = len(self), k.shape[2]
        if S + n > self.max_len:
            raise ValueError(f"the cache is full: max_len={self.max_len}, it holds {S} tokens and {n} more do not fit "
                             f"(make it with a larger max_len)")
        B, Hkv, _, D = k.shape
        wanted = ((B, Hkv, self.max_len, D), (B, Hkv, self.max_len, v.shape[3]))
        if (self.k_buffer is None or self.v_buffer is None or (tuple(self.k_buffer.shape), tuple(self.v_buffer.shape))
                != wanted or self.k_buffer.dtype != k.dtype or self.k_buffer.device != k.device):
            # first append (or first after reset() with other sizes): reserve max_len positions
            self.k_buffer = k.new_empty(wanted[0])  # (B, Hkv, max_len, D)
            self.v_buffer = v.new_empty(wanted[1])  # (B, Hkv, max_len, Dv)
        self.k_buffer[:, :, S:S + n].copy_(k)  # only the new tokens are written
        self.v_buffer[:, :, S:S + n].copy_(v)
        self.k = self.k_buffer[:, :, :S + n]  # (B, Hkv, S + T_new, D) a view, no copy
        self.v = self.v_buffer[:, :, :S + n]  # (B, Hkv, S + T_new, Dv)
        return self.k, self.v

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the two buffers (``max_len`` tokens), 0 before the first ``append``."""
        if self.k_buffer is None or self.v_buffer is None:
            return 0
        return self.k_buffer.numel() * self.k_buffer.element_size() + self.v_buffer.numel() * self.v_buffer.element_size()


def copied_bytes_per_step(cache: KVCache, steps: int, *, batch: int = 1, num_kv_heads: int = 1, head_dim: int = 64,
                          prompt_len: int = 1, dtype: torch.dtype = torch.float32,
                          device: str | torch.device | None = None) -> list[int]:
    """Bytes each decoding step writes into ``cache``, measured: fill ``cache`` (emptied first) with a prompt
    of ``prompt_len`` tokens, then append one token ``steps`` times and count, for each append, the bytes
    that PyTorch's operators write (:func:`attnbook.measure.bytes_written`: new tensors and in-place writes).

    For keys and values of ``row = batch * num_kv_heads * head_dim * itemsize`` bytes per token and per
    tensor, the step that grows the cache from S to S + 1 tokens writes ``2 * (S + 1) * row`` bytes into a
    :class:`KVCache` (the whole cache is copied: quadratic in total) and ``2 * row`` into a
    :class:`StaticKVCache` (only the new token: flat). Returns one count per step."""
    from .measure import bytes_written

    steps = check_int("steps", steps, 1)
    prompt_len = check_int("prompt_len", prompt_len, 1)
    shape = (check_int("batch", batch), check_int("num_kv_heads", num_kv_heads), 1, check_int("head_dim", head_dim))
    cache.reset()
    prompt = torch.zeros(shape[0], shape[1], prompt_len, shape[3], dtype=dtype, device=device)  # (B, Hkv, S0, D)
    cache.append(prompt, prompt.clone())
    new_k = torch.ones(shape, dtype=dtype, device=device)  # (B, Hkv, 1, D) one new token
    new_v = torch.ones(shape, dtype=dtype, device=device)
    return [bytes_written(lambda: cache.append(new_k, new_v)) for _ in range(steps)]


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


# ----------------------------------------------------------------------------- timing a decoding step


def decode_inputs(num_heads: int, num_kv_heads: int, seq_len: int, head_dim: int = MODEL_7B["head_dim"], *,
                  device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoding step's tensors: ``q (1, H, 1, D)`` and cached ``k, v (1, Hkv, S, D)``,
    random normal from a generator seeded with ``seed``."""
    if num_kv_heads not in valid_kv_heads(num_heads):
        raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, num_heads, 1, head_dim, generator=g)  # (1, H, 1, D)
    k = torch.randn(1, num_kv_heads, seq_len, head_dim, generator=g)  # (1, Hkv, S, D)
    v = torch.randn(1, num_kv_heads, seq_len, head_dim, generator=g)  # (1, Hkv, S, D)
    return q.to(device=device, dtype=dtype), k.to(device=device, dtype=dtype), v.to(device=device, dtype=dtype)


def decode_key(num_heads: int, num_kv_heads: int, bench_len: int, device: str = "cpu") -> tuple:
    """The key of one timing: ``(H, Hkv, cached keys timed, device)``."""
    return (num_heads, num_kv_heads, bench_len, str(device))


def measure_decode(num_heads: int, seq_len: int, kv_options: Sequence[int] | None = None, *,
                   head_dim: int = MODEL_7B["head_dim"], device: str | torch.device = "cpu", rounds: int = 5,
                   threads: int | None = 1, seed: int = 0) -> dict[tuple, float]:
    """Seconds for one decoding step's attention (:func:`attnbook.mha.grouped_decode_attention`,
    one query per head over ``seq_len // BENCH_DIVISOR`` cached keys, float32) for
    each number of key/value heads in ``kv_options`` (default: every distinct
    divisor of ``num_heads``, largest first). The options are timed together,
    interleaved, fastest of ``rounds`` (:func:`attnbook.measure.time_calls`, which synchronises the
    device), with ``threads`` torch threads on a CPU (restored afterwards).
    Returns ``{decode_key(H, Hkv, seq_len // BENCH_DIVISOR, device): seconds}``."""
    check_int("seq_len", seq_len)
    if kv_options is None:
        kv_options = valid_kv_heads(num_heads)[::-1]
    bench_len = max(1, seq_len // BENCH_DIVISOR)
    device = str(device)
    calls = {}
    for hkv in kv_options:
        q, k, v = decode_inputs(num_heads, hkv, bench_len, head_dim, device=device, seed=seed)
        calls[hkv] = lambda q=q, k=k, v=v: grouped_decode_attention(q, k, v)
    before = torch.get_num_threads()
    if threads is not None and device == "cpu":
        torch.set_num_threads(threads)
    try:
        times = time_calls(calls, rounds, device=device)
    finally:
        torch.set_num_threads(before)
    return {decode_key(num_heads, hkv, bench_len, device): t for hkv, t in times.items()}
