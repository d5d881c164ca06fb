"""Old name of :mod:`attnbook.explorers.efficient` (chapter 8's explorer), kept so that existing code runs.

A thin re-export of the explorer and of what it used to define: the variant registry's helpers now live in
:mod:`attnbook.efficient`, the measuring in :mod:`attnbook.measure`.
"""

from .efficient import NUM_FEATURES, attention_call, lsh_n_buckets, make_inputs
from .explorers.efficient import (
    EXACT_VARIANTS,
    REFERENCES,
    T_VALUES,
    VARIANTS,
    WINDOW_MEANING,
    WINDOWS,
    attended_pairs,
    cost_key,
    efficient_explorer,
    measure_costs,
    pair_picture,
    pair_share,
    sequence_explorer,
)
from .measure import TensorMemoryTracker, crossover, time_calls, tracked_memory

__all__ = [
    "VARIANTS",
    "REFERENCES",
    "EXACT_VARIANTS",
    "WINDOW_MEANING",
    "T_VALUES",
    "WINDOWS",
    "NUM_FEATURES",
    "make_inputs",
    "lsh_n_buckets",
    "attention_call",
    "attended_pairs",
    "pair_picture",
    "pair_share",
    "TensorMemoryTracker",
    "tracked_memory",
    "time_calls",
    "cost_key",
    "measure_costs",
    "crossover",
    "sequence_explorer",
    "efficient_explorer",
]
