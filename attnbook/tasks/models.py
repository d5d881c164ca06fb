"""Two tiny transformers that learn the toy tasks of :mod:`attnbook.tasks.data` in seconds on a CPU.

Dimension legend:
    B  batch size
    H  number of heads
    S  source length (``task.src_len``)
    L  target length including the final EOS (``task.tgt_len + 1``)
    T  length of the sequence a model reads (decoder input, or "src SEP tgt")
    E  model dimension (``d_model``)
    V  vocabulary size

Models (batch-first, bool masks True = may attend, learned position embeddings,
:class:`attnbook.positional.LearnedPositionalEmbedding`):

* :class:`Seq2SeqTransformer`: encoder over the source, decoder with causal
  self-attention and cross-attention over the encoder's output.
* :class:`DecoderOnlyTransformer`: a causal language model over
  ``src <sep> tgt`` that is only trained to predict the ``tgt`` part.

Both have ``loss(src, tgt)``, a greedy ``generate(src, max_new_tokens)``,
``forward(..., need_weights=True)`` (per-layer weights ``(B, H, T, T)``,
and ``(B, H, T, S)`` for cross-attention, for plotting) and
``source_attention(src, tgt)`` (how each target token's query attends to the
source, used by :func:`attnbook.train.attention_alignment`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_int, shape_str
from ..kvcache import KVCache, StaticKVCache
from ..layers import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer
from ..masks import causal_mask
from ..positional import LearnedPositionalEmbedding
from .data import Vocab

__all__ = ["Seq2SeqTransformer", "DecoderOnlyTransformer", "TokenEmbedding"]


class TokenEmbedding(nn.Module):
    """Token embedding plus a learned position embedding
    (:class:`attnbook.positional.LearnedPositionalEmbedding`), both N(0, 1) at init.

    ``forward(ids (B, T), offset=0)`` returns ``tok(ids) + P[offset : offset + T]``, ``(B, T, E)``.
    """

    def __init__(self, vocab_size: int, d_model: int, max_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = LearnedPositionalEmbedding(d_model, max_len, init_std=1.0)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        T = ids.shape[1]
        if offset + T > self.pos.max_len:
            raise ValueError(
                f"sequence of length {T} at offset {offset} is longer than max_len={self.pos.max_len} "
                f"(positions {offset}..{offset + T - 1})"
            )
        return self.pos(self.tok(ids), offset)  # (B, T, E)


def _check_ids(name: str, ids: object, vocab_size: int) -> None:
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype != torch.long:
        raise TypeError(f"{name} must be a LongTensor of token ids, got {ids.dtype}")
    if ids.dim() != 2 or ids.shape[1] < 1:
        raise ValueError(f"{name} must be (B, length) token ids, got {shape_str(ids)}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{name} ids must be in [0, {vocab_size}), got min {int(ids.min())}, max {int(ids.max())}")


def _check_vocab(vocab: object) -> Vocab:
    if not isinstance(vocab, Vocab):
        raise TypeError(f"vocab must be an attnbook.tasks.Vocab (e.g. task.vocab), got {type(vocab).__name__}")
    return vocab



class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder transformer (the original architecture, small).

    Args:
        vocab: the task's :class:`Vocab` (sizes and special ids).
        d_model, num_heads, num_encoder_layers, num_decoder_layers,
        dim_feedforward (default ``4 * d_model``), dropout, activation, norm_first:
            as in :mod:`attnbook.layers`; pre-LN stacks get a final LayerNorm.
        max_len: longest source or target sequence (learned positions).

    ``forward(src (B, S), tgt_in (B, T), *, need_weights=False)`` returns
    logits ``(B, T, V)`` for the token after each ``tgt_in`` position; with
    ``need_weights=True`` it returns ``(logits, attn)`` where ``attn`` is a dict
    of per-layer lists: ``"encoder"`` (B, H, S, S), ``"decoder_self"`` (B, H, T, T)
    and ``"decoder_cross"`` (B, H, T, S).
    """

    def __init__(
        self,
        vocab: Vocab,
        d_model: int = 64,
        num_heads: int = 4,
        num_encoder_layers: int = 1,
        num_decoder_layers: int = 1,
        dim_feedforward: int | None = None,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = True,
        max_len: int = 64,
    ):
        super().__init__()
        self.vocab = _check_vocab(vocab)
        V = len(vocab)
        dim_feedforward = 4 * d_model if dim_feedforward is None else dim_feedforward
        self.max_len = max_len
        self.src_embed = TokenEmbedding(V, d_model, max_len)
        self.tgt_embed = TokenEmbedding(V, d_model, max_len)
        enc = TransformerEncoderLayer(d_model, num_heads, dim_feedforward, dropout, activation, norm_first)
        dec = TransformerDecoderLayer(d_model, num_heads, dim_feedforward, dropout, activation, norm_first)
        self.encoder = TransformerEncoder(enc, num_encoder_layers, nn.LayerNorm(d_model) if norm_first else None)
        self.decoder = TransformerDecoder(dec, num_decoder_layers, nn.LayerNorm(d_model) if norm_first else None)
        self.head = nn.Linear(d_model, V)  # E -> V

    def _src_mask(self, src: torch.Tensor) -> torch.Tensor | None:
        real = src != self.vocab.pad_id  # (B, S)
        if bool(real.all()):
            return None  # no padding: no mask, and the fused attention kernel
        return real[:, None, None, :]  # (B, 1, 1, S)

    def encode(self, src: torch.Tensor, *, need_weights: bool = False) -> Any:
        """Encoder output ``memory (B, S, E)`` (and its per-layer weights)."""
        _check_ids("src", src, len(self.vocab))
        return self.encoder(self.src_embed(src), self._src_mask(src), need_weights=need_weights)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src: torch.Tensor, *,
               need_weights: bool = False) -> Any:
        """Decoder output, projected to logits ``(B, T, V)`` (and the weights)."""
        _check_ids("tgt_in", tgt_in, len(self.vocab))
        T = tgt_in.shape[1]
        tgt_mask = causal_mask(T, device=tgt_in.device)  # (T, T)
        x = self.tgt_embed(tgt_in)  # (B, T, E)
        out = self.decoder(x, memory, tgt_mask, self._src_mask(src), need_weights=need_weights)
        if need_weights:
            y, w_self, w_cross = out
            return self.head(y), w_self, w_cross  # (B, T, V)
        return self.head(out)  # (B, T, V)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *, need_weights: bool = False) -> Any:
        if not need_weights:
            return self.decode(tgt_in, self.encode(src), src)  # (B, T, V)
        memory, w_enc = self.encode(src, need_weights=True)
        logits, w_self, w_cross = self.decode(tgt_in, memory, src, need_weights=True)
        return logits, {"encoder": w_enc, "decoder_self": w_self, "decoder_cross": w_cross}

    def loss(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of predicting ``tgt (B, L)`` with teacher forcing (PAD ignored)."""
        _check_ids("tgt", tgt, len(self.vocab))
        logits = self(src, self.vocab.shift_right(tgt))  # (B, L, V)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=self.vocab.pad_id)

    def source_attention(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """Cross-attention of each decoder layer under teacher forcing:
        ``(B, H, L, S)``, row ``k`` being the query that predicts ``tgt[:, k]``."""
        _, attn = self(src, self.vocab.shift_right(tgt), need_weights=True)
        return attn["decoder_cross"]

    @torch.no_grad()
    def generate(self, src: torch.Tensor, max_new_tokens: int | None = None) -> torch.Tensor:
        """Greedy decoding: ``(B, <= max_new_tokens)`` token ids; rows stop at
        EOS (then PAD) and decoding ends once every row has an EOS."""
        max_new_tokens = self.max_len if max_new_tokens is None else max_new_tokens
        check_int("max_new_tokens", max_new_tokens, None)
        if not 1 <= max_new_tokens <= self.max_len:
            raise ValueError(f"max_new_tokens must be an int in [1, max_len={self.max_len}], got {max_new_tokens!r}")
        memory = self.encode(src)  # (B, S, E)
        ys = torch.full((src.shape[0], 1), self.vocab.bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_new_tokens):
            nxt = self.decode(ys, memory, src)[:, -1].argmax(-1)  # (B,)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            done |= nxt == self.vocab.eos_id
            if bool(done.all()):
                break
        return self.vocab.stop_after_eos(ys[:, 1:])


class DecoderOnlyTransformer(nn.Module):
    """Causal (GPT-style) transformer over ``src <sep> tgt``, built from
    :class:`attnbook.layers.TransformerEncoderLayer` with a causal mask.

    Args:
        vocab: the task's :class:`Vocab`.
        d_model, num_heads, num_layers, dim_feedforward (default ``4 * d_model``),
        dropout, activation, norm_first: as in :mod:`attnbook.layers`.
        max_len: longest sequence ``S + 1 + L``.

    ``forward(ids (B, T), *, need_weights=False)`` returns logits
    ``(B, T, V)`` for the next token at every position; with
    ``need_weights=True``, ``(logits, {"self": [weights (B, H, T, T) per layer]})``.
    """

    def __init__(
        self,
        vocab: Vocab,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        dim_feedforward: int | None = None,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = True,
        max_len: int = 64,
    ):
        super().__init__()
        self.vocab = _check_vocab(vocab)
        V = len(vocab)
        dim_feedforward = 4 * d_model if dim_feedforward is None else dim_feedforward
        self.max_len = max_len
        self.embed = TokenEmbedding(V, d_model, max_len)
        layer = TransformerEncoderLayer(d_model, num_heads, dim_feedforward, dropout, activation, norm_first)
        self.blocks = TransformerEncoder(layer, num_layers, nn.LayerNorm(d_model) if norm_first else None)
        self.head = nn.Linear(d_model, V)  # E -> V

    def forward(self, ids: torch.Tensor, *, need_weights: bool = False,
                caches: list[KVCache] | None = None) -> Any:
        """With ``caches`` (one :class:`attnbook.KVCache` per layer, see
        :meth:`new_caches`), ``ids`` are only the new tokens: they sit after the
        cached ones and attend to them and causally to each other."""
        _check_ids("ids", ids, len(self.vocab))
        T = ids.shape[1]
        real = ids != self.vocab.pad_id  # (B, T)
        if caches is None:
            mask = causal_mask(T, device=ids.device)  # (T, T)
            if not bool(real.all()):
                mask = mask & real[:, None, None, :]  # (B, 1, T, T)
            x = self.embed(ids)  # (B, T, E)
        else:
            if not bool(real.all()):
                raise ValueError("incremental decoding with a KV cache does not take padded sequences")
            past = len(caches[0])
            mask = causal_mask(T, past + T, offset=past, device=ids.device)  # (T, S): new tokens after the past
            x = self.embed(ids, offset=past)  # (B, T, E)
        if not need_weights:
            return self.head(self.blocks(x, mask, caches=caches))  # (B, T, V)
        y, weights = self.blocks(x, mask, need_weights=True, caches=caches)
        return self.head(y), {"self": weights}

    def new_caches(self, static: bool = False) -> list[KVCache]:
        """One empty :class:`attnbook.KVCache` per layer, or with ``static=True`` one
        :class:`attnbook.StaticKVCache` of ``max_len`` positions (preallocated, written in place)."""
        return [StaticKVCache(self.max_len) if static else KVCache() for _ in self.blocks.layers]

    def _sequence(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        _check_ids("src", src, len(self.vocab))
        _check_ids("tgt", tgt, len(self.vocab))
        sep = torch.full_like(src[:, :1], self.vocab.sep_id)
        return torch.cat([src, sep, tgt], dim=1)  # (B, S + 1 + L)

    def loss(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the ``tgt`` tokens given ``src <sep>`` and the
        earlier target tokens; the source itself is not a prediction target."""
        seq = self._sequence(src, tgt)  # (B, S + 1 + L)
        S = src.shape[1]
        logits = self(seq[:, :-1])[:, S:]  # (B, L, V): the positions that predict tgt
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=self.vocab.pad_id)

    def source_attention(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """Per layer ``(B, H, L, S)``: how the query that predicts ``tgt[:, k]``
        (position ``S + k`` of ``src <sep> tgt``) attends to the source positions."""
        seq = self._sequence(src, tgt)
        S, L = src.shape[1], tgt.shape[1]
        _, attn = self(seq[:, :-1], need_weights=True)
        return [w[:, :, S : S + L, :S] for w in attn["self"]]

    @torch.no_grad()
    def generate(self, src: torch.Tensor, max_new_tokens: int | None = None, *, use_cache: bool = False,
                 static_cache: bool = False, return_logits: bool = False) -> Any:
        """Greedy continuation of ``src <sep>``: ``(B, <= max_new_tokens)`` ids,
        PAD after each row's EOS; stops once every row has an EOS.

        ``use_cache=True`` runs the prompt once and then only the newest token
        per step, reusing every layer's keys and values from a KV cache; the
        tokens are the same as without it; ``static_cache=True`` makes those caches
        :class:`attnbook.StaticKVCache` (preallocated, written in place) instead of the
        concatenating :class:`attnbook.KVCache`. ``return_logits=True`` also returns
        the logits of each generated position, ``(B, steps, V)``."""
        _check_ids("src", src, len(self.vocab))
        room = self.max_len - src.shape[1]  # the last step reads S + 1 + (max_new_tokens - 1) tokens
        max_new_tokens = room if max_new_tokens is None else max_new_tokens
        check_int("max_new_tokens", max_new_tokens, None)
        if not 1 <= max_new_tokens <= room:
            raise ValueError(
                f"max_new_tokens must be an int in [1, max_len - S = {room}] (S={src.shape[1]}, "
                f"max_len={self.max_len}), got {max_new_tokens!r}"
            )
        seq = torch.cat([src, torch.full_like(src[:, :1], self.vocab.sep_id)], dim=1)  # (B, S + 1)
        start = seq.shape[1]
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        caches = self.new_caches(static=static_cache) if use_cache else None
        step_logits = []
        for step in range(max_new_tokens):
            if use_cache:
                new = seq if step == 0 else seq[:, -1:]  # the prompt once, then one token at a time
                logits = self(new, caches=caches)[:, -1]  # (B, V)
            else:
                logits = self(seq)[:, -1]  # (B, V): the whole sequence again
            step_logits.append(logits)
            nxt = logits.argmax(-1)  # (B,)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            done |= nxt == self.vocab.eos_id
            if bool(done.all()):
                break
        out = self.vocab.stop_after_eos(seq[:, start:])
        return (out, torch.stack(step_logits, dim=1)) if return_logits else out
