"""Transformer layers built around :class:`attnbook.MultiHeadAttention`, batch-first.

Dimension legend:
    B  batch size
    H  number of heads
    T  query length (target / the sequence itself)
    S  key/value length (source / memory)
    E  model dimension (``d_model``)
    F  feed-forward width (``dim_feedforward``)

Masks follow the package convention: bool, True = may attend, broadcastable to
(B, H, T, S); or float, added to the scores. ``torch.nn.Transformer*Layer`` use
the opposite bool convention (True = blocked): pass ``~mask`` to PyTorch, or
convert with :func:`attnbook.masks.from_blocked`.

Two arrangements of the residual stream are supported:

* post-LN (``norm_first=False``, the original paper):  ``x = norm(x + sublayer(x))``
* pre-LN  (``norm_first=True``, GPT-2 and most models since): ``x = x + sublayer(norm(x))``

Attention weights: every ``forward`` takes ``need_weights``. With the default
``False`` it returns only the output and the attention uses PyTorch's fused
kernel; with ``True`` it returns a tuple whose first item is the output and
whose other items are the per-head weights ``(B, H, T, S)`` (one tensor per
attention block of a layer, one list per block kind for a stack).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_int, check_module_inputs, check_prob, shape_str
from .mha import MultiHeadAttention

if TYPE_CHECKING:
    from .kvcache import KVCache

_L = TypeVar("_L", "TransformerEncoderLayer", "TransformerDecoderLayer")

__all__ = [
    "FeedForward",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": F.relu, "gelu": F.gelu}


def _check_activation(activation: object) -> str:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    return activation


def _check_seq(name: str, x: object, width: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in (2, 3) or x.shape[-1] != width:
        raise ValueError(f"{name} must be (B, length, E={width}) (batch-first) or (length, E={width}), got {shape_str(x)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")


def _torch_activation(layer: nn.Module) -> str:
    kind = getattr(layer, "activation_relu_or_gelu", 0)
    if kind == 1 or layer.activation is F.relu or isinstance(layer.activation, nn.ReLU):
        return "relu"
    if kind == 2 or layer.activation is F.gelu or isinstance(layer.activation, nn.GELU):
        if isinstance(layer.activation, nn.GELU) and layer.activation.approximate != "none":
            raise ValueError("only exact GELU (approximate='none') has a counterpart here")
        return "gelu"
    raise ValueError(f"activation {layer.activation!r} has no counterpart; use 'relu' or 'gelu'")


def _from_torch_common(cls: type[_L], layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer) -> _L:
    """What PyTorch's encoder and decoder layers share: the hyperparameters, the
    self-attention, the feed-forward block and norm1/norm2 (copied onto a new ``cls``)."""
    new = cls(
        layer.self_attn.embed_dim,
        layer.self_attn.num_heads,
        dim_feedforward=layer.linear1.out_features,
        dropout=layer.dropout.p,
        activation=_torch_activation(layer),
        norm_first=layer.norm_first,
        layer_norm_eps=layer.norm1.eps,
        bias=layer.linear1.bias is not None,
    )
    w = layer.linear1.weight
    new = new.to(device=w.device, dtype=w.dtype)
    new.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
    new.ff.linear1.load_state_dict(layer.linear1.state_dict())
    new.ff.linear2.load_state_dict(layer.linear2.state_dict())
    new.norm1.load_state_dict(layer.norm1.state_dict())
    new.norm2.load_state_dict(layer.norm2.state_dict())
    return new


class FeedForward(nn.Module):
    """Position-wise feed-forward block: ``linear2(dropout(act(linear1(x))))``.

    Args:
        d_model: model dimension E (input and output width).
        dim_feedforward: hidden width F.
        dropout: dropout after the activation (training only).
        activation: ``"relu"`` or ``"gelu"`` (exact GELU, as PyTorch's layers).
        bias: whether the two linear layers have a bias.

    ``forward(x)`` maps ``(..., E)`` to ``(..., E)``; every position is
    transformed independently, with the same weights.
    """

    def __init__(
        self,
        d_model: int,
        dim_feedforward: int,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
    ):
        super().__init__()
        check_int("d_model", d_model)
        check_int("dim_feedforward", dim_feedforward)
        check_prob("dropout", dropout)
        self.activation = _check_activation(activation)
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias)  # E -> F
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias)  # F -> E

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _ACTIVATIONS[self.activation](self.linear1(x))  # (..., F)
        return self.linear2(self.dropout(h))  # (..., E)


class TransformerEncoderLayer(nn.Module):
    """Self-attention followed by a feed-forward block, each with a residual
    connection and a LayerNorm (post-LN or pre-LN, see the module docstring).

    Args mirror ``torch.nn.TransformerEncoderLayer`` (always batch-first):
        d_model, num_heads, dim_feedforward, dropout (on the attention weights,
        inside the feed-forward block and on each residual branch), activation
        (``"relu"``/``"gelu"``), norm_first, layer_norm_eps, bias.

    ``forward(src, mask=None, *, need_weights=False)``:
        src ``(B, T, E)``; mask bool (True = may attend) or float, broadcastable
        to ``(B, H, T, T)`` -- e.g. :func:`attnbook.causal_mask` or
        :func:`attnbook.padding_mask`. Returns ``out (B, T, E)``, or
        ``(out, weights (B, H, T, T))`` when ``need_weights=True``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        check_prob("dropout", dropout)
        self.d_model = d_model
        self.norm_first = bool(norm_first)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.ff = FeedForward(d_model, dim_feedforward, dropout, activation, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"

    def _sa_block(self, x: torch.Tensor, mask: torch.Tensor | None, need_weights: bool,
                  cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, weights = self.self_attn(x, mask=mask, need_weights=need_weights, cache=cache)  # (B, T, E), (B, H, T, S)
        return self.dropout1(out), weights

    def _ff_block(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout2(self.ff(x))  # (B, T, E)

    def forward(self, src: torch.Tensor, mask: torch.Tensor | None = None, *, need_weights: bool = False,
                cache: KVCache | None = None) -> Any:
        """``cache`` (an :class:`attnbook.KVCache`) makes the self-attention
        incremental: ``src`` holds only the new positions (decoder-only generation)."""
        _check_seq("src", src, self.d_model)
        check_module_inputs(self, src=src)
        x = src  # (B, T, E)
        if self.norm_first:
            sa, weights = self._sa_block(self.norm1(x), mask, need_weights, cache)
            x = x + sa
            x = x + self._ff_block(self.norm2(x))
        else:
            sa, weights = self._sa_block(x, mask, need_weights, cache)
            x = self.norm1(x + sa)
            x = self.norm2(x + self._ff_block(x))
        return (x, weights) if need_weights else x  # (B, T, E)

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> TransformerEncoderLayer:
        """Build one with the same weights as a ``torch.nn.TransformerEncoderLayer``.

        The result (always batch-first) gives the same outputs as
        ``layer(src, src_mask=~mask)`` (transposed when ``layer`` is not batch-first).
        """
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"expected torch.nn.TransformerEncoderLayer, got {type(layer).__name__}")
        new = _from_torch_common(cls, layer)
        return new.train(layer.training)


class TransformerDecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder's ``memory``,
    then a feed-forward block; each with a residual connection and a LayerNorm.

    Args mirror ``torch.nn.TransformerDecoderLayer`` (always batch-first), see
    :class:`TransformerEncoderLayer`.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, *, need_weights=False)``:
        tgt ``(B, T, E)``, memory ``(B, S, E)``; ``tgt_mask`` broadcastable to
        ``(B, H, T, T)`` (usually :func:`attnbook.causal_mask`, which this layer
        does **not** add by itself), ``memory_mask`` to ``(B, H, T, S)`` (e.g. the
        source's padding mask). Returns ``out (B, T, E)``, or
        ``(out, self_weights (B, H, T, T), cross_weights (B, H, T, S))`` when
        ``need_weights=True``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        check_prob("dropout", dropout)
        self.d_model = d_model
        self.norm_first = bool(norm_first)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.ff = FeedForward(d_model, dim_feedforward, dropout, activation, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"

    def _sa_block(self, x: torch.Tensor, mask: torch.Tensor | None, need_weights: bool,
                  cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, weights = self.self_attn(x, mask=mask, need_weights=need_weights, cache=cache)  # (B, T, E), (B, H, T, S)
        return self.dropout1(out), weights

    def _ca_block(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None,
                  need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, weights = self.cross_attn(x, memory, memory, mask=mask, need_weights=need_weights)  # (B, H, T, S)
        return self.dropout2(out), weights

    def _ff_block(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout3(self.ff(x))  # (B, T, E)

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> Any:
        _check_seq("tgt", tgt, self.d_model)
        _check_seq("memory", memory, self.d_model)
        check_module_inputs(self, tgt=tgt, memory=memory)
        if tgt.dim() != memory.dim() or (tgt.dim() == 3 and tgt.shape[0] != memory.shape[0]):
            raise ValueError(f"tgt {shape_str(tgt)} and memory {shape_str(memory)} must share the batch size B")
        x = tgt  # (B, T, E)
        if self.norm_first:
            sa, w_self = self._sa_block(self.norm1(x), tgt_mask, need_weights)
            x = x + sa
            ca, w_cross = self._ca_block(self.norm2(x), memory, memory_mask, need_weights)
            x = x + ca
            x = x + self._ff_block(self.norm3(x))
        else:
            sa, w_self = self._sa_block(x, tgt_mask, need_weights)
            x = self.norm1(x + sa)
            ca, w_cross = self._ca_block(x, memory, memory_mask, need_weights)
            x = self.norm2(x + ca)
            x = self.norm3(x + self._ff_block(x))
        return (x, w_self, w_cross) if need_weights else x  # (B, T, E)

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> TransformerDecoderLayer:
        """Build one with the same weights as a ``torch.nn.TransformerDecoderLayer``.

        The result (always batch-first) gives the same outputs as
        ``layer(tgt, memory, tgt_mask=~tgt_mask, memory_mask=~memory_mask)``.
        """
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(f"expected torch.nn.TransformerDecoderLayer, got {type(layer).__name__}")
        new = _from_torch_common(cls, layer)
        new.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        new.norm3.load_state_dict(layer.norm3.state_dict())
        return new.train(layer.training)


def _clones(layer: nn.Module, num_layers: int) -> nn.ModuleList:
    check_int("num_layers", num_layers)
    return nn.ModuleList(copy.deepcopy(layer) for _ in range(num_layers))


class TransformerEncoder(nn.Module):
    """A stack of ``num_layers`` copies of ``encoder_layer`` (each with its own
    weights), with an optional final ``norm`` (pre-LN stacks need one).

    ``forward(src, mask=None, *, need_weights=False)`` returns ``out (B, T, E)``,
    or ``(out, [weights (B, H, T, T) per layer])`` when ``need_weights=True``.
    """

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: nn.Module | None = None):
        super().__init__()
        if not isinstance(encoder_layer, TransformerEncoderLayer):
            raise TypeError(f"encoder_layer must be a TransformerEncoderLayer, got {type(encoder_layer).__name__}")
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: torch.Tensor, mask: torch.Tensor | None = None, *, need_weights: bool = False,
                caches: Sequence[KVCache] | None = None) -> Any:
        """``caches``: one :class:`attnbook.KVCache` per layer for incremental decoding."""
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(f"got {len(caches)} caches for {len(self.layers)} layers")
        x = src  # (B, T, E)
        all_weights = []
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            if need_weights:
                x, w = layer(x, mask, need_weights=True, cache=cache)  # (B, T, E), (B, H, T, S)
                all_weights.append(w)
            else:
                x = layer(x, mask, cache=cache)
        if self.norm is not None:
            x = self.norm(x)
        return (x, all_weights) if need_weights else x

    @classmethod
    def from_torch(cls, encoder: nn.TransformerEncoder) -> TransformerEncoder:
        """Same weights as a ``torch.nn.TransformerEncoder`` (final norm included)."""
        if not isinstance(encoder, nn.TransformerEncoder):
            raise TypeError(f"expected torch.nn.TransformerEncoder, got {type(encoder).__name__}")
        first = TransformerEncoderLayer.from_torch(encoder.layers[0])
        new = cls(first, len(encoder.layers), norm=copy.deepcopy(encoder.norm))
        new.layers = nn.ModuleList(TransformerEncoderLayer.from_torch(m) for m in encoder.layers)
        return new.train(encoder.training)


class TransformerDecoder(nn.Module):
    """A stack of ``num_layers`` copies of ``decoder_layer``, with an optional
    final ``norm``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, *, need_weights=False)``
    returns ``out (B, T, E)``, or ``(out, [self weights (B, H, T, T)], [cross
    weights (B, H, T, S)])`` (one entry per layer) when ``need_weights=True``.
    """

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: nn.Module | None = None):
        super().__init__()
        if not isinstance(decoder_layer, TransformerDecoderLayer):
            raise TypeError(f"decoder_layer must be a TransformerDecoderLayer, got {type(decoder_layer).__name__}")
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> Any:
        x = tgt  # (B, T, E)
        self_weights, cross_weights = [], []
        for layer in self.layers:
            if need_weights:
                x, ws, wc = layer(x, memory, tgt_mask, memory_mask, need_weights=True)
                self_weights.append(ws)  # (B, H, T, T)
                cross_weights.append(wc)  # (B, H, T, S)
            else:
                x = layer(x, memory, tgt_mask, memory_mask)
        if self.norm is not None:
            x = self.norm(x)
        return (x, self_weights, cross_weights) if need_weights else x

    @classmethod
    def from_torch(cls, decoder: nn.TransformerDecoder) -> TransformerDecoder:
        """Same weights as a ``torch.nn.TransformerDecoder`` (final norm included)."""
        if not isinstance(decoder, nn.TransformerDecoder):
            raise TypeError(f"expected torch.nn.TransformerDecoder, got {type(decoder).__name__}")
        first = TransformerDecoderLayer.from_torch(decoder.layers[0])
        new = cls(first, len(decoder.layers), norm=copy.deepcopy(decoder.norm))
        new.layers = nn.ModuleList(TransformerDecoderLayer.from_torch(m) for m in decoder.layers)
        return new.train(decoder.training)
