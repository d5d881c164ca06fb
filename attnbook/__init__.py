"""attnbook: the package behind the interactive course on multi-head attention.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
E model dim. Bool masks are True where a query may attend a key.

Submodules: ``core`` (scaled dot-product attention), ``masks``, ``mha``
(multi-head attention), ``positional``, ``widgets`` and ``explorer`` (the
explorers), ``plotting``, ``exercises``, ``testing`` (check any attention
implementation: ``attnbook.testing.check_attention``).
"""

from . import masks
from .core import default_device, scaled_dot_product_attention
from .kvcache import KVCache, kv_cache_bytes_per_token
from .masks import causal_mask, padding_mask, sliding_window_mask
from .mha import MultiHeadAttention, merge_heads, split_heads
from .positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    relative_position_bucket,
    rotary_permutation,
    shift_matrix,
    sinusoidal_encoding,
)

__version__ = "0.1.0"

__all__ = [
    "scaled_dot_product_attention",
    "default_device",
    "masks",
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "MultiHeadAttention",
    "KVCache",
    "kv_cache_bytes_per_token",
    "split_heads",
    "merge_heads",
    "sinusoidal_encoding",
    "apply_rotary",
    "rotary_permutation",
    "alibi_slopes",
    "alibi_bias",
    "shift_matrix",
    "relative_position_bucket",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RelativePositionBias",
]

# Submodules with heavier imports (matplotlib, ipywidgets, tokenizers) load on first use:
# `attnbook.widgets.saturation_explorer()` works after a plain `import attnbook`.
_LAZY = {"widgets", "explorer", "plotting", "exercises", "measure", "efficient", "efficient_explorer", "task_explorer",
         "gqa_explorer", "layers", "tasks",
         "train", "pretrained", "positional", "kvcache", "testing"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
