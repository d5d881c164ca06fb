"""The attention-relevant parts of published model configs (six of 2024-2025, six of 2026), and what
their KV caches weigh.

Dimension legend: B batch (sequences), S context length (tokens in a sequence so far), N layers,
H query heads, Hkv key/value heads, D head dim, Dv value head dim.

A model's KV cache is not always "every layer keeps keys and values of every token". The six
configs of :data:`CONFIGS` (chapter 12) show the four kinds of layer that serving code has to budget for:

* ``"full"``: global (full) attention. Keys and values of all S tokens:
  ``2 * Hkv * D`` numbers per token and layer (:func:`attnbook.kvcache.kv_cache_bytes_per_token`).
* ``"sliding"``: local attention over the last ``sliding_window`` tokens. The layer keeps at most
  ``sliding_window`` tokens, so its cache stops growing once S passes the window.
* ``"mla"``: multi-head latent attention (DeepSeek-V2/V3). One compressed latent of ``kv_lora_rank``
  numbers plus one shared rotary key of ``qk_rope_head_dim`` numbers per token and layer, whatever
  the number of heads.
* ``"linear"``: linear attention (Qwen3-Next's Gated DeltaNet). No per-token cache at all: a fixed
  recurrent state of ``linear_num_value_heads * linear_key_head_dim * linear_value_head_dim`` numbers
  plus a short convolution cache of ``linear_conv_kernel_dim`` positions, the same at S = 1 and at S = 10^6.

The six of :data:`CONFIGS_2026` (chapter 14) add four more (:data:`ALL_LAYER_KINDS`):

* ``"sparse_mla"``: DeepSeek Sparse Attention (DeepSeek-V3.2): an MLA layer whose lightning indexer also
  caches one key of ``index_head_dim`` numbers per token, to choose the ``index_topk`` tokens each query reads.
* ``"csa"``: DeepSeek-V4's compressed sparse attention: a sliding window of ``sliding_window`` tokens plus one
  compressed entry per ``csa_compress_rate`` tokens, and the indexer's key (``index_head_dim``) per entry.
* ``"hca"``: DeepSeek-V4's heavily compressed attention: the window plus one entry per ``hca_compress_rate``
  tokens, no indexer.
* ``"shared"``: a layer that reads an earlier layer's keys and values (Gemma 4's ``num_kv_shared_layers``,
  cross-layer KV sharing): it caches nothing of its own.

:func:`kv_cache_by_layer` counts each kind for a config and a context length; :data:`CONFIGS` and
:data:`CONFIGS_2026` hold the published configs (:class:`AttentionConfig`, each with the URL of its Hugging Face
``config.json`` and how its numbers were checked).

Exactly what is counted (each rule follows a cache class of ``transformers`` 5.24, and the tests check
each against that class):

* A sliding-window layer holds ``min(S, sliding_window)`` tokens: what ``transformers``'
  ``StaticSlidingWindowLayer`` (``StaticCache``) allocates, and the size of Mistral's rolling buffer cache.
  ``sliding_window`` counts the query's own token: a query sees itself and the ``sliding_window - 1``
  tokens before it. The default ``DynamicCache`` (``DynamicSlidingWindowLayer``) keeps one token fewer
  between decoding steps (``sliding_window - 1``): the new token's keys and values are concatenated in
  during the step, so the peak is the same ``sliding_window``.
* An MLA layer holds ``kv_lora_rank + qk_rope_head_dim`` numbers per token: what DeepSeek's reference
  inference code caches (``kv_cache`` and ``pe_cache`` in ``inference/model.py``) and what
  ``transformers``' ``DeepseekV3Attention`` writes into its cache (the latent, before ``kv_b_proj``
  expands it into 128 heads' keys and values).
* A linear-attention layer holds a recurrent state of ``(B, linear_num_value_heads,
  linear_key_head_dim, linear_value_head_dim)`` in float32 (``state_dtype_bytes=4``:
  ``transformers``' Gated DeltaNet computes and keeps it in float32 whatever the model's dtype) and a
  convolution cache of ``(B, conv_dim, linear_conv_kernel_dim)`` in the model's dtype, where
  ``conv_dim = 2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads *
  linear_value_head_dim`` (queries, keys and values pass through the short convolution).
* Keys and values (and latents) are ``dtype_bytes`` each (2: bfloat16 or float16, the usual KV cache
  dtype for these models; 1 for an fp8 cache). Multi-token-prediction modules (DeepSeek-V3, Qwen3-Next)
  are not counted: they are not among the ``num_hidden_layers`` layers and hold a cache only when used
  for speculative decoding.
* Where a config's global layers have their own heads (Gemma 4: ``global_head_dim`` 512 and, for the large
  models, ``num_global_key_value_heads``), a ``"full"`` layer counts ``global_num_kv_heads`` heads of
  ``global_head_dim`` (``transformers``' ``Gemma4TextConfig.per_layer_config``).
* ``keys_are_values`` (DeepSeek-V4): the one KV head is read as key and as value, so a token caches one vector,
  not two (``transformers``' ``DeepseekV4HCACache`` points ``values`` at the same tensor as ``keys``). A
  compressed entry is ``head_dim`` numbers; the compressors' partial-window buffers (fewer than the rate's source
  tokens, emptied each time a window closes) are not counted.
* The DSA indexer's keys are counted at ``dtype_bytes`` like the latent (``transformers``' ``update_indexer``
  keeps them in the model's dtype; DeepSeek's inference code stores them in fp8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ._checks import check_int
from .kvcache import kv_cache_bytes_per_token
from .latent import DEEPSEEK_V3_MLA, DEEPSEEK_V3_ROPE

__all__ = [
    "LAYER_KINDS",
    "LAYER_KIND_LABELS",
    "AttentionConfig",
    "CacheRow",
    "LLAMA_3_8B",
    "MISTRAL_7B",
    "GEMMA_3_27B",
    "DEEPSEEK_V3",
    "GPT_OSS_120B",
    "QWEN3_NEXT_80B",
    "CONFIGS",
    "ALL_LAYER_KINDS",
    "DEEPSEEK_V32",
    "DEEPSEEK_V4_FLASH",
    "GEMMA_4_31B",
    "GEMMA_4_E4B",
    "KIMI_LINEAR_48B",
    "QWEN3_5_35B",
    "CONFIGS_2026",
    "ROPE_PARAMETERS",
    "get_config",
    "kv_cache_by_layer",
    "format_bytes",
]

# the kinds of CONFIGS (chapter 12's models; what the KV budget explorer draws), then the four 2026's models add
LAYER_KINDS = ("full", "sliding", "mla", "linear")
ALL_LAYER_KINDS = LAYER_KINDS + ("sparse_mla", "csa", "hca", "shared")
LAYER_KIND_LABELS = {
    "full": "global (full attention)",
    "sliding": "local (sliding window)",
    "mla": "MLA latent",
    "linear": "linear-attention state",
    "sparse_mla": "MLA latent + indexer key",
    "csa": "window + compressed sparse (1 in 4)",
    "hca": "window + heavily compressed (1 in 128)",
    "shared": "shared (reads an earlier layer's KV)",
}
# dtype_bytes -> the torch dtype handed to attnbook.kvcache.kv_cache_bytes_per_token (only its size matters)
_DTYPES = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


@dataclass(frozen=True)
class AttentionConfig:
    """The parts of a model's config that set the size of its KV cache.

    Field names follow the Hugging Face ``config.json`` (``num_key_value_heads`` is ``num_kv_heads``
    here, as in :class:`attnbook.MultiHeadAttention`). ``layer_types`` has one entry per layer, one of
    :data:`LAYER_KINDS`. ``source`` is the URL of the official ``config.json``; ``verified`` says how the
    numbers were checked.
    """

    name: str
    repo: str
    source: str
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    sliding_window: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    index_head_dim: int | None = None
    csa_compress_rate: int | None = None
    hca_compress_rate: int | None = None
    global_num_kv_heads: int | None = None
    global_head_dim: int | None = None
    keys_are_values: bool = False
    verified: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.layer_types, tuple) or not self.layer_types:
            raise TypeError(f"{self.name}: layer_types must be a non-empty tuple of kinds, got {self.layer_types!r}")
        unknown = sorted(set(self.layer_types) - set(ALL_LAYER_KINDS))
        if unknown:
            raise ValueError(f"{self.name}: unknown layer kinds {unknown}; kinds are {ALL_LAYER_KINDS}")
        if not isinstance(self.keys_are_values, bool):
            raise TypeError(f"{self.name}: keys_are_values must be a bool, got {self.keys_are_values!r}")
        for field in ("num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            check_int(f"{self.name}: {field}", getattr(self, field))
        needs = {"sliding": ("sliding_window",), "mla": ("kv_lora_rank", "qk_rope_head_dim"),
                 "linear": ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                            "linear_value_head_dim", "linear_conv_kernel_dim"),
                 "sparse_mla": ("kv_lora_rank", "qk_rope_head_dim", "index_head_dim"),
                 "csa": ("sliding_window", "csa_compress_rate", "index_head_dim"),
                 "hca": ("sliding_window", "hca_compress_rate")}
        for kind, fields in needs.items():
            if kind in self.layer_types:
                for field in fields:
                    if getattr(self, field) is None:
                        raise ValueError(f"{self.name}: {kind} layers need {field}, which is None")
                    check_int(f"{self.name}: {field}", getattr(self, field))
        for field in ("global_num_kv_heads", "global_head_dim"):
            if getattr(self, field) is not None:
                check_int(f"{self.name}: {field}", getattr(self, field))
        if "shared" in self.layer_types and self.layer_types[0] == "shared":
            raise ValueError(f"{self.name}: a shared layer reads an earlier layer's keys and values; layer 0 cannot be one")

    @property
    def num_layers(self) -> int:
        """N, the number of layers (``num_hidden_layers``)."""
        return len(self.layer_types)

    def count(self, kind: str) -> int:
        """How many layers are of ``kind`` (one of :data:`ALL_LAYER_KINDS`)."""
        if kind not in ALL_LAYER_KINDS:
            raise ValueError(f"kind must be one of {ALL_LAYER_KINDS}, got {kind!r}")
        return self.layer_types.count(kind)


@dataclass(frozen=True)
class CacheRow:
    """One kind of layer in a KV cache: ``num_layers`` layers that each hold ``tokens`` tokens (``None``
    for a fixed-size state), ``bytes`` in all (every layer of the kind, the whole batch)."""

    kind: str
    num_layers: int
    tokens: int | None  # for "csa" and "hca": the window's tokens plus the compressed entries
    bytes: int

    @property
    def label(self) -> str:
        """The kind in words, e.g. ``"local (sliding window)"``."""
        return LAYER_KIND_LABELS[self.kind]


def _every(num_layers: int, period: int, other: str, last: str) -> tuple[str, ...]:
    """Layer ``i`` is ``last`` when ``(i + 1) % period == 0``, else ``other``: how ``transformers`` derives
    ``layer_types`` from Gemma 3's ``sliding_window_pattern``, Qwen3-Next's ``full_attention_interval`` and
    gpt-oss's alternation (period 2, starting with a sliding layer)."""
    return tuple(last if (i + 1) % period == 0 else other for i in range(num_layers))


_HF = "https://huggingface.co/{}/blob/main/config.json"

LLAMA_3_8B = AttentionConfig(
    name="Llama 3 8B", repo="meta-llama/Meta-Llama-3-8B", source=_HF.format("meta-llama/Meta-Llama-3-8B"),
    layer_types=("full",) * 32, num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=8192,
    verified="num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim "
             "4096 / 32 = 128), max_position_embeddings 8192: read in copies of the official config.json whose "
             "_name_or_path is meta-llama/Meta-Llama-3-8B (one lists head_dim 128); the official file itself was "
             "not reachable (gated repository).",
)

MISTRAL_7B = AttentionConfig(
    name="Mistral 7B v0.1", repo="mistralai/Mistral-7B-v0.1", source=_HF.format("mistralai/Mistral-7B-v0.1"),
    layer_types=("sliding",) * 32, num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=32768,
    sliding_window=4096,
    verified="num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim 128), "
             "sliding_window 4096: transformers' MistralConfig defaults (documented as mistralai/Mistral-7B-v0.1) and "
             "copies of the v0.1 config.json and params.json; max_position_embeddings 32768 from the config.json "
             "copies (transformers' default is 131072); every layer slides "
             "(Jiang et al. 2023, arXiv:2310.06825, rolling buffer cache of 4096). Later versions (v0.2, v0.3) set "
             "sliding_window to null.",
)

GEMMA_3_27B = AttentionConfig(
    name="Gemma 3 27B", repo="google/gemma-3-27b-it", source=_HF.format("google/gemma-3-27b-it"),
    layer_types=_every(62, 6, "sliding", "full"), num_heads=32, num_kv_heads=16, head_dim=128,
    max_position_embeddings=131072, sliding_window=1024,
    verified="text_config: num_hidden_layers 62, num_attention_heads 32, num_key_value_heads 16, head_dim 128, "
             "sliding_window 1024, max_position_embeddings 131072: the gemma3_27b variant of transformers' "
             "convert_gemma3_weights.py and a cached copy of the config; 5 local : 1 global (sliding_window_pattern "
             "6, layers 6, 12, ..., 60 global: 10 global, 52 local) as transformers' Gemma3TextConfig derives it and "
             "as the Gemma 3 report states (arXiv:2503.19786). The official config.json was not reachable (gated).",
)

DEEPSEEK_V3 = AttentionConfig(
    name="DeepSeek-V3", repo="deepseek-ai/DeepSeek-V3", source=_HF.format("deepseek-ai/DeepSeek-V3"),
    layer_types=("mla",) * DEEPSEEK_V3_MLA["num_hidden_layers"], num_heads=DEEPSEEK_V3_MLA["num_attention_heads"],
    num_kv_heads=DEEPSEEK_V3_MLA["num_attention_heads"],
    head_dim=DEEPSEEK_V3_MLA["qk_nope_head_dim"] + DEEPSEEK_V3_MLA["qk_rope_head_dim"], max_position_embeddings=163840,
    kv_lora_rank=DEEPSEEK_V3_MLA["kv_lora_rank"], qk_rope_head_dim=DEEPSEEK_V3_MLA["qk_rope_head_dim"],
    verified="num_hidden_layers 61, num_attention_heads 128, num_key_value_heads 128, kv_lora_rank 512, "
             "qk_rope_head_dim 64, qk_nope_head_dim 128 (head_dim 128 + 64 = 192 for queries and keys), "
             "max_position_embeddings 163840: copies of the config.json (model_type deepseek_v3), transformers' "
             "DeepseekV3Config defaults, and inference/configs/config_671B.json of github.com/deepseek-ai/DeepSeek-V3 "
             "(n_layers 61, kv_lora_rank 512, qk_rope_head_dim 64). The latent cache (kv_cache of kv_lora_rank and "
             "pe_cache of qk_rope_head_dim per token) is that repository's inference/model.py (attn_impl 'absorb').",
)

GPT_OSS_120B = AttentionConfig(
    name="gpt-oss-120b", repo="openai/gpt-oss-120b", source=_HF.format("openai/gpt-oss-120b"),
    layer_types=_every(36, 2, "sliding", "full"), num_heads=64, num_kv_heads=8, head_dim=64,
    max_position_embeddings=131072, sliding_window=128,
    verified="num_hidden_layers 36, num_attention_heads 64, num_key_value_heads 8, head_dim 64, sliding_window 128, "
             "layer_types alternating sliding_attention / full_attention from layer 0, max_position_embeddings "
             "131072: a copy of the 120b config.json (36 layers, 128 experts), transformers' GptOssConfig defaults, "
             "NVIDIA's Megatron-Bridge model page (36 layers, 64 query heads, 8 KV groups, KV channels 64, window "
             "128, alternating) and the model card (arXiv:2508.10925). The official file itself was not seen.",
)

QWEN3_NEXT_80B = AttentionConfig(
    name="Qwen3-Next-80B-A3B", repo="Qwen/Qwen3-Next-80B-A3B-Instruct",
    source=_HF.format("Qwen/Qwen3-Next-80B-A3B-Instruct"),
    layer_types=_every(48, 4, "linear", "full"), num_heads=16, num_kv_heads=2, head_dim=256,
    max_position_embeddings=262144, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4,
    verified="num_hidden_layers 48, full_attention_interval 4 (12 full, 36 Gated DeltaNet), num_attention_heads 16, "
             "num_key_value_heads 2, head_dim 256, linear_num_key_heads 16, linear_num_value_heads 32, "
             "linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4: transformers' "
             "Qwen3NextConfig defaults (documented as Qwen/Qwen3-Next-80B-A3B-Instruct), the model card (48 layers, "
             "12 x (3 Gated DeltaNet + 1 Gated Attention), 16 Q / 2 KV heads of 256, 32 V / 16 QK linear heads of "
             "128, context 262,144) and the config.json of Qwen/Qwen3-Coder-Next (the same architecture). The "
             "official 80B-A3B config.json itself was not seen.",
)

CONFIGS: dict[str, AttentionConfig] = {
    "llama-3-8b": LLAMA_3_8B,
    "mistral-7b-v0.1": MISTRAL_7B,
    "gemma-3-27b": GEMMA_3_27B,
    "deepseek-v3": DEEPSEEK_V3,
    "gpt-oss-120b": GPT_OSS_120B,
    "qwen3-next-80b-a3b": QWEN3_NEXT_80B,
}


# ------------------------------------------------------------------ 2026's models (chapter 14)


def _gemma4_layers(num_layers: int, period: int, num_kv_shared_layers: int) -> tuple[str, ...]:
    """Gemma 4's layer kinds: ``period - 1`` local layers then a global one, repeated (``transformers``'
    ``_DEFAULT_LAYER_TYPES`` in ``convert_gemma4_weights.py``), and the last ``num_kv_shared_layers`` layers
    reading the keys and values of the last earlier layer of their type (``Gemma4TextConfig.kv_sharing_modes``)."""
    kinds = _every(num_layers, period, "sliding", "full")
    first_shared = num_layers - num_kv_shared_layers
    return kinds[:first_shared] + ("shared",) * num_kv_shared_layers


DEEPSEEK_V32 = AttentionConfig(
    name="DeepSeek-V3.2", repo="deepseek-ai/DeepSeek-V3.2-Exp", source=_HF.format("deepseek-ai/DeepSeek-V3.2-Exp"),
    layer_types=("sparse_mla",) * 61, num_heads=128, num_kv_heads=128, head_dim=192, max_position_embeddings=163840,
    kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128,
    verified="transformers 5.24's DeepseekV32Config defaults (documented as deepseek-ai/DeepSeek-V3.2-Exp): "
             "num_hidden_layers 61, num_attention_heads 128, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim "
             "128, max_position_embeddings 163840, every layer 'indexed_attention', index_n_heads 64, index_head_dim "
             "128, index_topk 2048: DeepSeek-V3's MLA with a lightning indexer, whose key cache "
             "(DynamicIndexedLayer, cache.update_indexer) holds index_head_dim numbers per token beside the latent. "
             "The official config.json itself was not seen.",
)

DEEPSEEK_V4_FLASH = AttentionConfig(
    name="DeepSeek-V4-Flash", repo="deepseek-ai/DeepSeek-V4-Flash-Base",
    source=_HF.format("deepseek-ai/DeepSeek-V4-Flash-Base"),
    layer_types=("sliding",) * 2 + ("csa", "hca") * 20 + ("csa",), num_heads=64, num_kv_heads=1, head_dim=512,
    max_position_embeddings=1048576, sliding_window=128, index_head_dim=128, csa_compress_rate=4,
    hca_compress_rate=128, keys_are_values=True,
    verified="num_hidden_layers 43, num_attention_heads 64, num_key_value_heads 1, head_dim 512, qk_rope_head_dim 64, "
             "sliding_window 128, index_n_heads 64, index_head_dim 128, index_topk 512, o_groups 8, o_lora_rank 1024, "
             "max_position_embeddings 1048576: transformers 5.24's DeepseekV4Config defaults (documented as "
             "deepseek-ai/DeepSeek-V4-Flash-Base) and a copy of the Flash-Base config.json in a serving engine's tests, "
             "whose compress_ratios are 0, 0, then 4 and 128 alternating up to layer 42 (4), then a trailing 0 for the "
             "MTP layer: 2 sliding-window layers, 21 compressed sparse (rate 4, "
             "compress_rates['compressed_sparse_attention']), 20 heavily compressed (rate 128). The official "
             "config.json itself was not seen.",
)

GEMMA_4_31B = AttentionConfig(
    name="Gemma 4 31B", repo="google/gemma-4-31B-it", source=_HF.format("google/gemma-4-31B-it"),
    layer_types=_gemma4_layers(60, 6, 0), num_heads=32, num_kv_heads=16, head_dim=256,
    max_position_embeddings=262144, sliding_window=1024, global_num_kv_heads=4, global_head_dim=512,
    verified="the gemma-4-31b variant of transformers' convert_gemma4_weights.py: num_hidden_layers 60, layer_types "
             "5 sliding + 1 full repeated 10 times, num_attention_heads 32, num_key_value_heads 16, "
             "num_global_key_value_heads 4, attention_k_eq_v true (the global layers' values are their keys' "
             "projection, still cached as their own tensor), num_kv_shared_layers 0, sliding_window 1024, "
             "max_position_embeddings 262144; head_dim 256 and global_head_dim 512 are Gemma4TextConfig's defaults. "
             "The official config.json itself was not seen.",
)

GEMMA_4_E4B = AttentionConfig(
    name="Gemma 4 E4B", repo="google/gemma-4-E4B-it", source=_HF.format("google/gemma-4-E4B-it"),
    layer_types=_gemma4_layers(42, 6, 18), num_heads=8, num_kv_heads=2, head_dim=256,
    max_position_embeddings=131072, sliding_window=512, global_num_kv_heads=2, global_head_dim=512,
    verified="the gemma-4-e4b variant of transformers' convert_gemma4_weights.py: num_hidden_layers 42, layer_types "
             "5 sliding + 1 full repeated 7 times, num_attention_heads 8, num_key_value_heads 2 (the global layers "
             "too: num_global_key_value_heads None), global_head_dim 512, num_kv_shared_layers 18 (layers 24-41 read "
             "the keys and values of layers 22 and 23, Gemma4TextConfig.kv_sharing_modes); head_dim 256, "
             "sliding_window 512 and max_position_embeddings 131072 are Gemma4TextConfig's defaults. The official "
             "config.json itself was not seen.",
)

KIMI_LINEAR_48B = AttentionConfig(
    name="Kimi Linear 48B-A3B", repo="moonshotai/Kimi-Linear-48B-A3B-Instruct",
    source=_HF.format("moonshotai/Kimi-Linear-48B-A3B-Instruct"),
    layer_types=tuple("mla" if i in (4, 8, 12, 16, 20, 24, 27) else "linear" for i in range(1, 28)),
    num_heads=32, num_kv_heads=32, head_dim=192, max_position_embeddings=1048576, kv_lora_rank=512,
    qk_rope_head_dim=64, linear_num_key_heads=32, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4,
    verified="num_hidden_layers 27, linear_attn_config kda_layers 1-3, 5-7, ..., 25, 26 (20 Kimi Delta Attention "
             "layers) and full_attn_layers 4, 8, 12, 16, 20, 24, 27 (7 MLA layers, 1-based), num_heads 32, head_dim "
             "128, short_conv_kernel_size 4, num_attention_heads 32, kv_lora_rank 512, qk_rope_head_dim 64 (the "
             "latent and rotary key its MLA caches, kv_a_proj_with_mqa), qk_nope_head_dim 128, model_max_length "
             "1048576: a copy of the config.json in a serving engine's tests, and transformers 5.24's "
             "KimiLinearConfig (documented as moonshotai/Kimi-Linear-48B-A3B-Instruct; its defaults agree). The "
             "official file itself was not seen.",
)

QWEN3_5_35B = AttentionConfig(
    name="Qwen3.5-35B-A3B", repo="Qwen/Qwen3.5-35B-A3B", source=_HF.format("Qwen/Qwen3.5-35B-A3B"),
    layer_types=_every(40, 4, "linear", "full"), num_heads=16, num_kv_heads=2, head_dim=256,
    max_position_embeddings=32768, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4,
    verified="transformers 5.24's Qwen3_5MoeTextConfig defaults (documented as Qwen/Qwen3.5-35B-A3B): "
             "num_hidden_layers 40, full_attention_interval 4 (10 full, 30 Gated DeltaNet), num_attention_heads 16, "
             "num_key_value_heads 2, head_dim 256, linear_num_key_heads 16, linear_num_value_heads 32, "
             "linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4; "
             "max_position_embeddings 32768 is that class's default, not a number read from the release. The "
             "official config.json itself was not seen.",
)

CONFIGS_2026: dict[str, AttentionConfig] = {
    "deepseek-v3.2": DEEPSEEK_V32,
    "deepseek-v4-flash": DEEPSEEK_V4_FLASH,
    "gemma-4-31b": GEMMA_4_31B,
    "gemma-4-e4b": GEMMA_4_E4B,
    "kimi-linear-48b-a3b": KIMI_LINEAR_48B,
    "qwen3.5-35b-a3b": QWEN3_5_35B,
}


def get_config(config: str | AttentionConfig) -> AttentionConfig:
    """``config`` itself, or the one of :data:`CONFIGS` or :data:`CONFIGS_2026` called ``config`` (e.g.
    ``"gemma-3-27b"``, ``"deepseek-v4-flash"``)."""
    if isinstance(config, AttentionConfig):
        return config
    if not isinstance(config, str):
        raise TypeError(f"config must be a name of CONFIGS or an AttentionConfig, got {type(config).__name__}")
    known = {**CONFIGS, **CONFIGS_2026}
    if config not in known:
        raise ValueError(f"unknown config {config!r}; known configs: {', '.join(known)}")
    return known[config]


def kv_cache_by_layer(config: str | AttentionConfig, context_len: int, *, dtype_bytes: int = 2, batch: int = 1,
                      state_dtype_bytes: int = 4) -> list[CacheRow]:
    """The KV cache of ``batch`` sequences of ``context_len`` tokens (S) each, split by kind of layer.

    Returns one :class:`CacheRow` per kind present in ``config`` (a name of :data:`CONFIGS` or
    :data:`CONFIGS_2026`, or an :class:`AttentionConfig`), in the order of :data:`ALL_LAYER_KINDS`; the total is ``sum(r.bytes for r in rows)``.
    Keys, values, latents and convolution states take ``dtype_bytes`` bytes per number (1, 2, 4 or 8);
    the linear layers' recurrent state ``state_dtype_bytes`` (4: float32, as ``transformers`` keeps it).
    See the module docstring for what each kind holds; full and sliding layers are counted with
    :func:`attnbook.kvcache.kv_cache_bytes_per_token`. ``context_len`` may exceed the model's
    ``max_position_embeddings`` (the count goes on; the model was not trained for it).
    """
    cfg = get_config(config)
    S = check_int("context_len", context_len)
    B = check_int("batch", batch)
    for name, size in (("dtype_bytes", dtype_bytes), ("state_dtype_bytes", state_dtype_bytes)):
        check_int(name, size)
        if size not in _DTYPES:
            raise ValueError(f"{name} must be one of {sorted(_DTYPES)} (bytes per number), got {size!r}")
    dtype = _DTYPES[dtype_bytes]
    rows = []
    # bytes per token of one layer's keys and values (halved where the one KV head is read as both)
    half = 2 if cfg.keys_are_values else 1
    kv_local = kv_cache_bytes_per_token(1, cfg.num_kv_heads, cfg.head_dim, dtype) // half
    for kind in ALL_LAYER_KINDS:
        n = cfg.count(kind)
        if n == 0:
            continue
        if kind == "full":
            heads = cfg.global_num_kv_heads or cfg.num_kv_heads
            size = B * S * kv_cache_bytes_per_token(n, heads, cfg.global_head_dim or cfg.head_dim, dtype) // half
            rows.append(CacheRow(kind, n, S, size))
        elif kind == "sliding":
            tokens = min(S, cfg.sliding_window or S)
            rows.append(CacheRow(kind, n, tokens, B * n * tokens * kv_local))
        elif kind == "shared":
            rows.append(CacheRow(kind, n, 0, 0))
        elif kind == "sparse_mla":
            assert cfg.kv_lora_rank and cfg.qk_rope_head_dim and cfg.index_head_dim  # checked by AttentionConfig
            per_token = (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim) * dtype_bytes
            rows.append(CacheRow(kind, n, S, B * S * n * per_token))
        elif kind in ("csa", "hca"):
            rate = cfg.csa_compress_rate if kind == "csa" else cfg.hca_compress_rate
            assert cfg.sliding_window is not None and rate is not None  # checked by AttentionConfig
            window = min(S, cfg.sliding_window)
            entries = S // rate  # one entry per closed window of `rate` tokens
            entry = cfg.num_kv_heads * cfg.head_dim * dtype_bytes
            if kind == "csa":
                assert cfg.index_head_dim is not None
                entry += cfg.index_head_dim * dtype_bytes  # the indexer's key of each compressed entry
            rows.append(CacheRow(kind, n, window + entries, B * n * (window * kv_local + entries * entry)))
        elif kind == "mla":
            assert cfg.kv_lora_rank is not None and cfg.qk_rope_head_dim is not None  # checked by AttentionConfig
            per_token = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * dtype_bytes  # one latent + one rotary key
            rows.append(CacheRow(kind, n, S, B * S * n * per_token))
        else:
            assert (cfg.linear_num_key_heads and cfg.linear_num_value_heads and cfg.linear_key_head_dim
                    and cfg.linear_value_head_dim and cfg.linear_conv_kernel_dim)  # checked by AttentionConfig
            state = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * state_dtype_bytes
            conv_dim = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                        + cfg.linear_num_value_heads * cfg.linear_value_head_dim)
            conv = conv_dim * cfg.linear_conv_kernel_dim * dtype_bytes
            rows.append(CacheRow(kind, n, None, B * n * (state + conv)))
    return rows


def format_bytes(n: float) -> str:
    """A byte count in binary units, three significant figures: ``"128 KiB"``, ``"1 GiB"``, ``"416 MiB"``."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        raise TypeError(f"n must be a number of bytes, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"  # 1000-1023: no "1.02e+03"
    return f"{n:.0f} B"


# The released models' RoPE, per layer type, in transformers 5.x's ``rope_parameters`` form (what
# :func:`attnbook.positional.rope_frequencies` takes), with the rotated width and the context lengths. Read from
# their config.json: DeepSeek-V3's ``rope_scaling`` (YaRN x40 from 4096, max_position_embeddings 163840, the
# 64-wide rope part of its keys); gpt-oss-120b's (YaRN x32 from 4096 with truncate false, rope_theta 150000,
# head_dim 64, every layer; the same dict is transformers' GptOssConfig default); Gemma 3 27B's (rope_scaling
# linear x8 with rope_theta 1e6, which transformers applies to the global layers only, and
# rope_local_base_freq 1e4, plain, for the local ones; head_dim 128, max_position_embeddings 131072).
ROPE_PARAMETERS: dict[str, dict[str, Any]] = {
    "deepseek-v3": {"rotary_dim": 64, "max_position_embeddings": 163840,
                    "full_attention": dict(DEEPSEEK_V3_ROPE)},
    "gpt-oss-120b": {"rotary_dim": 64, "max_position_embeddings": 131072,
                     "full_attention": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                        "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                        "beta_slow": 1.0, "truncate": False}},
    "gemma-3-27b": {"rotary_dim": 128, "max_position_embeddings": 131072,
                    "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
}
