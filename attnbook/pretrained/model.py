"""all-MiniLM-L6-v2 rebuilt from attnbook's own modules: the model, its tokenizer, and what its heads do.

all-MiniLM-L6-v2 (https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2) is a small BERT-style
encoder: 6 layers of 12 heads, model width 384, feed-forward width 1536, post-LN, exact (erf) GELU,
LayerNorm eps 1e-12, learned absolute positions (512) and token type embeddings. Here every layer is an
:class:`attnbook.layers.TransformerEncoderLayer`, so every attention block is an
:class:`attnbook.MultiHeadAttention`, and the positions are an
:class:`attnbook.positional.LearnedPositionalEmbedding`; the weights are copied in from the model's
``model.safetensors``, found and verified by :mod:`attnbook.pretrained.files`.

At run time only torch, safetensors and tokenizers are needed (not ``transformers``).

Dimension legend:
    B  batch size
    N  number of layers (6)
    H  number of heads per layer (12)
    T  query length,  S  key length (T = S here: self-attention)
    D  head dimension (32)
    E  model dimension (384)
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn as nn

from .._checks import shape_str
from ..layers import TransformerEncoderLayer
from ..masks import from_key_padding_mask
from ..positional import LearnedPositionalEmbedding
from .files import locate_files

__all__ = ["MiniLM", "BertEmbeddings", "Encoded", "load_minilm", "tokenize", "word_spans", "head_stats", "MEASURES"]


class BertEmbeddings(nn.Module):
    """Token + learned absolute position + token type embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, d_model: int, max_positions: int, type_vocab_size: int,
                 layer_norm_eps: float, dropout: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d_model)
        self.position_embeddings = LearnedPositionalEmbedding(d_model, max_positions, init_std=1.0)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)  # (B, T): one sentence, type 0
        x = self.position_embeddings(self.word_embeddings(input_ids))  # (B, T, E): tokens + positions
        x = x + self.token_type_embeddings(token_type_ids)  # (B, T, E)
        return self.dropout(self.norm(x))


class MiniLM(nn.Module):
    """A BERT encoder (all-MiniLM-L6-v2's shape by default) built from attnbook's modules.

    ``forward(input_ids (B, T), attention_mask (B, T) of 1 = real token / 0 = padding, token_type_ids=None)``
    returns ``(hidden_states, attentions)``: a tuple of N + 1 tensors ``(B, T, E)`` (the embeddings, then
    the output of each layer) and a tuple of N weight tensors ``(B, H, T, T)``, as a ``transformers``
    ``BertModel`` with ``output_hidden_states=True, output_attentions=True``.
    """

    def __init__(self, config: dict):
        super().__init__()
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only exact GELU is supported, config has hidden_act={config['hidden_act']!r}")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"only absolute positions are supported, got {config['position_embedding_type']!r}")
        self.config = dict(config)
        E, H = config["hidden_size"], config["num_attention_heads"]
        eps = config["layer_norm_eps"]
        self.embeddings = BertEmbeddings(config["vocab_size"], E, config["max_position_embeddings"],
                                         config["type_vocab_size"], eps, config["hidden_dropout_prob"])
        layer = dict(d_model=E, num_heads=H, dim_feedforward=config["intermediate_size"],
                     dropout=config["hidden_dropout_prob"], activation="gelu", norm_first=False,
                     layer_norm_eps=eps)
        self.layers = nn.ModuleList(TransformerEncoderLayer(**layer) for _ in range(config["num_hidden_layers"]))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return self.config["num_attention_heads"]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be an integer tensor (B, T), got {getattr(input_ids, 'dtype', input_ids)}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T), got {shape_str(input_ids)}")
        T, max_t = input_ids.shape[1], self.config["max_position_embeddings"]
        if T > max_t:
            raise ValueError(f"sequence length {T} exceeds the {max_t} learned positions")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask {shape_str(attention_mask)} must match input_ids {shape_str(input_ids)}")
        mask = from_key_padding_mask(attention_mask.to(input_ids.device) == 0)  # (B, 1, 1, S), True = real key
        x = self.embeddings(input_ids.long(), token_type_ids)  # (B, T, E)
        hidden, attentions = [x], []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights=True)  # (B, T, E), (B, H, T, T)
            hidden.append(x)
            attentions.append(w)
        return tuple(hidden), tuple(attentions)

    # -- loading a BERT checkpoint ---------------------------------------------------
    @staticmethod
    def bert_names(num_layers: int) -> dict[str, str]:
        """Our parameter name -> the BERT checkpoint's name for it."""
        names = {
            "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
            "embeddings.position_embeddings.embedding.weight": "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
            "embeddings.norm.weight": "embeddings.LayerNorm.weight",
            "embeddings.norm.bias": "embeddings.LayerNorm.bias",
        }
        per_layer = {
            "self_attn.q_proj": "attention.self.query",
            "self_attn.k_proj": "attention.self.key",
            "self_attn.v_proj": "attention.self.value",
            "self_attn.out_proj": "attention.output.dense",
            "norm1": "attention.output.LayerNorm",  # post-LN: norm(x + attention(x))
            "ff.linear1": "intermediate.dense",
            "ff.linear2": "output.dense",
            "norm2": "output.LayerNorm",  # norm(x + feed_forward(x))
        }
        for i in range(num_layers):
            for ours, theirs in per_layer.items():
                for p in ("weight", "bias"):
                    names[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
        return names

    def load_bert_state(self, state: dict[str, torch.Tensor]) -> MiniLM:
        """Copy a BERT checkpoint's tensors in (every parameter must be found, with its shape); the
        pooler and the ``position_ids`` buffer, which this encoder does not use, are the only leftovers
        allowed."""
        names = self.bert_names(self.num_layers)
        own = self.state_dict()
        if set(own) != set(names):
            raise RuntimeError(f"parameter names changed: {sorted(set(own) ^ set(names))}")
        missing = [theirs for theirs in names.values() if theirs not in state]
        if missing:
            raise ValueError(f"the checkpoint lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        unused = [k for k in state if k not in names.values() and not k.startswith("pooler.")
                  and k != "embeddings.position_ids"]
        if unused:
            raise ValueError(f"the checkpoint has tensors this model does not use: {unused[:5]}")
        new = {}
        for ours, theirs in names.items():
            if state[theirs].shape != own[ours].shape:
                raise ValueError(f"{theirs} has shape {shape_str(state[theirs])}, {ours} needs {shape_str(own[ours])}")
            new[ours] = state[theirs]
        self.load_state_dict(new, strict=True)
        return self


def _load_tokenizer(path: Path, max_length: int) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.no_padding()  # tokenizer.json pads every input to 128 tokens; pad a batch to its longest instead
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    tok.enable_truncation(max_length=max_length)  # the learned positions' limit (the file says 128)
    return tok


def load_minilm(source: str | os.PathLike[str] | None = None) -> tuple[MiniLM, Any]:
    """Load all-MiniLM-L6-v2 into a :class:`MiniLM`; returns ``(model, tokenizer)``, the model in eval mode
    on the CPU, the tokenizer a ``tokenizers.Tokenizer`` that pads a batch to its longest sentence.

    ``source``: a directory with ``config.json``, ``model.safetensors`` and ``tokenizer.json``; ``None``
    looks for an installed bundle, then (in Colab or with ``ATTNBOOK_ALLOW_DOWNLOAD=1``) downloads the
    pinned revision. Every file's sha256 is verified before it is read.
    """
    from safetensors.torch import load_file

    directory = locate_files(source)
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    model = MiniLM(config)
    model.load_bert_state(load_file(str(directory / "model.safetensors")))
    tokenizer = _load_tokenizer(directory / "tokenizer.json", config["max_position_embeddings"])
    return model.eval(), tokenizer


# --------------------------------------------------------------------- tokens
class Encoded(NamedTuple):
    input_ids: torch.Tensor  # (B, T) int64
    attention_mask: torch.Tensor  # (B, T) int64, 1 = real token, 0 = padding
    tokens: list[list[str]]  # B lists of T token strings ("[PAD]" where padded)


def tokenize(tokenizer: Any, sentences: str | Sequence[str]) -> Encoded:
    """Tokenize one sentence or a batch, padded to the longest: ``(input_ids, attention_mask, tokens)``."""
    if isinstance(sentences, str):
        sentences = [sentences]
    sentences = list(sentences)
    if not sentences or not all(isinstance(s, str) for s in sentences):
        raise TypeError(f"sentences must be a string or a non-empty list of strings, got {sentences!r}")
    encodings = tokenizer.encode_batch(sentences)
    T = max(len(e.ids) for e in encodings)
    pad_id = tokenizer.token_to_id("[PAD]")
    ids = [e.ids + [pad_id] * (T - len(e.ids)) for e in encodings]  # padded here too, whatever the
    mask = [e.attention_mask + [0] * (T - len(e.ids)) for e in encodings]  # tokenizer's own settings
    tokens = [e.tokens + ["[PAD]"] * (T - len(e.ids)) for e in encodings]
    return Encoded(torch.tensor(ids), torch.tensor(mask), tokens)


def word_spans(tokens: Sequence[str]) -> list[tuple[str, list[int]]]:
    """Group WordPiece tokens into words: ``[(word, [positions]), ...]``; ``##`` pieces join the word
    before them, special tokens ([CLS], [SEP], [PAD]) are left out."""
    spans: list[tuple[str, list[int]]] = []
    for i, tok in enumerate(tokens):
        if tok in ("[CLS]", "[SEP]", "[PAD]"):
            continue
        if tok.startswith("##") and spans and spans[-1][1][-1] == i - 1:
            word, pos = spans[-1]
            spans[-1] = (word + tok[2:], pos + [i])
        else:
            spans.append((tok, [i]))
    return spans


# --------------------------------------------------------------------- what the heads do
MEASURES = ("previous", "next", "self", "[CLS]", "[SEP]", "punctuation")


def _is_punct_char(ch: str) -> bool:
    """As the BERT tokenizer's ``_is_punctuation``: the ASCII symbols (``$``, ``^``, ``~`` too) and every
    character of a Unicode punctuation category (P*), such as the Chinese comma "，" and full stop "。"."""
    cp = ord(ch)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
        unicodedata.category(ch).startswith("P")


def _is_punct(tok: str) -> bool:
    return bool(tok) and all(_is_punct_char(ch) for ch in tok)


def head_stats(attentions: Sequence[torch.Tensor], tokens: Sequence[Sequence[str]],
               attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The share of attention weight each head puts on each kind of key, averaged over the queries.

    ``attentions``: N tensors (B, H, T, T); ``tokens``: B lists of T strings; ``attention_mask`` (B, T).
    The queries are every real token except [CLS] and [SEP] (pooled over the batch). For each one,
    ``previous`` / ``next`` / ``self`` is the weight on the key just before it / just after it / itself
    (the first word's previous token is [CLS], the last one's next is [SEP]); ``[CLS]``, ``[SEP]`` and
    ``punctuation`` are the weight on those keys. Returns ``{measure: (N, H) tensor}`` in [0, 1].
    """
    A = torch.stack([a.detach().float() for a in attentions], dim=1)  # (B, N, H, T, S)
    B, N, H, T, S = A.shape
    if len(tokens) != B or any(len(t) != T for t in tokens) or attention_mask.shape != (B, T):
        raise ValueError(f"attentions {shape_str(A)} (B, N, H, T, S), {len(tokens)} token lists and "
                         f"attention_mask {shape_str(attention_mask)} do not agree")
    real = attention_mask.bool().cpu()  # (B, T)
    special = torch.tensor([[t in ("[CLS]", "[SEP]", "[PAD]") for t in row] for row in tokens])  # (B, T)
    queries = real & ~special  # (B, T)
    eye = torch.eye(T, dtype=torch.bool)  # (T, S)
    key_kinds = {
        "previous": eye.roll(-1, dims=1).tril(-1).expand(B, T, S),  # key i - 1 for query i
        "next": eye.roll(1, dims=1).triu(1).expand(B, T, S),  # key i + 1
        "self": eye.expand(B, T, S),
        "[CLS]": torch.tensor([[t == "[CLS]" for t in row] for row in tokens])[:, None, :].expand(B, T, S),
        "[SEP]": torch.tensor([[t == "[SEP]" for t in row] for row in tokens])[:, None, :].expand(B, T, S),
        "punctuation": torch.tensor([[_is_punct(t) for t in row] for row in tokens])[:, None, :].expand(B, T, S),
    }
    n = queries.sum().clamp_min(1)
    out = {}
    for name, keys in key_kinds.items():
        share = (A * keys[:, None, None]).sum(-1)  # (B, N, H, T): weight each query puts on those keys
        out[name] = (share * queries[:, None, None, :]).sum((0, 3)) / n  # (N, H)
    return out
