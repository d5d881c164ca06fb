"""Cross-layer KV sharing (Gemma 4 E2B/E4B): late layers that compute no keys or values and read those of an
earlier layer instead.

Dimension legend (see :mod:`attnbook`):
    B  batch size;  H  query heads;  Hkv  key/value heads;  T  query length (new tokens);  S  key length
    D  head dimension;  E  model dimension;  N  number of layers

Gemma 4's config names the sharing by one number, ``num_kv_shared_layers``: the last that many of its N layers
are *sharing* layers. A sharing layer keeps its query projection, its query norm and its output projection, but
has no ``k_proj``, ``v_proj`` or key norm: it attends over the keys and values of the last earlier layer *of its
own type* (sliding or full) that computes them (:func:`kv_sharing_sources`; ``transformers``'
``Gemma4TextConfig.kv_sharing_modes`` calls that layer the one that "stores" them). In Gemma 4 E4B (42 layers,
18 sharing) layers 24-41 read layer 22 (the last local layer before them) or layer 23 (the last global one), so
only 24 layers hold a cache. The idea is cross-layer attention (CLA; Brandon et al. 2024, "Reducing Transformer
Key-Value Cache Size with Cross-Layer Attention"), where adjacent layers share one cache, and YOCO (Sun et al.
2024, "You Only Cache Once"), where one cache serves the whole second half of the model.

:class:`SharedKVAttention` is :class:`attnbook.llm_attention.LLMAttention` (QK-norm, grouped-query heads, a
sliding window, RoPE in the half-split layout) with what Gemma 4's attention adds:

* ``value_norm``: an RMSNorm without weight over each value head's D features (Gemma 4's ``v_norm``);
* ``scaling=1.0``: Gemma 4 does not divide the scores by sqrt(D) (its normalised q and k bound them);
* ``rope_proportion``: Gemma 4's *proportional* RoPE for its global layers. All D features are paired
  half-split, ``(i, i + D/2)``, the first ``int(rope_proportion * D / 2)`` pairs rotate with frequency
  ``base^(-2i / D)`` and the other pairs with frequency 0 (not at all). This is not ``partial_rotary_factor``,
  which pairs and spaces the frequencies within the rotated features only;
* ``values_from_keys`` (``attention_k_eq_v``, Gemma 4 31B's global layers): no ``v_proj``, the values are the
  key projection's output (before the key norm and RoPE), then ``value_norm``;
* ``kv_shared``: a sharing layer; :meth:`SharedKVAttention.forward` takes the keys and values it reads.

:class:`SharedKVStack` runs N such layers in order and hands each sharing layer the keys and values its source
layer attended over, in a prefill and in decoding: a :class:`SharedKVCache` holds one
:class:`attnbook.kvcache.KVCache` per layer that computes keys and values and none for a sharing layer, so a
sharing layer reads its source layer's cache. :meth:`SharedKVAttention.from_hf` and :meth:`SharedKVStack.from_hf`
copy ``transformers``' ``Gemma4TextAttention`` and ``Gemma4TextModel``; fed the inputs each of the model's attention
layers sees, the outputs equal the model's (float32: within 1e-5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from ._checks import check_int, shape_str
from .core import check_mask
from .kvcache import KVCache
from .llm_attention import LAYER_TYPES, LLMAttention
from .masks import causal_mask, sliding_window_mask
from .mha import merge_heads, split_heads

__all__ = ["kv_sharing_sources", "proportional_rope_frequencies", "SharedKVAttention", "SharedKVCache",
           "SharedKVStack"]


def kv_sharing_sources(layer_types: Sequence[str], num_kv_shared_layers: int) -> list[int | None]:
    """For each of the N layers of a config's ``layer_types``, the index of the layer whose keys and values it
    reads: None for a layer that computes its own, and for each of the last ``num_kv_shared_layers`` layers the
    last layer before them of the same type (``transformers``' ``Gemma4TextConfig.kv_sharing_modes``: that layer
    "stores", these "reuse"). A type with sharing layers but no earlier layer to read raises a ``ValueError``."""
    if isinstance(layer_types, str) or not isinstance(layer_types, Sequence):
        raise TypeError(f"layer_types must be a list of strings (a config's layer_types), got {layer_types!r}")
    types = list(layer_types)
    for i, kind in enumerate(types):
        if kind not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}] = {kind!r} is not a layer type attnbook knows ({', '.join(LAYER_TYPES)})")
    N = len(types)
    shared = check_int("num_kv_shared_layers", num_kv_shared_layers, 0, max(N - 1, 0))
    first = N - shared
    sources: list[int | None] = [None] * N
    for i in range(first, N):
        earlier = [j for j in range(first) if types[j] == types[i]]
        if not earlier:
            raise ValueError(f"layer {i} ({types[i]}) shares keys and values, but no layer before layer {first} "
                             f"is a {types[i]} layer to read them from")
        sources[i] = earlier[-1]
    return sources


def proportional_rope_frequencies(head_dim: int, base: float, rope_proportion: float) -> torch.Tensor:
    """Gemma 4's proportional RoPE: ``(D/2,)`` float64 frequencies of the half-split pairs ``(i, i + D/2)``,
    ``base^(-2i / D)`` for the first ``int(rope_proportion * D / 2)`` pairs and 0 (no rotation) for the rest
    (``transformers``' ``_compute_proportional_rope_parameters``, which computes them in float32)."""
    D = check_int("head_dim", head_dim)
    if D % 2:
        raise ValueError(f"RoPE rotates pairs of features, so head_dim must be even; got {D}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    if isinstance(rope_proportion, bool) or not isinstance(rope_proportion, (int, float)) or not 0 < rope_proportion <= 1:
        raise ValueError(f"rope_proportion must be in (0, 1], got {rope_proportion!r}")
    rotated = int(rope_proportion * D // 2)
    inv_freq = torch.zeros(D // 2, dtype=torch.float64)  # (D/2,)
    inv_freq[:rotated] = 1.0 / float(base) ** (torch.arange(0, 2 * rotated, 2, dtype=torch.float64) / D)
    return inv_freq


class SharedKVAttention(LLMAttention):
    """A Gemma 4 attention layer: :class:`attnbook.llm_attention.LLMAttention` with ``value_norm``,
    ``rope_proportion``, ``values_from_keys`` and ``kv_shared`` (see the module docstring); the other arguments
    are ``LLMAttention``'s. A ``kv_shared`` layer has no ``k_proj``, ``v_proj`` or ``k_norm``.

    ``forward(x, mask=None, *, positions=None, cache=None, shared_kv=None, need_weights=False)`` returns
    ``(out (B, T, E), weights (B, H, T, S) or None, (k, v))``, where ``k`` and ``v`` ``(B, Hkv, S, D)`` are the
    keys and values the layer attended over (its own, or ``shared_kv``): what a sharing layer reading this one
    is handed.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None, head_dim: int | None = None,
                 *, value_norm: bool = False, rope_proportion: float | None = None, values_from_keys: bool = False,
                 kv_shared: bool = False, **llm_attention: Any) -> None:
        for name, flag in (("value_norm", value_norm), ("values_from_keys", values_from_keys),
                           ("kv_shared", kv_shared)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
        for name in ("sinks", "softmax_plus_one", "output_gate"):
            if llm_attention.get(name):
                raise ValueError(f"SharedKVAttention is Gemma 4's attention, which has no {name}")
        if rope_proportion is not None and llm_attention.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("rope_proportion (proportional RoPE) and partial_rotary_factor exclude each other")
        if rope_proportion is not None and llm_attention.get("rope_scaling") is not None:
            raise ValueError("rope_proportion (proportional RoPE) takes no rope_scaling")
        super().__init__(d_model, num_heads, num_kv_heads, head_dim, **llm_attention)
        if rope_proportion is not None:
            if self.rope_base is None:
                raise ValueError("rope_proportion needs RoPE, but rope_base is None (NoPE)")
            self.rope_inv_freq = proportional_rope_frequencies(self.head_dim, self.rope_base, rope_proportion)
        self.rope_proportion = None if rope_proportion is None else float(rope_proportion)
        self.v_norm = nn.RMSNorm(self.head_dim, eps=self.q_norm.eps if self.q_norm is not None else 1e-6,
                                 elementwise_affine=False) if value_norm else None
        self.values_from_keys = values_from_keys
        self.kv_shared = kv_shared
        if kv_shared:  # a sharing layer computes no keys or values: no weights for them
            for name in ("k_proj", "v_proj", "k_norm"):
                delattr(self, name)
        elif values_from_keys:
            delattr(self, "v_proj")

    def extra_repr(self) -> str:
        parts = [super().extra_repr()]
        if self.v_norm is not None:
            parts.append("value_norm=True")
        if self.rope_proportion is not None:
            parts.append(f"rope_proportion={self.rope_proportion}")
        if self.values_from_keys:
            parts.append("values_from_keys=True")
        if self.kv_shared:
            parts.append("kv_shared=True")
        return ", ".join(parts)

    def queries(self, x: torch.Tensor, positions: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """q ``(B, H, T, D)``: projected, normalised (``qk_norm``), rotated."""
        q = split_heads(self.q_proj(self._check_input(x)), self.num_heads)  # (B, H, T, D)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return self.rotate(q, positions)

    def keys_values(
        self, x: torch.Tensor, positions: torch.Tensor | Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's own k and v ``(B, Hkv, T, D)``: k normalised and rotated, v normalised (``value_norm``);
        with ``values_from_keys`` v is the key projection before its norm. A sharing layer has none."""
        if self.kv_shared:
            raise ValueError("this layer is kv_shared: it computes no keys or values (pass shared_kv to forward)")
        x = self._check_input(x)
        k_lin = self.k_proj(x)  # (B, T, Hkv * D)
        k = split_heads(k_lin, self.num_kv_heads)  # (B, Hkv, T, D)
        v = k if self.values_from_keys else split_heads(self.v_proj(x), self.num_kv_heads)  # (B, Hkv, T, D)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        return self.rotate(k, positions), v

    def project(
        self, x: torch.Tensor, positions: torch.Tensor | Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``(B, H, T, D)``, k and v ``(B, Hkv, T, D)`` (a layer that computes its own)."""
        return (self.queries(x, positions), *self.keys_values(x, positions))

    def layer_mask_at(self, T: int, S: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The layer's bool mask ``(T, S)`` for T queries that are the last T of S positions: causal, and local
        when ``sliding_window`` is set (``layer_mask(T)`` is the case S = T)."""
        if self.sliding_window is None:
            return causal_mask(T, S, offset=S - T, device=device)
        return sliding_window_mask(T, self.sliding_window - 1, S, causal=True, offset=S - T, device=device)

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | Sequence[int] | None = None,
        cache: KVCache | None = None,
        shared_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        """Attention of ``x (B, T, E)``, the last T of S positions.

        Args:
            mask: bool, True = may attend, broadcastable to ``(B, H, T, S)`` (padding), combined with the layer's
                own causal (and sliding) mask.
            positions: RoPE's positions of the T tokens, ``(T,)`` or ``(B, 1, T)``; default ``S - T + arange(T)``.
            cache: a layer computing its own keys and values appends them to it and attends over all S.
            shared_kv: a ``kv_shared`` layer's keys and values ``(B, Hkv, S, D)``, those its source layer attended
                over (its source's cache included); required for such a layer, refused by the others.
        """
        x = self._check_input(x)
        B, T, _ = x.shape
        if self.kv_shared:
            if shared_kv is None:
                raise ValueError("this layer is kv_shared: pass shared_kv, the (k, v) of the layer it reads")
            if cache is not None:
                raise ValueError("a kv_shared layer caches nothing: it reads its source layer's cache (no cache here)")
            k, v = _check_shared_kv(shared_kv, B, self.num_kv_heads, self.head_dim, T)
            S = k.shape[2]
            q = self.queries(x, S - T + torch.arange(T, device=x.device) if positions is None else positions)
        else:
            if shared_kv is not None:
                raise ValueError("shared_kv is for a kv_shared layer; this layer computes its own keys and values")
            if cache is not None and not isinstance(cache, KVCache):
                raise TypeError(f"cache must be an attnbook.kvcache.KVCache, got {type(cache).__name__}")
            past = 0 if cache is None else len(cache)
            pos = past + torch.arange(T, device=x.device) if positions is None else positions
            q = self.queries(x, pos)
            k, v = self.keys_values(x, pos)  # (B, Hkv, T, D)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, S, D)
            S = k.shape[2]
        keep = self.layer_mask_at(T, S, device=x.device)  # (T, S)
        if mask is not None:
            check_mask(mask, torch.Size((B, self.num_heads, T, S)))
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be bool (True = may attend), got {mask.dtype}; convert an additive mask "
                                "with attnbook.masks.from_additive")
            keep = keep & mask.to(x.device)  # broadcasts to (B, H, T, S)
        out, weights = self.attend(q, k, v, keep, need_weights)  # (B, H, T, D)
        return self.o_proj(merge_heads(out)), weights, (k, v)  # (B, T, E)

    @classmethod
    def from_hf(cls, module: nn.Module) -> SharedKVAttention:
        """A copy of a ``transformers`` ``Gemma4TextAttention`` (its weights, device and dtype; read by attribute,
        ``transformers`` itself is not imported). Its layer type's RoPE may be plain or proportional (without a
        ``factor``); another kind raises a ``ValueError``."""
        if not isinstance(module, nn.Module) or type(module).__name__ != "Gemma4TextAttention":
            raise TypeError(f"from_hf expects a transformers Gemma4TextAttention, got {type(module).__name__}")
        hf: Any = module
        config: Any = hf.config
        if not getattr(hf, "is_causal", True):
            raise ValueError("this Gemma4TextAttention is bidirectional (use_bidirectional_attention='all'); "
                             "SharedKVAttention is causal")
        rope = dict(config.rope_parameters[hf.layer_type])
        kind = rope.get("rope_type", "default")
        if kind not in ("default", "proportional") or float(rope.get("factor", 1.0)) != 1.0:
            raise ValueError(f"only plain and proportional RoPE (factor 1) are copied, got {rope}")
        proportion = float(rope.get("partial_rotary_factor", 1.0)) if kind == "proportional" else None
        new = cls(
            config.hidden_size, config.num_attention_heads, config.per_layer_config[hf.layer_idx].num_key_value_heads,
            hf.head_dim, qk_norm=True, qk_norm_eps=float(hf.q_norm.eps), value_norm=True, rope_proportion=proportion,
            values_from_keys=bool(hf.use_alternative_attention), kv_shared=bool(hf.is_kv_shared_layer),
            sliding_window=hf.sliding_window, rope_base=float(rope["rope_theta"]), bias=hf.q_proj.bias is not None,
            scaling=float(hf.scaling),
        )
        weight = hf.o_proj.weight
        new = new.to(device=weight.device, dtype=weight.dtype)
        pairs = [("q_proj", "q_proj"), ("o_proj", "o_proj")]
        if not new.kv_shared:
            pairs.append(("k_proj", "k_proj"))
            if not new.values_from_keys:
                pairs.append(("v_proj", "v_proj"))
        with torch.no_grad():
            for mine, theirs in pairs:
                getattr(new, mine).weight.copy_(getattr(hf, theirs).weight)
                if getattr(hf, theirs).bias is not None:
                    getattr(new, mine).bias.copy_(getattr(hf, theirs).bias)
            assert new.q_norm is not None
            new.q_norm.weight.copy_(hf.q_norm.weight)  # Gemma 4's RMSNorm multiplies by its weight (no 1 +)
            if not new.kv_shared:
                assert new.k_norm is not None
                new.k_norm.weight.copy_(hf.k_norm.weight)
        return new


def _check_shared_kv(shared_kv: object, B: int, Hkv: int, D: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(shared_kv, tuple) and len(shared_kv) == 2 and all(isinstance(t, torch.Tensor) for t in shared_kv)):
        raise TypeError(f"shared_kv must be a (k, v) tuple of tensors, got {type(shared_kv).__name__}")
    k, v = shared_kv
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (B, Hkv, D) or t.shape[2] < T:
            raise ValueError(f"shared_kv's {name} must be (B, Hkv, S, D) = ({B}, {Hkv}, S >= {T}, {D}), got {shape_str(t)}")
    if k.shape != v.shape:
        raise ValueError(f"shared_kv's k {shape_str(k)} and v {shape_str(v)} differ in shape")
    return k, v


class SharedKVCache:
    """The KV cache of a :class:`SharedKVStack`: ``layers[i]`` is a :class:`attnbook.kvcache.KVCache` for a layer
    that computes its own keys and values and None for a sharing layer (``sources[i]`` is not None), which reads
    the cache of the layer it shares."""

    def __init__(self, sources: Sequence[int | None]) -> None:
        if isinstance(sources, str) or not isinstance(sources, Sequence):
            raise TypeError(f"sources must be a list of layer indices or None, got {sources!r}")
        self.sources = list(sources)
        self.layers: list[KVCache | None] = [KVCache() if s is None else None for s in self.sources]

    def __len__(self) -> int:
        owned = [c for c in self.layers if c is not None]
        return len(owned[0]) if owned else 0

    @property
    def nbytes(self) -> int:
        """Bytes of every cached key and value (the sharing layers hold none)."""
        return sum(c.nbytes for c in self.layers if c is not None)


class SharedKVStack(nn.Module):
    """N :class:`SharedKVAttention` layers run in order, each ``kv_shared`` layer handed the keys and values of
    its source (``sources[i]``, from :func:`kv_sharing_sources`): the attention of a Gemma 4 decoder.

    ``forward(x, mask=None, *, positions=None, cache=None, next_input=None)`` returns the N layers' outputs
    ``(B, T, E)``. Layer 0 reads ``x``; layer ``i + 1`` reads ``next_input(i, h_i, out_i)``, the rest of the
    decoder layer (norms, MLP, residual), by default ``h_i + out_i``: an attention-only residual stack.
    """

    def __init__(self, layers: Sequence[SharedKVAttention], sources: Sequence[int | None]) -> None:
        super().__init__()
        layers, sources = list(layers), list(sources)
        if not layers or len(layers) != len(sources):
            raise ValueError(f"need one source (or None) per layer: {len(layers)} layers, {len(sources)} sources")
        for i, (layer, src) in enumerate(zip(layers, sources, strict=True)):
            if not isinstance(layer, SharedKVAttention):
                raise TypeError(f"layers[{i}] must be a SharedKVAttention, got {type(layer).__name__}")
            if (src is None) == layer.kv_shared:
                raise ValueError(f"layer {i}: kv_shared={layer.kv_shared} but its source is {src}")
            if src is None:
                continue
            if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < i or sources[src] is not None:
                raise ValueError(f"layer {i} must read an earlier layer that computes its keys and values, got {src!r}")
            owner = layers[src]
            if (owner.num_kv_heads, owner.head_dim, owner.sliding_window) != (
                    layer.num_kv_heads, layer.head_dim, layer.sliding_window):
                raise ValueError(f"layer {i} reads layer {src}, whose keys differ: (Hkv, D, sliding_window) = "
                                 f"{(owner.num_kv_heads, owner.head_dim, owner.sliding_window)} against "
                                 f"{(layer.num_kv_heads, layer.head_dim, layer.sliding_window)}")
        self.layers = nn.ModuleList(layers)
        self.sources = sources

    def new_cache(self) -> SharedKVCache:
        """An empty :class:`SharedKVCache` for this stack."""
        return SharedKVCache(self.sources)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | Sequence[int] | None = None,
        cache: SharedKVCache | None = None,
        next_input: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        if cache is not None:
            if not isinstance(cache, SharedKVCache):
                raise TypeError(f"cache must be a SharedKVCache, got {type(cache).__name__}")
            if cache.sources != self.sources:
                raise ValueError(f"cache was made for sources {cache.sources}, this stack's are {self.sources}")
        if positions is None:
            T = x.shape[1] if isinstance(x, torch.Tensor) and x.dim() == 3 else 0
            past = 0 if cache is None else len(cache)
            positions = past + torch.arange(T, device=x.device if isinstance(x, torch.Tensor) else None)
        kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        outs: list[torch.Tensor] = []
        h = x
        for i, layer in enumerate(self.layers):
            src = self.sources[i]
            if src is None:
                out, _, kv[i] = layer(h, mask, positions=positions, cache=None if cache is None else cache.layers[i])
            else:
                out, _, _ = layer(h, mask, positions=positions, shared_kv=kv[src])
            outs.append(out)
            if i + 1 < len(self.layers):
                h = h + out if next_input is None else next_input(i, h, out)
        return outs

    @classmethod
    def from_hf(cls, model: nn.Module) -> SharedKVStack:
        """The attention layers of a ``transformers`` ``Gemma4TextModel`` (its ``layers[i].self_attn``), copied by
        :meth:`SharedKVAttention.from_hf`, with the sources of its ``layer_types`` and ``num_kv_shared_layers``."""
        hf: Any = model
        if not isinstance(model, nn.Module) or not hasattr(hf, "layers") or not hasattr(hf, "config"):
            raise TypeError(f"from_hf expects a transformers Gemma4TextModel, got {type(model).__name__}")
        config = hf.config
        sources = kv_sharing_sources(config.layer_types, config.num_kv_shared_layers)
        return cls([SharedKVAttention.from_hf(layer.self_attn) for layer in hf.layers], sources)
