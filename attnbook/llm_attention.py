"""The attention layer of 2025's decoder LLMs, with the switches the models differ by.

Dimension legend:
    B  batch size
    H  number of query heads (``num_heads``);  Hkv  key/value heads (``num_kv_heads``);  G  H / Hkv
    T  query length;  S  key length (S = T here: the layer attends over its own input)
    D  head dimension (``head_dim``; may differ from E / H, as in Qwen3 and Gemma 3)
    E  model dimension (``d_model``)
    N  number of layers (a config's ``layer_types`` has N entries)

One :class:`LLMAttention` covers the attention of Qwen3, gpt-oss, Qwen3-Next's full-attention layers and
Gemma 3, and copies their weights with :meth:`LLMAttention.from_hf`:

* grouped-query attention (``num_kv_heads``), every model here;
* ``qk_norm``: an RMSNorm over each head's D features of q and of k, before RoPE (Qwen3, Gemma 3, OLMo 2);
* ``sinks``: a learned logit per head appended to each row of scores as one more column, which takes part
  in the softmax and is then dropped, so a row's weights may sum to less than 1 (gpt-oss,
  :func:`softmax_with_sink`); ``softmax_plus_one`` is the same with the logit fixed at 0
  (Miller 2023, "Attention is off by one", :func:`softmax_plus_one`);
* ``output_gate``: ``sigmoid(x W_gate)`` times the attention output, feature by feature, before ``o_proj``
  (Qwen3-Next; Qiu et al. 2025, "Gated attention for large language models");
* ``sliding_window``: a local layer whose query sees itself and the ``sliding_window - 1`` keys before it
  (Hugging Face's meaning of the number), and :func:`layer_masks` / :func:`layer_rope_bases` for a
  config's ``layer_types``, the interleaving of local and global layers (Gemma 3, gpt-oss);
* RoPE in Hugging Face's half-split layout, with ``rope_base`` and ``partial_rotary_factor`` (Qwen3-Next
  rotates only the first quarter of each head's features), stretched for long contexts by ``rope_scaling``
  (linear or YaRN, :func:`attnbook.positional.rope_frequencies`: Gemma 3's global layers, gpt-oss);
  ``scaling`` (Gemma 3's
  ``query_pre_attn_scalar ** -0.5``) and ``attn_logit_softcapping`` (Gemma 2's tanh cap of the scores).

Masks follow the package convention: bool, True = may attend; blocked scores get ``torch.finfo(dtype).min``
and a query row with no key left gets zero weights and a zero output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.types import Device

from ._checks import check_int, check_module_inputs, shape_str
from .core import check_mask, scaled_dot_product_attention
from .masks import causal_mask, sliding_window_mask
from .mha import merge_heads, split_heads
from .positional import apply_rotary, rope_frequencies

__all__ = [
    "LLMAttention",
    "softmax_with_sink",
    "softmax_plus_one",
    "layer_masks",
    "layer_rope_bases",
    "layer_rope_parameters",
    "LAYER_TYPES",
]

#: The two values of a config's ``layer_types`` that :func:`layer_masks` knows.
LAYER_TYPES = ("full_attention", "sliding_attention")


def _check_scores(scores: object) -> torch.Tensor:
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.dtype.is_floating_point:
        raise TypeError(f"scores must be a floating-point tensor, got {scores.dtype}")
    if scores.dim() < 1:
        raise ValueError(f"scores must be (..., S), one row of scores per query, got shape {shape_str(scores)}")
    return scores


def softmax_with_sink(
    scores: torch.Tensor, sink_logits: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Softmax over each row of ``scores`` with one extra logit, the sink, whose weight is then dropped.

    Args:
        scores: ``(..., H, T, S)`` attention logits (already scaled).
        sink_logits: ``(H,)``, one logit per head (gpt-oss's ``sinks``), or a scalar tensor for every head.
        mask: bool, broadcastable to ``scores``, True = may attend; blocked scores get
            ``torch.finfo(dtype).min``.

    Returns:
        weights ``(..., H, T, S)``: ``exp(s_j) / (exp(sink) + sum_j' exp(s_j'))``. A row sums to less than 1;
        what is missing went to the sink, which has no value, so the head can attend to nothing. A row with
        every key blocked gives zeros (all its weight goes to the sink). Computed in at least float32.
    """
    scores = _check_scores(scores)
    if not isinstance(sink_logits, torch.Tensor):
        raise TypeError(f"sink_logits must be a torch.Tensor, got {type(sink_logits).__name__}")
    if sink_logits.dim() == 1:
        if scores.dim() < 3 or sink_logits.shape[0] != scores.shape[-3]:
            raise ValueError(
                f"sink_logits {shape_str(sink_logits)} must have one logit per head: scores are "
                f"{shape_str(scores)} = (..., H, T, S)"
            )
        sink = sink_logits[:, None, None]  # (H, 1, 1)
    elif sink_logits.dim() == 0:
        sink = sink_logits
    else:
        raise ValueError(f"sink_logits must be (H,) or a scalar, got shape {shape_str(sink_logits)}")
    work = torch.promote_types(scores.dtype, torch.float32)
    logits = scores.to(work)
    if mask is not None:
        check_mask(mask, scores.shape)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be bool (True = may attend), got {mask.dtype}")
        logits = logits.masked_fill(~mask.to(logits.device), torch.finfo(work).min)
    column = sink.to(device=logits.device, dtype=work).expand(*logits.shape[:-1], 1)  # (..., H, T, 1)
    weights = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)  # (..., H, T, S + 1)
    return weights[..., :-1].to(scores.dtype)  # (..., H, T, S): the sink's column dropped


def softmax_plus_one(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``exp(s_j) / (1 + sum_j' exp(s_j'))`` over each row of ``scores`` ``(..., S)``: a softmax with an
    implicit extra logit 0 of value zero (Miller 2023, "Attention is off by one"); :func:`softmax_with_sink`
    with every sink logit 0. Same mask convention; a fully blocked row gives zeros."""
    scores = _check_scores(scores)
    return softmax_with_sink(scores, torch.zeros((), dtype=scores.dtype, device=scores.device), mask)


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Plain softmax of ``scores`` ``(B, H, T, S)`` under a bool ``mask``, fully blocked rows zero (the
    convention of :func:`attnbook.scaled_dot_product_attention`, for scores it cannot take: soft-capped)."""
    work = torch.promote_types(scores.dtype, torch.float32)
    blocked_rows = ~mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    weights = torch.softmax(scores.to(work).masked_fill(~mask, torch.finfo(work).min), dim=-1)
    return weights.masked_fill(blocked_rows, 0.0).to(scores.dtype)  # (B, H, T, S)


def _check_sliding_window(sliding_window: object) -> int | None:
    if sliding_window is None:
        return None
    return check_int("sliding_window", sliding_window, 1)


class LLMAttention(nn.Module):
    """Causal self-attention as the decoder LLMs of 2025 write it (Hugging Face's names).

    Args:
        d_model: model dimension E.
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv (grouped-query attention); a divisor of H; default H.
        head_dim: D; default ``d_model // num_heads``. Qwen3 and Gemma 3 decouple it from E / H: the
            projections are ``E -> H * D`` and ``H * D -> E``.
        qk_norm: RMSNorm (``nn.RMSNorm(D)``, weight initialised to 1) on each head's query and key, before
            RoPE. Gemma 3 and Qwen3-Next store the weight as ``w`` and multiply by ``1 + w``;
            :meth:`from_hf` stores ``1 + w``, the same function.
        qk_norm_eps: the norm's epsilon (``rms_norm_eps``).
        sinks: a learned logit per head (``self.sinks``, ``(H,)``, initialised to 0) appended to each row
            of scores as an extra softmax column, then dropped (:func:`softmax_with_sink`; gpt-oss).
        softmax_plus_one: the same with a fixed logit 0 (:func:`softmax_plus_one`); not with ``sinks``.
        output_gate: ``gate_proj`` (``E -> H * D``); the attention output of each head, before ``o_proj``, is
            multiplied feature by feature by ``sigmoid(gate_proj(x))`` (Qwen3-Next, whose ``q_proj`` emits
            the gate: per head, D query features then D gate features).
        sliding_window: None for a global layer; an int W >= 1 for a local one: query i sees keys
            ``i - W < j <= i``, W keys with itself (Hugging Face's ``sliding_window``).
        rope_base: RoPE's base (``rope_theta``); None for no RoPE (NoPE).
        partial_rotary_factor: the share of each head's D features that RoPE rotates (the first
            ``int(D * factor)``, an even number); the rest pass through (Qwen3-Next: 0.25).
        rope_scaling: None for plain RoPE, or the rest of a config's ``rope_parameters`` (without
            ``rope_theta``, which is ``rope_base``): ``{"rope_type": "linear", "factor": 8.0}`` (Gemma 3's
            global layers), ``{"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings":
            4096, ...}`` (gpt-oss). :func:`attnbook.positional.rope_frequencies` turns it into the
            frequencies (``rope_inv_freq``) and the attention factor (``rope_attention_factor``, which
            multiplies the rotated features of q and k, as Hugging Face's cos and sin).
        bias: biases on the four projections (gpt-oss: True).
        scaling: multiplies ``q . k``; default ``D ** -0.5`` (Gemma 3: ``query_pre_attn_scalar ** -0.5``).
        attn_logit_softcapping: None, or c > 0: scores become ``c * tanh(scores / c)`` before the mask
            (Gemma 2; None in Gemma 3).

    ``forward(x (B, T, E), mask=None, *, positions=None, need_weights=False)`` returns
    ``(out (B, T, E), weights (B, H, T, T) or None)``. The layer always applies its own causal (and sliding
    window) mask; ``mask``, bool broadcastable to ``(B, H, T, T)``, True = may attend (padding, say), is
    combined with it. ``positions`` are RoPE's positions of the T tokens (default ``arange(T)``).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        sinks: bool = False,
        softmax_plus_one: bool = False,
        output_gate: bool = False,
        sliding_window: int | None = None,
        rope_base: float | None = 10000.0,
        partial_rotary_factor: float = 1.0,
        rope_scaling: Mapping[str, Any] | None = None,
        bias: bool = False,
        scaling: float | None = None,
        attn_logit_softcapping: float | None = None,
    ):
        super().__init__()
        self.d_model = check_int("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(
                    f"d_model={d_model} is not divisible by num_heads={num_heads}; pass head_dim to decouple them"
                )
            head_dim = d_model // num_heads
        self.head_dim = check_int("head_dim", head_dim)
        for name, flag in (("qk_norm", qk_norm), ("sinks", sinks), ("softmax_plus_one", softmax_plus_one),
                           ("output_gate", output_gate), ("bias", bias)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
        if sinks and softmax_plus_one:
            raise ValueError("sinks=True and softmax_plus_one=True exclude each other: plus one is a sink fixed at 0")
        self.sliding_window = _check_sliding_window(sliding_window)
        if rope_base is not None and not rope_base > 1:
            raise ValueError(f"rope_base must be > 1 (or None for no RoPE), got {rope_base!r}")
        if not 0.0 < partial_rotary_factor <= 1.0:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
        self.rope_base = None if rope_base is None else float(rope_base)
        self.partial_rotary_factor = float(partial_rotary_factor)
        self.rotary_dim = int(head_dim * partial_rotary_factor)
        if rope_base is not None and (self.rotary_dim < 2 or self.rotary_dim % 2):
            raise ValueError(
                f"RoPE rotates pairs: int(head_dim * partial_rotary_factor) = int({head_dim} * "
                f"{partial_rotary_factor}) = {self.rotary_dim} must be even and >= 2"
            )
        self.rope_scaling = None if rope_scaling is None else dict(rope_scaling)
        if self.rope_scaling is not None and "rope_theta" in self.rope_scaling:
            raise ValueError(f"rope_scaling must not hold rope_theta ({self.rope_scaling['rope_theta']!r}): "
                             "the base is rope_base")
        if self.rope_scaling is not None and rope_base is None:
            raise ValueError(f"rope_scaling={self.rope_scaling} needs RoPE, but rope_base is None (NoPE)")
        self.rope_inv_freq: torch.Tensor | None = None  # (rotary_dim / 2,) float64
        self.rope_attention_factor = 1.0
        if self.rope_base is not None:
            self.rope_inv_freq, self.rope_attention_factor = rope_frequencies(
                self.rotary_dim, {**(self.rope_scaling or {}), "rope_theta": self.rope_base})
        if scaling is not None and not scaling > 0:
            raise ValueError(f"scaling must be positive, got {scaling!r}")
        self.scaling = head_dim**-0.5 if scaling is None else float(scaling)
        if attn_logit_softcapping is not None and not attn_logit_softcapping > 0:
            raise ValueError(f"attn_logit_softcapping must be positive or None, got {attn_logit_softcapping!r}")
        self.attn_logit_softcapping = attn_logit_softcapping
        self.softmax_plus_one = softmax_plus_one

        H, Hkv, D = num_heads, self.num_kv_heads, head_dim
        self.q_proj = nn.Linear(d_model, H * D, bias=bias)
        self.k_proj = nn.Linear(d_model, Hkv * D, bias=bias)
        self.v_proj = nn.Linear(d_model, Hkv * D, bias=bias)
        self.o_proj = nn.Linear(H * D, d_model, bias=bias)
        self.gate_proj = nn.Linear(d_model, H * D, bias=bias) if output_gate else None
        self.q_norm = nn.RMSNorm(D, eps=qk_norm_eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(D, eps=qk_norm_eps) if qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(H)) if sinks else None

    def extra_repr(self) -> str:
        parts = [f"d_model={self.d_model}", f"num_heads={self.num_heads}", f"num_kv_heads={self.num_kv_heads}",
                 f"head_dim={self.head_dim}"]
        if self.q_norm is not None:
            parts.append("qk_norm=True")
        if self.sinks is not None:
            parts.append("sinks=True")
        if self.softmax_plus_one:
            parts.append("softmax_plus_one=True")
        if self.gate_proj is not None:
            parts.append("output_gate=True")
        if self.sliding_window is not None:
            parts.append(f"sliding_window={self.sliding_window}")
        parts.append(f"rope_base={self.rope_base}")
        if self.partial_rotary_factor != 1.0:
            parts.append(f"partial_rotary_factor={self.partial_rotary_factor}")
        if self.rope_scaling is not None:
            parts.append(f"rope_scaling={self.rope_scaling}")
        if self.attn_logit_softcapping is not None:
            parts.append(f"attn_logit_softcapping={self.attn_logit_softcapping}")
        return ", ".join(parts)

    # -- the pieces, in the order forward uses them -------------------------------------------------------

    def _check_input(self, x: object) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}) (batch-first), got {shape_str(x)}")
        check_module_inputs(self, x=x)
        return x

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """RoPE on ``x`` ``(B, heads, T, D)``: the first ``rotary_dim`` features rotated (half-split pairs,
        as Hugging Face), the rest unchanged; ``x`` itself when ``rope_base`` is None. The frequencies and
        the attention factor are ``rope_scaling``'s (:func:`attnbook.positional.rope_frequencies`)."""
        if self.rope_base is None or self.rope_inv_freq is None:
            return x
        inv_freq, factor = self.rope_inv_freq, self.rope_attention_factor
        if self.rotary_dim == self.head_dim:
            return apply_rotary(x, positions, inv_freq=inv_freq, attention_factor=factor)  # (B, heads, T, D)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]  # (B, heads, T, rotary_dim), the rest
        rot = apply_rotary(rot, positions, inv_freq=inv_freq, attention_factor=factor)
        return torch.cat([rot, rest], dim=-1)  # (B, heads, T, D)

    def project(
        self, x: torch.Tensor, positions: torch.Tensor | Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``(B, H, T, D)``, k and v ``(B, Hkv, T, D)``: projected, split into heads, q and k normalised
        (``qk_norm``) and rotated (RoPE)."""
        x = self._check_input(x)
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, H, T, D)
        k = split_heads(self.k_proj(x), self.num_kv_heads)  # (B, Hkv, T, D)
        v = split_heads(self.v_proj(x), self.num_kv_heads)  # (B, Hkv, T, D)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # each head's D features to RMS 1, times the weight
        return self.rotate(q, positions), self.rotate(k, positions), v

    def layer_mask(self, T: int, device: Device = None) -> torch.Tensor:
        """The layer's own bool mask ``(T, T)``: causal, and local when ``sliding_window`` is set."""
        if self.sliding_window is None:
            return causal_mask(T, device=device)
        return sliding_window_mask(T, self.sliding_window - 1, causal=True, device=device)

    def attention_logits(
        self, x: torch.Tensor, positions: torch.Tensor | Sequence[int] | None = None
    ) -> torch.Tensor:
        """The scaled scores ``q . k * scaling``, ``(B, H, T, T)``, before soft-capping and masking (the
        numbers that overflow float16 when they pass 65504)."""
        q, k, _ = self.project(x, positions)
        k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # (B, H, T, D)
        return torch.matmul(q, k.transpose(-2, -1)) * self.scaling  # (B, H, T, T)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of q ``(B, H, T, D)`` over k, v ``(B, Hkv, S, D)`` under a bool ``mask`` broadcastable
        to ``(B, H, T, S)``: ``(out (B, H, T, D), weights (B, H, T, S) or None)``. Plain softmax goes through
        :func:`attnbook.scaled_dot_product_attention` (or PyTorch's fused kernel without weights); sinks,
        plus one and soft-capping compute the scores here."""
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # (B, H, S, D): query head h reads key/value head h // G
        v = v.repeat_interleave(groups, dim=1)  # (B, H, S, D)
        plain = self.sinks is None and not self.softmax_plus_one and self.attn_logit_softcapping is None
        if plain:
            if not need_weights and bool(mask.any(dim=-1).all()):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)  # (B, H, T, D)
                return out, None
            out, weights = scaled_dot_product_attention(q, k, v, mask, scale=self.scaling)  # (B, H, T, D)
            return out, weights if need_weights else None
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scaling  # (B, H, T, S)
        if self.attn_logit_softcapping is not None:
            cap = self.attn_logit_softcapping
            scores = cap * torch.tanh(scores / cap)
        if self.sinks is not None:
            weights = softmax_with_sink(scores, self.sinks, mask)  # (B, H, T, S)
        elif self.softmax_plus_one:
            weights = softmax_plus_one(scores, mask)  # (B, H, T, S)
        else:
            weights = _masked_softmax(scores, mask.expand_as(scores))  # (B, H, T, S)
        out = torch.matmul(weights, v)  # (B, H, T, D)
        return out, weights if need_weights else None

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | Sequence[int] | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self._check_input(x)
        B, T, _ = x.shape
        q, k, v = self.project(x, positions)  # q (B, H, T, D); k, v (B, Hkv, T, D)
        keep = self.layer_mask(T, device=x.device)  # (T, T)
        if mask is not None:
            check_mask(mask, torch.Size((B, self.num_heads, T, T)))
            if mask.dtype != torch.bool:
                raise TypeError(
                    f"mask must be bool (True = may attend), got {mask.dtype}; convert an additive mask with "
                    "attnbook.masks.from_additive"
                )
            keep = keep & mask.to(x.device)  # broadcasts to (B, H, T, T)
        out, weights = self.attend(q, k, v, keep, need_weights)  # (B, H, T, D)
        if self.gate_proj is not None:
            gate = split_heads(self.gate_proj(x), self.num_heads)  # (B, H, T, D)
            out = out * torch.sigmoid(gate)
        return self.o_proj(merge_heads(out)), weights  # (B, T, E)

    # -- weights from Hugging Face's modules --------------------------------------------------------------

    @classmethod
    def from_hf(cls, module: nn.Module) -> LLMAttention:
        """An ``LLMAttention`` with the weights and settings of one Hugging Face attention module:
        ``Qwen3Attention``, ``GptOssAttention``, ``Qwen3NextAttention``, ``Gemma3Attention`` or
        ``Gemma2Attention`` (read from the module and its ``config``; ``transformers`` itself is not
        imported). RoPE may be plain (``rope_type="default"``), linear or YaRN (``rope_scaling``; for Gemma 3
        the parameters of the layer's own type, :func:`layer_rope_parameters`); another kind raises a
        ``ValueError`` naming it. The config may be transformers 5.x's (``rope_parameters``, flat or nested by
        layer type) or 4.x's (Colab's 4.57: ``rope_theta``, ``rope_scaling``, ``partial_rotary_factor`` and,
        for Gemma 3's sliding layers, ``rope_local_base_freq`` with plain RoPE), read as
        :func:`layer_rope_parameters` reads them. Gemma 2 soft-caps its scores (``attn_logit_softcapping``); Gemma 3 replaced that
        with QK-norm, and its attention does not apply the ``attn_logit_softcapping`` its config still has.

        Given the same input, RoPE positions and the mask Hugging Face builds for that layer, the output
        equals the module's (float32: within 1e-5)."""
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        hf: Any = module  # a transformers class: read by attribute, not typed here
        kind = type(module).__name__
        if kind not in _HF_KINDS:
            raise TypeError(f"from_hf takes one of {sorted(_HF_KINDS)}, got {kind}")
        config: Any = hf.config
        rope = _config_rope(config, _hf_layer_type(hf, config))  # this layer's: 5.x's rope_parameters or 4.x's
        offset_norm, softcaps = _HF_KINDS[kind]
        if not getattr(hf, "is_causal", True):
            raise ValueError(f"this {kind} is bidirectional (use_bidirectional_attention=True); LLMAttention is causal")
        rope_scaling = _rope_scaling(rope)
        H, D = config.num_attention_heads, hf.head_dim
        q_norm: Any = getattr(hf, "q_norm", None)
        eps: Any = 1e-6 if q_norm is None else getattr(q_norm, "variance_epsilon", getattr(q_norm, "eps", None))
        new = cls(
            config.hidden_size,
            H,
            config.num_key_value_heads,
            D,
            qk_norm=q_norm is not None,
            qk_norm_eps=float(eps),
            sinks=kind == "GptOssAttention",
            output_gate=kind == "Qwen3NextAttention",
            sliding_window=getattr(hf, "sliding_window", None),
            rope_base=float(rope["rope_theta"]),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)),
            rope_scaling=rope_scaling,
            bias=hf.q_proj.bias is not None,
            scaling=float(hf.scaling),
            attn_logit_softcapping=hf.attn_logit_softcapping if softcaps else None,
        )
        weight = hf.o_proj.weight
        new = new.to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            wq, bq = hf.q_proj.weight, hf.q_proj.bias
            if new.gate_proj is not None:
                # Qwen3-Next's q_proj emits, per head, D query features then D gate features
                E = config.hidden_size
                wq_heads = wq.view(H, 2 * D, E)  # (H, 2D, E)
                wq, wg = wq_heads[:, :D].reshape(H * D, E), wq_heads[:, D:].reshape(H * D, E)
                new.gate_proj.weight.copy_(wg)
                if bq is not None:
                    bq_heads = bq.view(H, 2 * D)  # (H, 2D)
                    bq = bq_heads[:, :D].reshape(H * D)
                    new.gate_proj.bias.copy_(bq_heads[:, D:].reshape(H * D))
            new.q_proj.weight.copy_(wq)
            for mine, theirs in ((new.k_proj, hf.k_proj), (new.v_proj, hf.v_proj),
                                 (new.o_proj, hf.o_proj)):
                mine.weight.copy_(theirs.weight)
                if theirs.bias is not None:
                    mine.bias.copy_(theirs.bias)
            if bq is not None:
                new.q_proj.bias.copy_(bq)
            if new.q_norm is not None and new.k_norm is not None:
                for mine_norm, theirs_norm in ((new.q_norm, hf.q_norm), (new.k_norm, hf.k_norm)):
                    w = theirs_norm.weight.float()
                    mine_norm.weight.copy_(1.0 + w if offset_norm else w)
            if new.sinks is not None:
                new.sinks.copy_(hf.sinks)
        return new


def _rope_scaling(rope: Mapping[str, Any]) -> dict[str, Any] | None:
    """A config's ``rope_parameters`` (one layer type's) as ``LLMAttention``'s ``rope_scaling``: None for
    plain RoPE, else everything but the base and the rotated share."""
    if not isinstance(rope, Mapping):
        raise TypeError(f"rope_parameters must be a mapping, got {type(rope).__name__}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor", "type")}
    scaling["rope_type"] = rope_type
    return scaling


# The Hugging Face attention classes from_hf reads: (their RMSNorm multiplies by 1 + weight, they soft-cap
# the scores with attn_logit_softcapping).
_HF_KINDS = {
    "Qwen3Attention": (False, False),
    "GptOssAttention": (False, False),
    "Qwen3NextAttention": (True, False),
    "Gemma3Attention": (True, False),
    "Gemma2Attention": (True, True),
}


def _check_layer_types(layer_types: object) -> list[str]:
    if isinstance(layer_types, str) or not isinstance(layer_types, Sequence):
        raise TypeError(f"layer_types must be a list of strings (a config's layer_types), got {layer_types!r}")
    types = list(layer_types)
    if not types:
        raise ValueError("layer_types is empty: a model has at least one layer")
    for i, kind in enumerate(types):
        if kind not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}] = {kind!r} is not a layer type attnbook knows ({', '.join(LAYER_TYPES)})")
    return types


def layer_masks(
    layer_types: Sequence[str], T: int, sliding_window: int | None = None, *, device: Device = None
) -> list[torch.Tensor]:
    """The bool mask ``(T, T)`` of each of the N layers of a config's ``layer_types``, True = may attend.

    ``"full_attention"``: causal, every earlier token. ``"sliding_attention"``: query i sees keys
    ``i - sliding_window < j <= i`` (Hugging Face's ``sliding_window``: that many keys, itself included).
    Layers of one type share one tensor. An unknown type raises a ``ValueError`` naming it; a sliding layer
    needs ``sliding_window`` >= 1.
    """
    types = _check_layer_types(layer_types)
    T = check_int("T", T)
    window = _check_sliding_window(sliding_window)
    if "sliding_attention" in types and window is None:
        raise ValueError("layer_types has sliding_attention layers, so sliding_window must be an int >= 1, got None")
    by_type = {"full_attention": causal_mask(T, device=device)}  # (T, T)
    if window is not None:
        by_type["sliding_attention"] = sliding_window_mask(T, window - 1, causal=True, device=device)  # (T, T)
    return [by_type[kind] for kind in types]


def _hf_layer_type(hf: Any, config: Any) -> str:
    """The layer type of a Hugging Face attention module: its ``layer_type`` (5.x), else its config's
    ``layer_types[layer_idx]`` (4.x), else by its ``sliding_window``."""
    kind = getattr(hf, "layer_type", None)
    types, idx = getattr(config, "layer_types", None), getattr(hf, "layer_idx", None)
    if kind is None and isinstance(types, Sequence) and isinstance(idx, int) and 0 <= idx < len(types):
        kind = types[idx]
    if kind is None:
        kind = "sliding_attention" if getattr(hf, "sliding_window", None) else "full_attention"
    return str(kind)


def _config_rope(config: object, layer_type: str) -> dict[str, Any]:
    """The RoPE parameters of one layer type of ``config`` (a ``transformers`` config, 5.x or 4.x, or a
    mapping, its ``config.json``), as one flat dict with at least ``rope_type`` and ``rope_theta``, shaped as
    transformers 5.x's ``rope_parameters`` (what :func:`attnbook.positional.rope_frequencies` takes).

    5.x: ``rope_parameters``, one flat dict for every layer (whatever its type, ``"linear_attention"``
    included), or nested by layer type (Gemma 3): the entry of ``layer_type``. 4.x (no ``rope_parameters``):
    ``rope_scaling`` (or plain RoPE when None) with ``rope_theta`` as the base and the config's
    ``partial_rotary_factor``; Gemma 3's sliding layers (a config with ``rope_local_base_freq``) use plain
    RoPE with that base, as its 4.x model's ``rotary_emb_local`` (a copy of the config with
    ``rope_theta = rope_local_base_freq`` and ``rope_scaling = {"rope_type": "default"}``). In both, YaRN without
    ``original_max_position_embeddings`` gets ``max_position_embeddings``, as transformers fills it in."""
    def get(name: str) -> Any:
        if isinstance(config, Mapping):
            return config.get(name)
        return getattr(config, name, None)

    rope = get("rope_parameters")
    if rope is not None:
        if not isinstance(rope, Mapping):
            raise TypeError(f"config's rope_parameters must be a mapping, got {type(rope).__name__}")
        nested = [kind for kind, value in rope.items() if isinstance(value, Mapping)]
        if nested:
            if layer_type not in nested:
                raise ValueError(f"config's rope_parameters is nested by layer type ({nested}) but has no "
                                 f"entry for the layer type {layer_type!r} of its layer_types")
            entry = dict(rope[layer_type])
        else:
            entry = dict(rope)
    else:
        theta = get("rope_theta")
        if theta is None:
            raise ValueError("config has neither rope_parameters nor rope_theta: no RoPE to read")
        local = get("rope_local_base_freq")
        if layer_type == "sliding_attention" and local is not None:
            entry = {"rope_type": "default", "rope_theta": local}  # Gemma 3 4.x: local layers, plain RoPE
        else:
            scaling = get("rope_scaling")
            if scaling is not None and not isinstance(scaling, Mapping):
                raise TypeError(f"config's rope_scaling must be a mapping or None, got {type(scaling).__name__}")
            entry = {**(scaling or {}), "rope_theta": theta}
        partial = get("partial_rotary_factor")  # 4.x keeps it on the config (Qwen3-Next: 0.25)
        if partial is not None:
            entry.setdefault("partial_rotary_factor", partial)
    entry["rope_type"] = entry.pop("rope_type", entry.pop("type", "default"))
    entry.setdefault("rope_theta", 10000.0)
    max_positions = get("max_position_embeddings")
    if entry["rope_type"] == "yarn" and entry.get("original_max_position_embeddings") is None and max_positions:
        entry["original_max_position_embeddings"] = max_positions
    return entry


def layer_rope_parameters(config: object) -> list[dict[str, Any]]:
    """The RoPE parameters of each of a config's N layers, read from the config itself.

    ``config`` is a ``transformers`` config or a mapping (its ``config.json``) with ``layer_types`` and
    ``rope_parameters``. Where ``rope_parameters`` is nested by layer type (Gemma 3 in transformers 5.x:
    ``{"sliding_attention": {...}, "full_attention": {...}}``), layer i gets the entry of
    ``layer_types[i]``; where it is one flat dict (gpt-oss), every layer gets it. A config without
    ``rope_parameters`` (transformers 4.x, or an older ``config.json``) is read the older way:
    ``rope_theta``, ``rope_scaling`` and ``partial_rotary_factor`` for every layer, except Gemma 3's local
    ones, which rotate with plain RoPE of base ``rope_local_base_freq``. Each entry is a new dict with at
    least ``rope_type`` and ``rope_theta``, as :func:`attnbook.positional.rope_frequencies` takes it (which
    checks the rest); YaRN's ``original_max_position_embeddings`` defaults to ``max_position_embeddings``.
    """
    types = _check_layer_types(config.get("layer_types") if isinstance(config, Mapping)
                               else getattr(config, "layer_types", None))
    by_type = {kind: _config_rope(config, kind) for kind in set(types)}
    return [dict(by_type[kind]) for kind in types]


def layer_rope_bases(config: object) -> list[float]:
    """RoPE's base (``rope_theta``) of each layer of a config, from :func:`layer_rope_parameters`: Gemma 3
    rotates its local layers with base 10^4 and its global layers with 10^6 (and stretches the global
    ones linearly, by 8 in the released models); gpt-oss has one base, 150,000, for every layer."""
    return [float(entry["rope_theta"]) for entry in layer_rope_parameters(config)]
