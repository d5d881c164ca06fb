"""The attention-relevant parts of six published model configs, and what their KV caches weigh.

Dimension legend: B batch (sequences), S context length (tokens in a sequence so far), N layers,
H query heads, Hkv key/value heads, D head dim, Dv value head dim.

A model's KV cache is not always "every layer keeps keys and values of every token". The six
configs here show the four kinds of layer that serving code has to budget for:

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

:func:`kv_cache_by_layer` counts each kind for a config and a context length; :data:`CONFIGS` holds
the six published configs (:class:`AttentionConfig`, each with the URL of its Hugging Face
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
    "ROPE_PARAMETERS",
    "get_config",
    "kv_cache_by_layer",
    "format_bytes",
]

LAYER_KINDS = ("full", "sliding", "mla", "linear")
LAYER_KIND_LABELS = {
    "full": "global (full attention)",
    "sliding": "local (sliding window)",
    "mla": "MLA latent",
    "linear": "linear-attention state",
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
    verified: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.layer_types, tuple) or not self.layer_types:
            raise TypeError(f"{self.name}: layer_types must be a non-empty tuple of kinds, got {self.layer_types!r}")
        unknown = sorted(set(self.layer_types) - set(LAYER_KINDS))
        if unknown:
            raise ValueError(f"{self.name}: unknown layer kinds {unknown}; kinds are {LAYER_KINDS}")
        for field in ("num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            check_int(f"{self.name}: {field}", getattr(self, field))
        needs = {"sliding": ("sliding_window",), "mla": ("kv_lora_rank", "qk_rope_head_dim"),
                 "linear": ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                            "linear_value_head_dim", "linear_conv_kernel_dim")}
        for kind, fields in needs.items():
            if kind in self.layer_types:
                for field in fields:
                    if getattr(self, field) is None:
                        raise ValueError(f"{self.name}: {kind} layers need {field}, which is None")
                    check_int(f"{self.name}: {field}", getattr(self, field))

    @property
    def num_layers(self) -> int:
        """N, the number of layers (``num_hidden_layers``)."""
        return len(self.layer_types)

    def count(self, kind: str) -> int:
        """How many layers are of ``kind`` (one of :data:`LAYER_KINDS`)."""
        if kind not in LAYER_KINDS:
            raise ValueError(f"kind must be one of {LAYER_KINDS}, got {kind!r}")
        return self.layer_types.count(kind)


@dataclass(frozen=True)
class CacheRow:
    """One kind of layer in a KV cache: ``num_layers`` layers that each hold ``tokens`` tokens (``None``
    for a fixed-size state), ``bytes`` in all (every layer of the kind, the whole batch)."""

    kind: str
    num_layers: int
    tokens: int | None
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


def get_config(config: str | AttentionConfig) -> AttentionConfig:
    """``config`` itself, or the one of :data:`CONFIGS` called ``config`` (e.g. ``"gemma-3-27b"``)."""
    if isinstance(config, AttentionConfig):
        return config
    if not isinstance(config, str):
        raise TypeError(f"config must be a name of CONFIGS or an AttentionConfig, got {type(config).__name__}")
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}; known configs: {', '.join(CONFIGS)}")
    return CONFIGS[config]


def kv_cache_by_layer(config: str | AttentionConfig, context_len: int, *, dtype_bytes: int = 2, batch: int = 1,
                      state_dtype_bytes: int = 4) -> list[CacheRow]:
    """The KV cache of ``batch`` sequences of ``context_len`` tokens (S) each, split by kind of layer.

    Returns one :class:`CacheRow` per kind present in ``config`` (a name of :data:`CONFIGS` or an
    :class:`AttentionConfig`), in the order of :data:`LAYER_KINDS`; the total is ``sum(r.bytes for r in rows)``.
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
    for kind in LAYER_KINDS:
        n = cfg.count(kind)
        if n == 0:
            continue
        if kind in ("full", "sliding"):
            tokens = S if kind == "full" else min(S, cfg.sliding_window or S)
            size = B * tokens * kv_cache_bytes_per_token(n, cfg.num_kv_heads, cfg.head_dim, dtype)
            rows.append(CacheRow(kind, n, tokens, size))
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
