"""attnbook: the package behind the interactive course on multi-head attention.

Bool masks are True where a query may attend a key (as in PyTorch's
``F.scaled_dot_product_attention``); float masks are added to the scores.

Submodules, one concept each; every public name has one home, the module
listed here that defines it (or this package, for the names in ``__all__``
below, or a subpackage's ``__init__`` for the names it lists):

* attention: ``core`` (scaled dot-product attention and the one float32 masked
  softmax), ``masks`` (masks and conversions between conventions), ``mha``
  (multi-head, grouped-query and multi-query attention), ``kvcache`` (the KV
  caches, concatenating and preallocated, their size, and the timing of one
  decoding step over them), ``positional`` (sinusoidal, learned, T5 relative,
  RoPE with its linear and YaRN scaling, ALiBi), ``layers`` (Transformer encoder/decoder layers equal to
  PyTorch's), ``efficient`` (sliding window, block sparse, linear, Performer,
  LSH, flash and decayed linear attention, the delta rule, and the registry of variants with
  the pairs each one scores and their measured costs), ``latent`` (multi-head
  latent attention, DeepSeek-V2/V3: the latent cache and absorbed decoding),
  ``sparse_attention`` (DeepSeek Sparse Attention, DeepSeek-V3.2: the lightning
  indexer and top-k selection on top of MLA; equal to Hugging Face's), ``shared_kv``
  (cross-layer KV sharing, Gemma 4 E2B/E4B: late layers that read an earlier layer's keys
  and values and cache nothing; equal to Hugging Face's), ``compressed_attention`` (DeepSeek-V4's
  attention: one KV head read as key and value, a sliding window, compressed sparse and heavily
  compressed entries, grouped output; equal to Hugging Face's), ``triton_attention``
  (FlashAttention-2's forward and backward kernels in Triton, run by Triton's interpreter on a CPU or
  compiled on a GPU, and the bytes they move; imports Triton only when a kernel runs),
  ``configs`` (the attention of published models' configs, six of 2024-2025 and
  six of 2026, and their KV cache by kind of layer), ``llm_attention`` (the attention layer of today's
  decoder LLMs with the switches they differ by: QK-norm, learned sinks,
  softmax-plus-one, an output gate, local and global layers; equal to
  Hugging Face's), ``llm_experiments`` (a toy language model trained on a CPU
  to show attention sinks form and QK-norm bound the logits);
* models: ``tasks`` (``tasks.data``: the vocabulary and the toy tasks;
  ``tasks.models``: the two toy transformers), ``train`` (fit, evaluate,
  attention alignment, and one input's every attention map), ``pretrained``
  (``pretrained.files``: finding and verifying all-MiniLM-L6-v2's files;
  ``pretrained.model``: the model rebuilt from attnbook's modules), ``vision``
  (patches, a small Vision Transformer and its MLP and CNN baselines,
  attention rollout, a decoder that spells a digit's name, the drawing
  pad's soft pen; scikit-learn's digits), ``recall`` (associative
  recall: the task, a one-layer model with softmax, linear or delta-rule
  attention, and its accuracies over seeds), ``circuits`` (what trained heads
  compute: an attention-only transformer, the repeated-sequence task, head
  scores, ablation, path patching, QK/OV circuits, gradient attribution);
* around them: ``measure`` (timing, memory, cost curves, kernel dispatch,
  where a number was measured), ``plotting`` (heatmaps, head grids and
  mosaics, log-scale bars), ``exercises`` (self-checking exercises),
  ``explorers`` (the interactive explorers, interface only: ``explorers.base``,
  the machinery, and one module per family holding its ``<family>_explorer()``
  factory and the choices it offers: ``saturation``, ``heads``, ``masks``,
  ``positions``, ``trained_heads``, ``variants``, ``kv_heads``, ``minilm``,
  ``vit``, ``kv_budget``, ``block_mask``, ``induction``; ``explorers.live``, the live explorers of
  the rendered book: the package's computations exported as ONNX graphs);
* checking anyone's attention: ``testing`` (``testing.check_attention``, an
  invariant battery for any attention function or module);
* private: ``_checks`` (argument checks: TypeError for a wrong type,
  ValueError for a wrong value), ``_compat`` (torch-version flags, the device
  list).

Dimension legend, one meaning per letter in every module:

    B    batch size
    H    number of (query) heads;  Hkv  key/value heads;  G  query heads per key/value head (H / Hkv)
    T    query length (target);    S    key/value length (source)
    L    target length of a toy task, EOS included
    K    key length of the attention block the trained-heads explorer shows (S or L)
    D    head dimension (d_k);     Dv   value head dimension
    Dn, Dr  a latent-attention head's position-free and rotary query/key features (D = Dn + Dr)
    Dc, Dcq latent widths of multi-head latent attention's keys/values and queries (kv/q_lora_rank)
    E    model dimension (d_model); F   feed-forward width;  V  vocabulary size
    N    number of layers
    W    window half-width, or an efficient variant's locality size (block, chunk, tile)
    Sb   keys one query block of sliding-window attention looks at
    m    random features (Performer);  Df  width of a feature map's output;  R  hash rounds (Reformer)
    Cs   chunk length (chunked linear attention, Reformer);  nc  number of chunks
    Cb   positions of one sub-chunk (Kimi delta attention's chunkwise form);  ns  number of sub-chunks
    Gb   query blocks of sliding-window attention computed together;  Kb  key blocks a BigBird query block reads
    Bq, Bk  queries and keys of one flash-attention tile;  BH  batch and heads merged (B * H)
    Dp, Dvp  D and Dv rounded up to a power of two (the sides of a Triton block)
    P    side of a downsampled picture of the (T, S) pairs
    Ih, Iw  image height and width in pixels;  p  patch side;  Th, Tw  rows and columns of the patch grid
    C    number of classes of an image classifier
    M    the state (memory) of linear attention and the delta rule: a (D, Dv) matrix per head, M_t after position t
    Np, Nq  stored (key, value) pairs and queries of an associative-recall sequence;  Nm  models trained side by side
    Hi, Di  heads and head width of a lightning indexer (DeepSeek Sparse Attention);  k  keys each query selects (top-k)
    Rc   compression rate (source tokens per compressed entry, DeepSeek-V4);  Nw  compressed entries (closed windows)
    Go, Ro  groups of a grouped output projection and each group's width (o_groups, o_lora_rank)
"""

from typing import Any

from . import masks
from ._compat import default_device
from .core import scaled_dot_product_attention
from .kvcache import KVCache, StaticKVCache, kv_cache_bytes_per_token
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
    "StaticKVCache",
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
# `attnbook.explorers.saturation_explorer()` works after a plain `import attnbook`.
_LAZY = {"core", "mha", "positional", "kvcache", "layers", "efficient", "tasks", "train", "pretrained", "measure",
         "plotting", "exercises", "explorers", "testing", "vision", "latent",
         "configs", "llm_attention", "llm_experiments", "recall", "sparse_attention", "shared_kv",
         "compressed_attention", "circuits"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy submodules are not in the namespace until first use: list them so that tab completion shows them.
    return sorted(set(globals()) | _LAZY)
