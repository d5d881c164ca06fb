"""Toy sequence tasks and two tiny transformers that learn them in seconds on a CPU.

Dimension legend:
    B  batch size
    H  number of heads
    S  source length (``task.src_len``)
    L  target length including the final EOS (``task.tgt_len + 1``)
    T  length of the sequence a model reads (decoder input, or "src SEP tgt")
    E  model dimension (``d_model``)
    V  vocabulary size

Tasks. ``copy_task``, ``reverse_task``, ``sort_task`` and ``addition_task``
return a :class:`Task`; ``task.batch(batch_size, seed=...)`` gives
``(src (B, S), tgt (B, L))`` LongTensors, the same for the same seed. Every
target ends with EOS. Sources have a fixed length, so no padding is needed.

* copy:     ``31415926`` -> ``31415926``
* reverse:  ``31415926`` -> ``62951413``
* sort:     ``31415926`` -> ``11234569``
* addition: ``123+456``  -> ``9750``: the sum, zero-padded to ``num_digits + 1``
  digits and written **least significant digit first** (``reverse_answer=True``,
  the default), so that each answer digit only needs the operand digits at
  the same place and the carry from the digit just written, the order in which
  we add by hand. ``task.pretty(src, tgt)`` shows it the usual way round
  (``123+456=0579``). With ``reverse_answer=False`` the answer reads
  ``0579``, which is harder to learn: the first digit written depends on every
  carry.

Train/test split: each source is assigned to the held-out "test" split (about
10% of all sources) by a fixed hash of its tokens; ``batch(split="train")``
never yields a test source and ``batch(split="test")`` only yields those, so an
accuracy measured on the test split is on sequences the model never saw.

Vocabulary: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<sep>`` = 3, then
one token per symbol (a single character each). ``task.encode("31415926")``
turns text you type into a source batch ``(1, S)``; ``task.decode(ids)`` turns
ids back into text.

Models (batch-first, bool masks True = may attend, learned position embeddings):

* :class:`Seq2SeqTransformer`: encoder over the source, decoder with causal
  self-attention and cross-attention over the encoder's output.
* :class:`DecoderOnlyTransformer`: a causal language model over
  ``src <sep> tgt`` that is only trained to predict the ``tgt`` part.

Both have ``loss(src, tgt)``, a greedy ``generate(src, max_new_tokens)``,
``forward(..., return_attention=True)`` (per-layer weights ``(B, H, T, S)`` for
plotting) and ``source_attention(src, tgt)`` (how each target token's query
attends to the source, used by :func:`attnbook.train.attention_alignment`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .core import _shape
from .kvcache import KVCache
from .layers import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer
from .masks import causal_mask

__all__ = [
    "Vocab",
    "Task",
    "copy_task",
    "reverse_task",
    "sort_task",
    "addition_task",
    "Seq2SeqTransformer",
    "DecoderOnlyTransformer",
]

PAD, BOS, EOS, SEP = "<pad>", "<bos>", "<eos>", "<sep>"
_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz"
_TEST_SHARE = 10  # one source in 10 is held out for testing


class Vocab:
    """Special tokens ``<pad> <bos> <eos> <sep>`` (ids 0-3), then one token per symbol.

    ``encode("3141")`` -> LongTensor ``(4,)`` (whitespace is ignored);
    ``decode(ids)`` -> text, stopping at the first EOS and leaving out the
    special tokens (``skip_special=False`` shows them as ``<bos>`` etc.). A
    ``(B, L)`` tensor decodes to a list of B strings.
    """

    pad_id, bos_id, eos_id, sep_id = 0, 1, 2, 3
    specials = (PAD, BOS, EOS, SEP)

    def __init__(self, symbols: str | Sequence[str]):
        symbols = list(symbols)
        for s in symbols:
            if not isinstance(s, str) or len(s) != 1 or s.isspace():
                raise ValueError(f"each symbol must be one non-space character, got {s!r}")
        if len(set(symbols)) != len(symbols):
            raise ValueError(f"symbols must be distinct, got {''.join(symbols)!r}")
        self.symbols = "".join(symbols)
        self.tokens = [*self.specials, *symbols]
        self._id = {t: i for i, t in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"Vocab(symbols={self.symbols!r}, size={len(self)})"

    def encode(self, text: str | Sequence[str]) -> torch.Tensor:
        """Text (one character per symbol; special tokens may be given as list
        items) -> LongTensor ``(length,)``."""
        items = [c for c in text if not c.isspace()] if isinstance(text, str) else list(text)
        ids = []
        for c in items:
            if c not in self._id:
                raise ValueError(
                    f"unknown symbol {c!r}; this vocabulary has {self.symbols!r} and {list(self.specials)}"
                )
            ids.append(self._id[c])
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids, *, skip_special: bool = True, stop_at_eos: bool = True) -> str | list[str]:
        """LongTensor ``(L,)`` -> str, or ``(B, L)`` -> list of B strings."""
        ids = torch.as_tensor(ids)
        if ids.dim() == 2:
            return [self.decode(row, skip_special=skip_special, stop_at_eos=stop_at_eos) for row in ids]
        if ids.dim() != 1:
            raise ValueError(f"ids must be (L,) or (B, L), got {_shape(ids)}")
        out = []
        for i in ids.tolist():
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"id {i} is outside the vocabulary (size {len(self)})")
            if i == self.eos_id and stop_at_eos:
                break
            if i < len(self.specials) and skip_special:
                continue
            out.append(self.tokens[i])
        return "".join(out)


def _test_split(src: torch.Tensor) -> torch.Tensor:
    """Bool (B,): True for the sources held out for testing (a fixed hash of the tokens)."""
    h = torch.zeros(src.shape[0], dtype=torch.long)
    for j in range(src.shape[1]):
        h = (h * 1_000_003 + src[:, j] + 1) % 2_147_483_647
    h = (h * 48_271) % 2_147_483_647
    return (h % _TEST_SHARE) == 0


@dataclass(frozen=True, eq=False)
class Task:
    """A seq-to-seq toy task with fixed lengths.

    Attributes:
        name: ``"copy"``, ``"reverse"``, ``"sort"`` or ``"addition"``.
        vocab: the :class:`Vocab` for sources and targets.
        src_len: source length S.
        tgt_len: number of answer tokens; targets hold ``tgt_len + 1`` tokens (EOS last).
        description: one line saying what the task asks for.
    """

    name: str
    vocab: Vocab
    src_len: int
    tgt_len: int
    description: str
    _sample_src: Callable[[int, torch.Generator], torch.Tensor] = field(repr=False)
    _solve: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)
    _align: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(repr=False)
    _pretty: Callable[[str, str], str] | None = field(default=None, repr=False)

    def check_src(self, src: torch.Tensor) -> None:
        """Raise a clear error unless ``src`` is a LongTensor (B, S) of symbol ids."""
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"src must be a torch.Tensor, got {type(src).__name__}")
        if src.dtype != torch.long:
            raise TypeError(f"src must be a LongTensor of token ids, got {src.dtype}")
        if src.dim() != 2 or src.shape[1] != self.src_len:
            raise ValueError(f"{self.name} sources must be (B, S={self.src_len}), got {_shape(src)}")
        n_special = len(Vocab.specials)
        if src.numel() and (int(src.min()) < n_special or int(src.max()) >= len(self.vocab)):
            raise ValueError(
                f"src ids must be symbol ids in [{n_special}, {len(self.vocab)}), got {src.unique().tolist()}"
            )

    def solve(self, src: torch.Tensor) -> torch.Tensor:
        """The correct targets ``(B, L)`` (answer tokens then EOS) for sources ``(B, S)``."""
        self.check_src(src)
        src = src.cpu()
        answer = self._solve(src)  # (B, tgt_len)
        eos = torch.full((src.shape[0], 1), Vocab.eos_id, dtype=torch.long)
        return torch.cat([answer, eos], dim=1)  # (B, L)

    def batch(
        self,
        batch_size: int,
        seed: int | None = 0,
        *,
        split: str = "train",
        generator: torch.Generator | None = None,
        device=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch ``(src (B, S), tgt (B, L))``.

        The same ``seed`` gives the same batch; pass a ``generator`` instead to
        draw a stream of different batches. ``split`` is ``"train"`` or
        ``"test"`` (disjoint sets of sources, see the module docstring) or
        ``"all"``.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        if generator is None:
            if seed is None:
                raise ValueError("give a seed or a generator")
            generator = torch.Generator().manual_seed(seed)
        chunks, have = [], 0
        while have < batch_size:
            want = batch_size - have
            draw = want if split == "all" else (want * _TEST_SHARE * 2 if split == "test" else want + want // 4 + 8)
            src = self._sample_src(draw, generator)  # (draw, S)
            if split != "all":
                in_test = _test_split(src)
                src = src[in_test if split == "test" else ~in_test]
            chunks.append(src[:want])
            have += len(chunks[-1])
        src = torch.cat(chunks)  # (B, S)
        tgt = self.solve(src)  # (B, L)
        return src.to(device), tgt.to(device)

    def alignment_targets(self, src: torch.Tensor, tgt: torch.Tensor | None = None) -> torch.Tensor:
        """Bool ``(B, L, S)``: True where the query that predicts target token
        ``k`` is expected to look at source position ``s`` (the diagonal for
        copy, the anti-diagonal for reverse, the equal symbols for sort, the
        operand digits of the same place for addition). Rows with no expected
        position (EOS, the carry digit of a sum) are all False."""
        self.check_src(src)
        src = src.cpu()
        tgt = self.solve(src) if tgt is None else tgt.cpu()
        expected = self._align(src, tgt[:, : self.tgt_len])  # (B, tgt_len, S)
        none = torch.zeros(src.shape[0], 1, self.src_len, dtype=torch.bool)
        return torch.cat([expected, none], dim=1)  # (B, L, S)

    def encode(self, text: str | Sequence[str]) -> torch.Tensor:
        """A source you type, e.g. ``"31415926"`` or ``"123+456"``, as a batch ``(1, S)``."""
        src = self.vocab.encode(text)[None]  # (1, S)
        if src.shape[1] != self.src_len:
            raise ValueError(f"{self.name} sources have {self.src_len} symbols, got {src.shape[1]} in {text!r}")
        self.check_src(src)
        return src

    def decode(self, ids) -> str | list[str]:
        """Token ids ``(L,)`` or ``(B, L)`` -> text (stops at EOS, hides special tokens)."""
        return self.vocab.decode(ids)

    def pretty(self, src: torch.Tensor, tgt: torch.Tensor) -> list[str]:
        """One readable line per example, e.g. ``"31415926 -> 62951413"`` or ``"123+456=0579"``."""
        srcs, tgts = self.vocab.decode(src), self.vocab.decode(tgt)
        if self._pretty is not None:
            return [self._pretty(s, t) for s, t in zip(srcs, tgts)]
        return [f"{s} -> {t}" for s, t in zip(srcs, tgts)]


def _check_sizes(length: int, num_symbols: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if isinstance(num_symbols, bool) or not isinstance(num_symbols, int) or not 2 <= num_symbols <= len(_SYMBOLS):
        raise ValueError(f"num_symbols must be an int in [2, {len(_SYMBOLS)}], got {num_symbols!r}")


def _symbol_task(name, description, length, num_symbols, solve, align) -> Task:
    _check_sizes(length, num_symbols)
    vocab = Vocab(_SYMBOLS[:num_symbols])
    first = len(Vocab.specials)

    def sample(n: int, g: torch.Generator) -> torch.Tensor:
        return torch.randint(first, first + num_symbols, (n, length), generator=g)  # (n, S)

    return Task(name, vocab, length, length, description, sample, solve, align)


def copy_task(length: int = 8, num_symbols: int = 10) -> Task:
    """Repeat the source: ``31415926 -> 31415926``. Expected attention: the diagonal."""

    def align(src, answer):
        eye = torch.eye(length, dtype=torch.bool)  # (L, S)
        return eye.expand(src.shape[0], length, length)  # (B, L, S)

    return _symbol_task("copy", "repeat the source", length, num_symbols, lambda s: s.clone(), align)


def reverse_task(length: int = 8, num_symbols: int = 10) -> Task:
    """Reverse the source: ``31415926 -> 62951413``. Expected attention: the anti-diagonal."""

    def align(src, answer):
        anti = torch.eye(length, dtype=torch.bool).flip(-1)  # (L, S)
        return anti.expand(src.shape[0], length, length)  # (B, L, S)

    return _symbol_task("reverse", "reverse the source", length, num_symbols, lambda s: s.flip(-1), align)


def sort_task(length: int = 8, num_symbols: int = 10) -> Task:
    """Sort the source ascending: ``31415926 -> 11234569``. Expected attention:
    the source positions that hold the symbol being written."""

    def align(src, answer):
        return answer[:, :, None] == src[:, None, :]  # (B, L, S)

    return _symbol_task("sort", "sort the source ascending", length, num_symbols, lambda s: s.sort(-1).values, align)


def addition_task(num_digits: int = 3, *, reverse_answer: bool = True) -> Task:
    """Add two ``num_digits``-digit numbers: ``"123+456"`` -> the sum with
    ``num_digits + 1`` digits, least significant first when ``reverse_answer``
    (``"9750"``), else ``"0579"``. Operands are zero-padded (``"007+045"``).
    Expected attention: answer digit of place ``k`` looks at both operand
    digits of place ``k`` (the carry-out digit has no such position)."""
    if isinstance(num_digits, bool) or not isinstance(num_digits, int) or not 1 <= num_digits <= 9:
        raise ValueError(f"num_digits must be an int in [1, 9], got {num_digits!r}")
    n = num_digits
    vocab = Vocab("0123456789+")
    zero = vocab.encode("0").item()
    plus = vocab.encode("+").item()
    powers = 10 ** torch.arange(n - 1, -1, -1)  # (n,) most significant first

    def sample(count: int, g: torch.Generator) -> torch.Tensor:
        a = torch.randint(zero, zero + 10, (count, n), generator=g)
        b = torch.randint(zero, zero + 10, (count, n), generator=g)
        return torch.cat([a, torch.full((count, 1), plus), b], dim=1)  # (count, 2n+1)

    def solve(src):
        if not bool((src[:, n] == plus).all()) or bool((src[:, :n] == plus).any() | (src[:, n + 1 :] == plus).any()):
            raise ValueError(f"addition sources must read 'a+b' with {n} digits on each side")
        a = ((src[:, :n] - zero) * powers).sum(-1)
        b = ((src[:, n + 1 :] - zero) * powers).sum(-1)
        total = a + b  # (B,)
        places = 10 ** torch.arange(n + 1)  # (n+1,) least significant first
        digits = (total[:, None] // places) % 10 + zero  # (B, n+1) least significant first
        return digits if reverse_answer else digits.flip(-1)

    def align(src, answer):
        B = src.shape[0]
        out = torch.zeros(B, n + 1, 2 * n + 1, dtype=torch.bool)  # (B, L-1, S)
        for k in range(n):  # place k (units = 0)
            row = k if reverse_answer else n - k
            out[:, row, n - 1 - k] = True  # digit of a
            out[:, row, 2 * n - k] = True  # digit of b
        return out

    def pretty(s: str, t: str) -> str:
        return f"{s}={t[::-1] if reverse_answer else t}"

    order = "least significant digit first" if reverse_answer else "most significant digit first"
    description = f"add two {n}-digit numbers; the {n + 1}-digit sum is written {order}"
    return Task("addition", vocab, 2 * n + 1, n + 1, description, sample, solve, align, pretty)


# --------------------------------------------------------------------------- models


class _TokenEmbedding(nn.Module):
    """Token embedding plus a learned position embedding (both N(0, 1) at init)."""

    def __init__(self, vocab_size: int, d_model: int, max_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        T = ids.shape[1]
        if offset + T > self.pos.num_embeddings:
            raise ValueError(
                f"sequence of length {T} at offset {offset} is longer than max_len={self.pos.num_embeddings} "
                f"(positions {offset}..{offset + T - 1})"
            )
        pos = torch.arange(offset, offset + T, device=ids.device)  # (T,)
        return self.tok(ids) + self.pos(pos)  # (B, T, E)


def _check_ids(name: str, ids, vocab_size: int) -> None:
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype != torch.long:
        raise TypeError(f"{name} must be a LongTensor of token ids, got {ids.dtype}")
    if ids.dim() != 2 or ids.shape[1] < 1:
        raise ValueError(f"{name} must be (B, length) token ids, got {_shape(ids)}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{name} ids must be in [0, {vocab_size}), got min {int(ids.min())}, max {int(ids.max())}")


def _check_vocab(vocab) -> Vocab:
    if not isinstance(vocab, Vocab):
        raise TypeError(f"vocab must be an attnbook.tasks.Vocab (e.g. task.vocab), got {type(vocab).__name__}")
    return vocab


def _stop_after_eos(out: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """Replace everything after each row's first EOS by PAD."""
    seen = (out == eos_id).long().cumsum(dim=1)  # (B, L)
    after = (seen - (out == eos_id).long()) > 0  # strictly after the first EOS
    return out.masked_fill(after, pad_id)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder transformer (the original architecture, small).

    Args:
        vocab: the task's :class:`Vocab` (sizes and special ids).
        d_model, num_heads, num_encoder_layers, num_decoder_layers,
        dim_feedforward (default ``4 * d_model``), dropout, activation, norm_first:
            as in :mod:`attnbook.layers`; pre-LN stacks get a final LayerNorm.
        max_len: longest source or target sequence (learned positions).

    ``forward(src (B, S), tgt_in (B, T), *, return_attention=False)`` returns
    logits ``(B, T, V)`` for the token after each ``tgt_in`` position; with
    ``return_attention=True`` it returns ``(logits, attn)`` where ``attn`` is a dict
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
        self.src_embed = _TokenEmbedding(V, d_model, max_len)
        self.tgt_embed = _TokenEmbedding(V, d_model, max_len)
        enc = TransformerEncoderLayer(d_model, num_heads, dim_feedforward, dropout, activation, norm_first)
        dec = TransformerDecoderLayer(d_model, num_heads, dim_feedforward, dropout, activation, norm_first)
        self.encoder = TransformerEncoder(enc, num_encoder_layers, nn.LayerNorm(d_model) if norm_first else None)
        self.decoder = TransformerDecoder(dec, num_decoder_layers, nn.LayerNorm(d_model) if norm_first else None)
        self.head = nn.Linear(d_model, V)  # E -> V

    def _src_mask(self, src):
        real = src != self.vocab.pad_id  # (B, S)
        if bool(real.all()):
            return None  # no padding: no mask, and the fused attention kernel
        return real[:, None, None, :]  # (B, 1, 1, S)

    def encode(self, src: torch.Tensor, *, need_weights: bool = False):
        """Encoder output ``memory (B, S, E)`` (and its per-layer weights)."""
        _check_ids("src", src, len(self.vocab))
        return self.encoder(self.src_embed(src), self._src_mask(src), need_weights=need_weights)

    def decode(self, tgt_in, memory, src, *, need_weights: bool = False):
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

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *, return_attention: bool = False):
        if not return_attention:
            return self.decode(tgt_in, self.encode(src), src)  # (B, T, V)
        memory, w_enc = self.encode(src, need_weights=True)
        logits, w_self, w_cross = self.decode(tgt_in, memory, src, need_weights=True)
        return logits, {"encoder": w_enc, "decoder_self": w_self, "decoder_cross": w_cross}

    def _teacher_input(self, tgt):
        bos = torch.full_like(tgt[:, :1], self.vocab.bos_id)
        return torch.cat([bos, tgt[:, :-1]], dim=1)  # (B, L): BOS, then the target shifted right

    def loss(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of predicting ``tgt (B, L)`` with teacher forcing (PAD ignored)."""
        _check_ids("tgt", tgt, len(self.vocab))
        logits = self(src, self._teacher_input(tgt))  # (B, L, V)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=self.vocab.pad_id)

    def source_attention(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        """Cross-attention of each decoder layer under teacher forcing:
        ``(B, H, L, S)``, row ``k`` being the query that predicts ``tgt[:, k]``."""
        _, attn = self(src, self._teacher_input(tgt), return_attention=True)
        return attn["decoder_cross"]

    @torch.no_grad()
    def generate(self, src: torch.Tensor, max_new_tokens: int | None = None) -> torch.Tensor:
        """Greedy decoding: ``(B, <= max_new_tokens)`` token ids; rows stop at
        EOS (then PAD) and decoding ends once every row has an EOS."""
        max_new_tokens = self.max_len if max_new_tokens is None else max_new_tokens
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, int)
            or not 1 <= max_new_tokens <= self.max_len
        ):
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
        return _stop_after_eos(ys[:, 1:], self.vocab.eos_id, self.vocab.pad_id)


class DecoderOnlyTransformer(nn.Module):
    """Causal (GPT-style) transformer over ``src <sep> tgt``, built from
    :class:`attnbook.layers.TransformerEncoderLayer` with a causal mask.

    Args:
        vocab: the task's :class:`Vocab`.
        d_model, num_heads, num_layers, dim_feedforward (default ``4 * d_model``),
        dropout, activation, norm_first: as in :mod:`attnbook.layers`.
        max_len: longest sequence ``S + 1 + L``.

    ``forward(ids (B, T), *, return_attention=False)`` returns logits
    ``(B, T, V)`` for the next token at every position; with
    ``return_attention=True``, ``(logits, {"self": [weights (B, H, T, T) per layer]})``.
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
        self.embed = _TokenEmbedding(V, d_model, max_len)
        layer = TransformerEncoderLayer(d_model, num_heads, dim_feedforward, dropout, activation, norm_first)
        self.blocks = TransformerEncoder(layer, num_layers, nn.LayerNorm(d_model) if norm_first else None)
        self.head = nn.Linear(d_model, V)  # E -> V

    def forward(self, ids: torch.Tensor, *, return_attention: bool = False, caches=None):
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
        if not return_attention:
            return self.head(self.blocks(x, mask, caches=caches))  # (B, T, V)
        y, weights = self.blocks(x, mask, need_weights=True, caches=caches)
        return self.head(y), {"self": weights}

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`attnbook.KVCache` per layer."""
        return [KVCache() for _ in self.blocks.layers]

    def _sequence(self, src, tgt):
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
        _, attn = self(seq[:, :-1], return_attention=True)
        return [w[:, :, S : S + L, :S] for w in attn["self"]]

    @torch.no_grad()
    def generate(self, src: torch.Tensor, max_new_tokens: int | None = None, *, use_cache: bool = False,
                 return_logits: bool = False):
        """Greedy continuation of ``src <sep>``: ``(B, <= max_new_tokens)`` ids,
        PAD after each row's EOS; stops once every row has an EOS.

        ``use_cache=True`` runs the prompt once and then only the newest token
        per step, reusing every layer's keys and values from a KV cache; the
        tokens are the same as without it. ``return_logits=True`` also returns
        the logits of each generated position, ``(B, steps, V)``."""
        _check_ids("src", src, len(self.vocab))
        room = self.max_len - src.shape[1]  # the last step reads S + 1 + (max_new_tokens - 1) tokens
        max_new_tokens = room if max_new_tokens is None else max_new_tokens
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= room:
            raise ValueError(
                f"max_new_tokens must be an int in [1, max_len - S = {room}] (S={src.shape[1]}, "
                f"max_len={self.max_len}), got {max_new_tokens!r}"
            )
        seq = torch.cat([src, torch.full_like(src[:, :1], self.vocab.sep_id)], dim=1)  # (B, S + 1)
        start = seq.shape[1]
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        caches = self.new_caches() if use_cache else None
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
        out = _stop_after_eos(seq[:, start:], self.vocab.eos_id, self.vocab.pad_id)
        return (out, torch.stack(step_logits, dim=1)) if return_logits else out
