"""Old name of :mod:`attnbook.explorers.gqa` (chapter 9's explorer), kept so that existing code runs.

A thin re-export of the explorer and of what it used to define: :func:`attnbook.mha.grouped_decode_attention`,
:func:`attnbook.kvcache.kv_cache_bytes`, :func:`attnbook.measure.dispatched_ops`.
"""

from .explorers.gqa import (
    BENCH_DIVISOR,
    HEADS,
    KV_CHOICES,
    MODEL,
    SEQ_LENS,
    decode_inputs,
    decode_key,
    gqa_explorer,
    kv_heads,
    measure_decode,
    valid_kv_heads,
)
from .kvcache import kv_cache_bytes
from .measure import dispatched_ops
from .mha import grouped_decode_attention

__all__ = [
    "MODEL",
    "HEADS",
    "KV_CHOICES",
    "SEQ_LENS",
    "BENCH_DIVISOR",
    "valid_kv_heads",
    "kv_heads",
    "kv_cache_bytes",
    "grouped_decode_attention",
    "decode_inputs",
    "decode_key",
    "measure_decode",
    "dispatched_ops",
    "gqa_explorer",
]
