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

Many sequences in one pool, vLLM's paged attention: :class:`BlockPool` (fixed-size blocks, a free list,
reference counts, cached prompt blocks kept for reuse and evicted least recently used first) and
:class:`PagedKVCache` (a block table per sequence, blocks taken as it grows and returned when it ends; prompt
prefixes found again by the hash of each full block, :func:`prefix_block_hashes`, as vLLM v1's automatic
prefix caching does; :meth:`PagedKVCache.fork` shares a sequence with copy-on-write, the 2023 paper's design);
:func:`paged_attention` attends over the pages through the block tables, without gathering a copy;
:func:`simulate_requests` plays a stream of requests through them and compares the memory held with
preallocating ``max_len`` per request.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
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


# ----------------------------------------------------------------------------- a paged cache
#
# Shapes here: a pool holds `num_blocks` blocks of `block_size` token positions each, keys and values
# (num_blocks, Hkv, block_size, D); a sequence of S tokens owns ceil(S / block_size) of them, listed in order
# in its block table. (The spelled-out names stand for the pool's two sizes; no new legend letter.)

__all__ += ["BlockPool", "PagedKVCache", "OutOfBlocksError", "PagedSimulation", "simulate_requests",
            "prefix_block_hashes", "paged_attention"]

_SeqId = int | str  # what names a sequence of a PagedKVCache: an int or a str (a request id)


class OutOfBlocksError(ValueError):
    """The pool has fewer free blocks than a write needs. ``needed`` and ``free`` say how many; nothing was
    written (a :meth:`PagedKVCache.append` that does not fit changes nothing)."""

    def __init__(self, message: str, needed: int, free: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free


def _check_seq_id(seq_id: object) -> _SeqId:
    if isinstance(seq_id, bool) or not isinstance(seq_id, (int, str)):
        raise TypeError(f"seq_id must be an int or a str, got {type(seq_id).__name__} {seq_id!r}")
    return seq_id


class BlockPool:
    """Fixed-size blocks of key/value memory for one attention layer, handed out one at a time.

    ``k`` and ``v`` are ``(num_blocks, Hkv, block_size, D)`` tensors (zeros at first), allocated once: block
    ``b`` holds ``block_size`` consecutive token positions of one sequence, ``k[b]`` being ``(Hkv, block_size,
    D)``. A free list (a stack: the block freed last is handed out first; a new pool hands out 0, 1, 2, ...)
    and a reference count per block say which blocks are in use and by how many sequences:
    :meth:`allocate` takes a free block (count 1), :meth:`share` adds a reader (count + 1), :meth:`release`
    drops one and returns the block to the free list when its count reaches 0.

    This is vLLM's block allocator in miniature (Kwon et al. 2023, "Efficient Memory Management for Large
    Language Model Serving with PagedAttention"); vLLM keeps one block table for all layers and one such
    pair of tensors per layer. Keys and values share the head dim D here.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, 1)
        self.block_size = check_int("block_size", block_size, 1)
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1)
        self.head_dim = check_int("head_dim", head_dim, 1)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} {dtype!r}")
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"device must be a str or a torch.device, got {type(device).__name__} {device!r}")
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (num_blocks, Hkv, block_size, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (num_blocks, Hkv, block_size, D)
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() hands out 0, 1, 2, ... first
        self._refs = [0] * num_blocks
        # prefix caching: full blocks named by the hash of their tokens and of every token before them
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free blocks that still hold a cached prefix, LRU first
        self.num_evictions = 0
        """Cached blocks taken back for other tokens because no uncached block was free (least recently used first)."""

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def num_free(self) -> int:
        """Blocks no sequence reads (reference count 0), which :meth:`allocate` can hand out: those on the free
        list and the cached ones kept for reuse (:attr:`num_cached_free`)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a cached full block of some prompt: a later request with that prefix
        takes them back (:meth:`take_cached`) instead of computing it again, until they are evicted."""
        return len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks in use (reference count > 0): ``num_blocks - num_free``."""
        return self.num_blocks - self.num_free

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token's keys and values: ``2 * Hkv * D * itemsize``."""
        return 2 * self.num_kv_heads * self.head_dim * self.k.element_size()

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block's keys and values: ``block_size * bytes_per_token``."""
        return self.block_size * self.bytes_per_token

    def __repr__(self) -> str:
        return (f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"used={self.num_used}, free={self.num_free})")

    def _check_block(self, block: object) -> int:
        block = check_int("block", block, 0, self.num_blocks - 1)
        if self._refs[block] == 0:
            raise ValueError(f"block {block} is free (reference count 0): allocate it first")
        return block

    def ref_count(self, block: int) -> int:
        """How many sequences' block tables list ``block`` (0: it is free)."""
        return self._refs[check_int("block", block, 0, self.num_blocks - 1)]

    def allocate(self) -> int:
        """Take a free block (its reference count becomes 1): one that holds no cached prefix if there is one,
        else the least recently freed cached block, whose prefix is then forgotten (evicted);
        :class:`OutOfBlocksError` when none is left."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)  # least recently used
            del self._block_of[self._hash_of.pop(block)]
            self.num_evictions += 1
        else:
            raise OutOfBlocksError(f"the pool is out of blocks: 1 needed, 0 free of {self.num_blocks}", 1, 0)
        self._refs[block] = 1
        return block

    def is_cached(self, block: int) -> bool:
        """Whether ``block`` holds a cached prefix (a full block named by its hash): such a block is never
        written again, a sequence that would write into it copies it first."""
        return check_int("block", block, 0, self.num_blocks - 1) in self._hash_of

    def cached_block(self, block_hash: bytes) -> int | None:
        """The block that holds the full block of tokens named ``block_hash`` (see
        :meth:`PagedKVCache.add_sequence`), in use or free but not yet evicted; None when there is none."""
        return self._block_of.get(block_hash)

    def take_cached(self, block: int) -> None:
        """One more sequence reads the cached ``block``: its reference count goes up by 1, and a free one
        leaves the eviction queue."""
        block = check_int("block", block, 0, self.num_blocks - 1)
        if block not in self._hash_of:
            raise ValueError(f"block {block} holds no cached prefix")
        self._evictable.pop(block, None)
        self._refs[block] += 1

    def register(self, block: int, block_hash: bytes) -> None:
        """Record that the in-use, full ``block`` holds the tokens named ``block_hash``; a hash already cached
        in another block (two requests computed the same prefix at once) keeps that block."""
        block = self._check_block(block)
        if block_hash not in self._block_of and block not in self._hash_of:
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash

    def share(self, block: int) -> None:
        """One more sequence reads ``block`` (which must be in use): its reference count goes up by 1."""
        self._refs[self._check_block(block)] += 1

    def release(self, block: int) -> bool:
        """One sequence drops ``block``; when no sequence is left it is free again (its contents stay until it
        is written again): a block holding a cached prefix joins the end of the eviction queue (most recently
        used), any other the free list. Returns whether it was freed."""
        block = self._check_block(block)
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)
            return True
        return False


class PagedKVCache:
    """The keys and values of many sequences of one attention layer, in the blocks of a :class:`BlockPool`.

    Each sequence (named by an int or str ``seq_id``) has a **block table**, the list of its blocks in
    order: token ``i`` sits in block ``table[i // block_size]`` at position ``i % block_size``. A sequence
    takes a new block only when its last one is full, so memory grows with the tokens actually stored, not
    with a ``max_len`` reserved up front (:class:`StaticKVCache`), and at most ``block_size - 1`` positions
    of each sequence's last block are empty (:meth:`waste_bytes`). Blocks need not be adjacent: a finished
    sequence's blocks go back to the pool (:meth:`free`) and any other sequence reuses them.

    * :meth:`add_sequence` starts a sequence; :meth:`append` writes new keys and values ``(Hkv, T_new, D)``
      after its cached ones (prefill: the whole prompt; decoding: one token);
    * :meth:`gather` returns one sequence's keys and values ``(1, Hkv, S, D)``; :meth:`gather_batch` those of
      several sequences of different lengths, right-padded to the longest, with the padding mask
      ``(B, 1, 1, S)`` (True = may attend) to decode them in one batch;
    * :meth:`add_sequence` with ``prompt_ids`` is automatic prefix caching (vLLM v1's; SGLang's radix cache
      matches prefixes with a tree instead): every full block of a prompt is named by a hash of its tokens
      and of the blocks before it, a new request takes the leading blocks already cached (by a live sequence,
      or freed and kept until evicted, least recently used first) and computes the rest, its last prompt
      token always included;
    * :meth:`fork` makes a sequence that shares the first tokens of another (parallel sampling, beam search;
      the 2023 vLLM paper's copy-on-write): the blocks are shared (reference counted) and the first write into
      a shared block that is not full copies it, so each sequence sees its own tokens.

    A gather copies the blocks into contiguous tensors; :func:`paged_attention` (and vLLM's PagedAttention
    kernel) instead reads the blocks in place through the block table.

    Errors: an unknown or freed ``seq_id`` raises ``ValueError`` naming it (writing to a freed sequence is
    a wrong value, not a missing key); a write that needs more blocks than are free raises
    :class:`OutOfBlocksError` (a ``ValueError``) naming both counts and changes nothing; a wrong type raises
    ``TypeError``, a wrong shape ``ValueError`` naming the shapes.
    """

    def __init__(self, pool: BlockPool) -> None:
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        self.pool = pool
        self.num_copies = 0
        """Copy-on-write copies made so far (each one a block copied before a write into a shared block)."""
        self._tables: dict[_SeqId, list[int]] = {}
        self._lengths: dict[_SeqId, int] = {}
        self._prompt_hashes: dict[_SeqId, list[bytes]] = {}  # the hash of each full block of a sequence's prompt
        self.num_hit_tokens = 0
        """Prompt tokens found cached so far by :meth:`add_sequence` (not computed again)."""

    # ------------------------------------------------------------------ sequences

    def __len__(self) -> int:
        """The number of live sequences."""
        return len(self._tables)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._tables

    @property
    def seq_ids(self) -> list[_SeqId]:
        """The live sequences, in the order they were added."""
        return list(self._tables)

    def __repr__(self) -> str:
        return (f"PagedKVCache(sequences={len(self)}, block_size={self.pool.block_size}, "
                f"blocks used={self.pool.num_used}, free={self.pool.num_free})")

    def _known(self, seq_id: object) -> _SeqId:
        seq_id = _check_seq_id(seq_id)
        if seq_id not in self._tables:
            raise ValueError(f"seq_id {seq_id!r} is not in the cache (never added, or freed): "
                             f"add_sequence({seq_id!r}) first")
        return seq_id

    def _new(self, seq_id: object) -> _SeqId:
        seq_id = _check_seq_id(seq_id)
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id!r} is already in the cache: free({seq_id!r}) it first")
        return seq_id

    def length(self, seq_id: _SeqId) -> int:
        """Tokens cached for ``seq_id``."""
        return self._lengths[self._known(seq_id)]

    def block_table(self, seq_id: _SeqId) -> list[int]:
        """The blocks of ``seq_id``, in token order (a copy)."""
        return list(self._tables[self._known(seq_id)])

    def add_sequence(self, seq_id: _SeqId, prompt_ids: Sequence[int] | torch.Tensor | None = None) -> int:
        """Start sequence ``seq_id`` and return how many of its prompt's tokens are already cached (the caller
        computes and appends only the rest).

        Without ``prompt_ids`` that is 0. With them (the prompt's token ids, a sequence of ints or a 1-d
        integer tensor) this is **automatic prefix caching** as vLLM (v1) does it: each *full* block of the
        prompt is named by a hash of its token ids and of the hash of the block before it (so a name stands
        for the whole prefix up to that block's end, :func:`prefix_block_hashes`); the new sequence takes,
        in order, every leading block whose name the pool has cached (a block of a live sequence, or a freed
        one kept for reuse until :meth:`BlockPool.allocate` evicts it, least recently used first) and stops at
        the first miss. At most ``len(prompt_ids) - 1`` tokens count as found: the last prompt token is always
        computed, since its output gives the first new token, so a prompt that fills its blocks exactly
        recomputes its last block. Only full blocks are shared, and a full block is never written again, so no
        copy is ever needed. The blocks this sequence fills with its prompt are named as it appends them, for
        the requests after it."""
        seq_id = self._new(seq_id)
        hashes = [] if prompt_ids is None else prefix_block_hashes(prompt_ids, self.pool.block_size)
        self._tables[seq_id], self._lengths[seq_id] = [], 0
        if prompt_ids is None:
            return 0
        usable = (len(_prompt_key(prompt_ids)) - 1) // self.pool.block_size  # blocks that may be found cached
        table = self._tables[seq_id]
        for block_hash in hashes[:usable]:
            block = self.pool.cached_block(block_hash)
            if block is None:
                break
            self.pool.take_cached(block)
            table.append(block)
        self._lengths[seq_id] = len(table) * self.pool.block_size
        self._prompt_hashes[seq_id] = hashes
        self.num_hit_tokens += self._lengths[seq_id]
        return self._lengths[seq_id]

    def fork(self, parent_id: _SeqId, child_id: _SeqId, num_tokens: int | None = None) -> None:
        """Start ``child_id`` as a copy of the first ``num_tokens`` tokens of ``parent_id`` (default: all of
        them) without copying any memory: the child's block table lists the parent's first
        ``ceil(num_tokens / block_size)`` blocks, each one's reference count goes up by 1. The first write
        of either sequence into a shared block that has free positions for it copies that block first
        (copy-on-write), and so does a write into a cached prompt block that the child took only part of,
        even after the parent is freed; full shared blocks are only read, and stay stored once."""
        parent_id = self._known(parent_id)
        child_id = self._new(child_id)
        length = self._lengths[parent_id]
        num_tokens = length if num_tokens is None else check_int("num_tokens", num_tokens, 0, length)
        blocks = self._tables[parent_id][:-(-num_tokens // self.pool.block_size)]
        for block in blocks:
            self.pool.share(block)
        self._tables[child_id], self._lengths[child_id] = blocks, num_tokens

    def free(self, seq_id: _SeqId) -> None:
        """Drop ``seq_id``: each of its blocks loses a reader, and those no other sequence reads are free again
        (a cached prompt block stays cached, for reuse, until evicted; the last blocks are released first, so
        they are evicted before the prefix they extend). Writing to it afterwards raises ``ValueError``."""
        seq_id = self._known(seq_id)
        for block in reversed(self._tables.pop(seq_id)):
            self.pool.release(block)
        del self._lengths[seq_id]
        self._prompt_hashes.pop(seq_id, None)

    # ------------------------------------------------------------------ writing

    def _reserve(self, seq_id: _SeqId, n: int) -> int:
        """Make room for ``n`` more tokens of ``seq_id`` (copy-on-write of a last block that is not full for this
        sequence and that another sequence reads or the prefix cache names, new blocks as needed) and count
        them as cached; returns the old length. Writes no keys or values: :meth:`append` writes them,
        :func:`simulate_requests` plays allocation alone."""
        table, length, size = self._tables[seq_id], self._lengths[seq_id], self.pool.block_size
        if n == 0:
            return length
        filled = length % size  # positions used in the last block (0: it is full, or there is none)
        # a partly used last block is copied before writing if another sequence reads it, or if it is a cached
        # full block (a fork that took only part of it): writing in place would change what its hash names
        cow = filled != 0 and (self.pool.ref_count(table[-1]) > 1 or self.pool.is_cached(table[-1]))
        new_blocks = -(-(length + n) // size) - len(table)
        needed = new_blocks + int(cow)
        if needed > self.pool.num_free:
            copy = " (1 of them a copy-on-write of a shared or cached block)" if cow else ""
            raise OutOfBlocksError(
                f"the pool is out of blocks: seq_id {seq_id!r} ({length} tokens cached) needs {needed} more "
                f"block(s){copy} for {n} new tokens, but {self.pool.num_free} of {self.pool.num_blocks} blocks "
                f"of {size} tokens are free; free finished sequences or make a larger pool", needed,
                self.pool.num_free)
        if cow:
            old, new = table[-1], self.pool.allocate()
            self.pool.k[new, :, :filled] = self.pool.k[old, :, :filled]  # (Hkv, filled, D)
            self.pool.v[new, :, :filled] = self.pool.v[old, :, :filled]
            self.pool.release(old)
            table[-1] = new
            self.num_copies += 1
        table.extend(self.pool.allocate() for _ in range(new_blocks))
        self._lengths[seq_id] = length + n
        hashes = self._prompt_hashes.get(seq_id, [])
        for i in range(length // size, min((length + n) // size, len(hashes))):  # prompt blocks filled now
            self.pool.register(table[i], hashes[i])
        return length

    def append(self, seq_id: _SeqId, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the keys and values ``(Hkv, T_new, D)`` of ``T_new`` new tokens of ``seq_id`` after its
        cached ones, taking blocks from the pool as the sequence crosses into them."""
        seq_id = self._known(seq_id)
        pool = self.pool
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        wanted = f"(Hkv, T_new, D) = ({pool.num_kv_heads}, T_new, {pool.head_dim})"
        if (k.dim() != 3 or k.shape != v.shape or k.shape[0] != pool.num_kv_heads or k.shape[2] != pool.head_dim):
            raise ValueError(f"k and v must both be {wanted} for this pool, got {shape_str(k)} and {shape_str(v)}")
        if k.dtype != pool.dtype or v.dtype != pool.dtype:
            raise TypeError(f"new keys and values are {k.dtype} and {v.dtype}, the pool holds {pool.dtype}")
        if k.device != pool.device or v.device != pool.device:
            raise ValueError(f"new keys and values are on {k.device} and {v.device}, the pool on {pool.device}")
        n, size = k.shape[1], pool.block_size
        start = self._reserve(seq_id, n)
        table = self._tables[seq_id]
        done = 0
        while done < n:  # one slice per block the new tokens touch
            pos = start + done
            block, offset = table[pos // size], pos % size
            m = min(size - offset, n - done)
            pool.k[block, :, offset:offset + m] = k[:, done:done + m]  # (Hkv, m, D)
            pool.v[block, :, offset:offset + m] = v[:, done:done + m]
            done += m

    # ------------------------------------------------------------------ reading

    def gather(self, seq_id: _SeqId) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values of ``seq_id``, ``(1, Hkv, S, D)`` each (copied out of its blocks):
        what :meth:`attnbook.MultiHeadAttention.attend` takes, as a :class:`KVCache` gives them."""
        seq_id = self._known(seq_id)
        k, v, _ = self._gather([seq_id])
        return k, v

    def gather_batch(self, seq_ids: Sequence[_SeqId]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The keys and values of several sequences, ``(B, Hkv, S, D)`` each with S the longest length,
        right-padded with zeros, and the padding mask ``(B, 1, 1, S)``, True = may attend
        (:func:`attnbook.padding_mask` of the lengths): one decoding step of the whole batch attends with
        ``q (B, H, 1, D)``, each query seeing its own sequence's keys only."""
        if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence):
            raise TypeError(f"seq_ids must be a sequence of seq ids, got {type(seq_ids).__name__}")
        if not seq_ids:
            raise ValueError("seq_ids is empty: gather at least one sequence")
        return self._gather([self._known(s) for s in seq_ids])

    def _gather(self, seq_ids: list[_SeqId]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from .masks import padding_mask

        pool, size = self.pool, self.pool.block_size
        lengths = [self._lengths[s] for s in seq_ids]
        S = max(lengths)
        width = -(-S // size)  # blocks of the longest sequence
        rows = [self._tables[s] + [0] * (width - len(self._tables[s])) for s in seq_ids]  # block 0 pads
        table = torch.tensor(rows, dtype=torch.long, device=pool.device).view(len(seq_ids), width)  # (B, width)
        B = len(seq_ids)
        mask = padding_mask(lengths, S).to(pool.device)  # (B, 1, 1, S)
        out = []
        for blocks in (pool.k, pool.v):
            x = blocks.index_select(0, table.flatten())  # (B * width, Hkv, block_size, D): a copy
            x = x.view(B, width, pool.num_kv_heads, size, pool.head_dim)  # (B, width, Hkv, block_size, D)
            x = x.transpose(1, 2).reshape(B, pool.num_kv_heads, width * size, pool.head_dim)  # (B, Hkv, width * block_size, D)
            x = x[:, :, :S]  # (B, Hkv, S, D)
            for i, n in enumerate(lengths):
                x[i, :, n:] = 0  # zeros past each sequence's end (stale or padding blocks), masked out anyway
            out.append(x)
        return out[0], out[1], mask

    # ------------------------------------------------------------------ accounting

    def _filled(self) -> dict[int, int]:
        """Positions holding a token, per block in use by this cache's sequences (the most any reader
        filled: a shared block's tokens are stored once)."""
        size = self.pool.block_size
        filled: dict[int, int] = {}
        for seq_id, table in self._tables.items():
            length = self._lengths[seq_id]
            for i, block in enumerate(table):
                filled[block] = max(filled.get(block, 0), min(size, length - i * size))
        return filled

    def held_bytes(self) -> int:
        """Bytes of the blocks this cache's sequences hold (each block once, however many share it)."""
        return len(self._filled()) * self.pool.bytes_per_block

    def used_bytes(self) -> int:
        """Bytes of the tokens actually stored in those blocks (a shared token once)."""
        return sum(self._filled().values()) * self.pool.bytes_per_token

    def waste_bytes(self) -> int:
        """``held_bytes() - used_bytes()``: the empty positions at the ends of last blocks (internal
        fragmentation, under ``block_size`` tokens per sequence)."""
        return self.held_bytes() - self.used_bytes()


def _prompt_key(prompt_ids: object) -> tuple[int, ...]:
    """``prompt_ids`` (ints, or a 1-d integer tensor) as a tuple of ints, non-empty."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1 or prompt_ids.dtype.is_floating_point or prompt_ids.dtype == torch.bool:
            raise TypeError(f"prompt_ids must be a 1-d integer tensor, got {shape_str(prompt_ids)} {prompt_ids.dtype}")
        key = tuple(int(i) for i in prompt_ids.tolist())
    elif isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise TypeError(f"prompt_ids must be a sequence of ints or a 1-d tensor, got {type(prompt_ids).__name__}")
    else:
        for i in prompt_ids:
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"prompt_ids must hold ints, got {type(i).__name__} {i!r}")
        key = tuple(prompt_ids)
    if not key:
        raise ValueError("prompt_ids is empty: a prompt has at least one token")
    return key


def prefix_block_hashes(prompt_ids: Sequence[int] | torch.Tensor, block_size: int) -> list[bytes]:
    """The names of the full blocks of a prompt, as automatic prefix caching names them: block i's name is
    ``sha256(name of block i - 1 + its block_size token ids)`` (block 0 after an empty name), so two prompts
    share a block's name exactly when they agree on every token up to that block's end. One name per full
    block, ``len(prompt_ids) // block_size`` of them; a partly filled last block has none."""
    key = _prompt_key(prompt_ids)
    size = check_int("block_size", block_size, 1)
    names, parent = [], b""
    for start in range(0, len(key) - size + 1, size):
        tokens = ",".join(map(str, key[start:start + size])).encode()
        parent = hashlib.sha256(parent + b"|" + tokens).digest()
        names.append(parent)
    return names


def paged_attention(q: torch.Tensor, cache: PagedKVCache, seq_ids: Sequence[_SeqId], *,
                    scale: float | None = None) -> torch.Tensor:
    """Attention of the newest tokens of several sequences over their cached keys and values, read block by
    block through each block table, in place: nothing is gathered into a contiguous copy.

    ``q`` ``(B, H, T, D)``: for each of the B sequences of ``seq_ids``, the queries of its T newest tokens,
    whose keys and values are already appended; they sit at positions ``S_b - T .. S_b - 1`` of its ``S_b``
    cached tokens and attend causally (T = 1: a decoding step; T > 1: a chunk of prefill). H is a multiple of
    the pool's Hkv (grouped-query heads: query head h reads key/value head ``h // (H // Hkv)``). Each block
    ``pool.k[block]`` (a view) adds its scores to an online softmax: a running maximum, sum and weighted sum
    per query, rescaled when the maximum grows (flash attention's recurrence, over pages, as a decoding kernel
    such as vLLM's runs it). Returns ``(B, H, T, D)``, equal to attention over :meth:`PagedKVCache.gather`'s
    keys and values with ``causal_mask(T, S_b, offset=S_b - T)``."""
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence):
        raise TypeError(f"seq_ids must be a sequence of seq ids, got {type(seq_ids).__name__}")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    pool = cache.pool
    if q.dim() != 4 or q.shape[0] != len(seq_ids) or q.shape[3] != pool.head_dim or q.shape[1] % pool.num_kv_heads:
        raise ValueError(f"q must be (B, H, T, D) with B = len(seq_ids) = {len(seq_ids)}, H a multiple of "
                         f"Hkv = {pool.num_kv_heads} and D = {pool.head_dim}, got {shape_str(q)}")
    if q.dtype != pool.dtype or q.device != pool.device:
        raise TypeError(f"q is {q.dtype} on {q.device}, the pool holds {pool.dtype} on {pool.device}")
    B, H, T, D = q.shape
    Hkv, size = pool.num_kv_heads, pool.block_size
    lengths = [cache.length(s) for s in seq_ids]
    if T > min(lengths):
        raise ValueError(f"q has T={T} new tokens per sequence, but a sequence of seq_ids caches only "
                         f"{min(lengths)}: append their keys and values first (lengths {lengths})")
    scale = D ** -0.5 if scale is None else float(scale)
    low = torch.finfo(q.dtype).min
    out = q.new_zeros(B, H, T, D)  # (B, H, T, D)
    for i, (seq_id, n) in enumerate(zip(seq_ids, lengths)):
        qg = q[i].reshape(Hkv, H // Hkv, T, D) * scale  # (Hkv, G, T, D): the query heads of each key/value head
        pos_q = torch.arange(n - T, n, device=q.device)[:, None]  # (T, 1) absolute positions
        m = q.new_full((Hkv, H // Hkv, T), low)  # running maximum
        l_sum = q.new_zeros(Hkv, H // Hkv, T)  # running sum of exp(score - m)
        acc = q.new_zeros(Hkv, H // Hkv, T, D)  # running sum of exp(score - m) v
        for j, block in enumerate(cache.block_table(seq_id)):
            kb, vb = pool.k[block], pool.v[block]  # (Hkv, block_size, D) views into the pool
            pos_k = j * size + torch.arange(size, device=q.device)[None, :]  # (1, block_size)
            allowed = (pos_k <= pos_q) & (pos_k < n)  # (T, block_size): causal, and written positions only
            scores = (qg @ kb[:, None].transpose(-2, -1)).masked_fill(~allowed, low)  # (Hkv, G, T, block_size)
            m_new = torch.maximum(m, scores.amax(-1))
            p = torch.exp(scores - m_new[..., None]) * allowed  # blocked pairs weigh exactly 0
            alpha = torch.exp(m - m_new)
            l_sum = alpha * l_sum + p.sum(-1)
            acc = alpha[..., None] * acc + p @ vb[:, None]  # (Hkv, G, T, D)
            m = m_new
        out[i] = (acc / l_sum.clamp_min(torch.finfo(q.dtype).tiny)[..., None]).reshape(H, T, D)  # (H, T, D)
    return out


# ----------------------------------------------------------------------------- paged memory, simulated


class PagedSimulation(TypedDict):
    """What :func:`simulate_requests` measured, in token positions (times
    :func:`kv_cache_bytes_per_token` for bytes). "held": the positions of the blocks in use; "used": the
    tokens stored in them; "preallocated": ``max_len`` positions per running request, as a
    :class:`StaticKVCache` per request reserves. Means are over the decoding steps."""

    num_requests: int
    batch_size: int
    block_size: int
    max_len: int
    steps: int                       # decoding steps until the last request finished
    mean_running: float              # requests being decoded, on average
    peak_held: int                   # most positions held at any step (paged, no sharing)
    mean_held: float
    mean_used: float                 # tokens stored, on average
    peak_preallocated: int
    mean_preallocated: float
    waste_fraction: float            # (mean_held - mean_used) / mean_held: empty ends of last blocks
    waste_per_request: float         # the same, in positions per running request: about (block_size - 1) / 2
    shared_requests: int             # requests that found some of their prompt cached (prefix caching)
    peak_held_shared: int            # the same stream with prompt sharing
    mean_held_shared: float
    saved_blocks_peak: int           # (peak_held - peak_held_shared) / block_size
    saved_blocks_mean: float
    hit_tokens: int                  # prompt tokens found cached (full blocks, hashed), not computed again
    evictions: int                   # cached free blocks taken back for other tokens (least recently used)


def _check_range(name: str, value: object) -> tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a (low, high) pair of ints, got {type(value).__name__} {value!r}")
    low, high = check_int(f"{name}[0]", value[0], 1), check_int(f"{name}[1]", value[1], 1)
    if low > high:
        raise ValueError(f"{name} must have low <= high, got {value!r}")
    return low, high


def _play(starts: list[int], prompts: list[int], outputs: list[int], common: list[bool], shared_prompt_len: int,
          block_size: int, max_len: int, batch_size: int, share: bool) -> tuple[int, float, int, int, int]:
    """Play the requests' allocations through a :class:`PagedKVCache` (no keys or values written). Request r
    runs steps ``starts[r] .. starts[r] + outputs[r] - 1``, holding ``prompts[r] + j`` tokens at its j-th
    step, and is freed at step ``starts[r] + outputs[r]`` (before that step's allocations). Blocks change
    only when a request starts (its prompt), writes into a new block, or frees its blocks, so those
    are the only events; each grows the request up to the end of its current block. Returns the peak and
    the mean number of blocks in use over the steps, the requests that found cached blocks, the prompt tokens
    found cached and the evictions."""
    import heapq

    per_request = -(-max_len // block_size) + 1
    pool = BlockPool(batch_size * per_request, block_size, 1, 1)  # keys and values of one number: allocation only
    cache = PagedKVCache(pool)
    prompt_key = tuple(range(shared_prompt_len))  # the common prompt's token ids (any ids: only equality counts)
    events: list[tuple[int, int, int]] = []  # (step, kind 0 free / 1 start / 2 grow, request)
    for r, s in enumerate(starts):
        heapq.heappush(events, (s, 1, r))
        heapq.heappush(events, (s + outputs[r], 0, r))
    shared = 0
    peak, area, last_step, held = 0, 0, 0, 0
    while events:
        step, kind, r = heapq.heappop(events)
        if step != last_step:
            area += held * (step - last_step)
            last_step = step
        p, final = prompts[r], prompts[r] + outputs[r] - 1
        if kind == 0:
            cache.free(r)
        elif kind == 1:
            cached = cache.add_sequence(r, prompt_key if share and common[r] else None)
            shared += cached > 0
            if cached < p:
                cache._reserve(r, p - cached)
            if final > p:
                heapq.heappush(events, (step + 1, 2, r))
        else:
            true_len = p + step - starts[r]
            target = min(-(-true_len // block_size) * block_size, final)  # up to the end of its current block
            cache._reserve(r, target - cache.length(r))
            if target < final:
                heapq.heappush(events, (starts[r] + target + 1 - p, 2, r))
        held = pool.num_used
        peak = max(peak, held)
    steps = last_step
    return peak, area / steps, shared, cache.num_hit_tokens, pool.num_evictions


def simulate_requests(num_requests: int = 400, *, prompt_len_range: tuple[int, int] = (16, 512),
                      output_len_range: tuple[int, int] = (16, 512), block_size: int = 16, max_len: int = 1024,
                      batch_size: int = 32, share_fraction: float = 0.25, shared_prompt_len: int = 200,
                      seed: int = 0) -> PagedSimulation:
    """Play a stream of ``num_requests`` requests through a paged cache (allocation only, no attention) and
    compare the memory it holds with preallocating ``max_len`` positions per request.

    Request r draws (``random.Random(seed)``, uniform, bounds included) a prompt length from
    ``prompt_len_range`` and an output length from ``output_len_range``; a share ``share_fraction`` of them
    use one common prompt of ``shared_prompt_len`` tokens instead of their own. ``batch_size`` requests
    are decoded together (continuous batching: a finished request's slot goes to the next one in the
    stream at once). At its start step a request stores its prompt; each step after that one more token;
    it is freed after writing ``prompt + output - 1`` tokens (the last output token is not cached).

    The stream is played twice through :class:`BlockPool` and :class:`PagedKVCache`: without sharing
    (held memory, and the waste inside last blocks), and with the common prompt shared through
    ``add_sequence(prompt_ids=...)`` (automatic prefix caching: hashed full blocks, freed ones kept for reuse
    and evicted least recently used first; the blocks saved, the prompt tokens found cached). Only the common
    prompt's token ids are given, so only it can be found. Deterministic for a seed; the
    lengths drawn do not depend on ``block_size``, so a table over block sizes compares one stream.
    ``ValueError`` when ``max_len`` is shorter than the longest request."""
    import heapq
    import random

    num_requests = check_int("num_requests", num_requests, 1)
    prompt_low, prompt_high = _check_range("prompt_len_range", prompt_len_range)
    output_low, output_high = _check_range("output_len_range", output_len_range)
    block_size = check_int("block_size", block_size, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    shared_prompt_len = check_int("shared_prompt_len", shared_prompt_len, 1)
    seed = check_int("seed", seed, None)
    if isinstance(share_fraction, bool) or not isinstance(share_fraction, (int, float)):
        raise TypeError(f"share_fraction must be a float in [0, 1], got {type(share_fraction).__name__} "
                        f"{share_fraction!r}")
    if not 0.0 <= share_fraction <= 1.0:
        raise ValueError(f"share_fraction must be in [0, 1], got {share_fraction!r}")
    longest_prompt = max(prompt_high, shared_prompt_len) if share_fraction > 0 else prompt_high
    max_len = check_int("max_len", max_len, 1)
    if longest_prompt + output_high - 1 > max_len:
        raise ValueError(f"max_len={max_len} is shorter than the longest request: a prompt of {longest_prompt} "
                         f"and {output_high} output tokens cache {longest_prompt + output_high - 1}")
    rng = random.Random(seed)
    prompts, outputs, common = [], [], []
    for _ in range(num_requests):
        is_common = rng.random() < share_fraction
        p, o = rng.randint(prompt_low, prompt_high), rng.randint(output_low, output_high)
        prompts.append(shared_prompt_len if is_common else p)
        outputs.append(o)
        common.append(is_common)
    slots = [0] * min(batch_size, num_requests)  # the step at which each slot is free again
    starts = []
    for o in outputs:
        start = heapq.heappop(slots)
        starts.append(start)
        heapq.heappush(slots, start + o)
    stream = (starts, prompts, outputs, common, shared_prompt_len, block_size, max_len, batch_size)
    peak, mean, _, _, _ = _play(*stream, share=False)
    if any(common):
        peak_s, mean_s, shared, hits, evictions = _play(*stream, share=True)
    else:
        peak_s, mean_s, shared, hits, evictions = peak, mean, 0, 0, 0
    steps = max(s + o for s, o in zip(starts, outputs))
    running = sum(outputs) / steps
    used = sum(o * p + o * (o - 1) / 2 for p, o in zip(prompts, outputs)) / steps  # sum over steps of p + j
    held = mean * block_size
    return PagedSimulation(
        num_requests=num_requests, batch_size=batch_size, block_size=block_size, max_len=max_len, steps=steps,
        mean_running=running, peak_held=peak * block_size, mean_held=held, mean_used=used,
        peak_preallocated=len(slots) * max_len, mean_preallocated=running * max_len,
        waste_fraction=(held - used) / held, waste_per_request=(held - used) / running,
        shared_requests=shared, peak_held_shared=peak_s * block_size, mean_held_shared=mean_s * block_size,
        saved_blocks_peak=peak - peak_s, saved_blocks_mean=mean - mean_s, hit_tokens=hits, evictions=evictions)
