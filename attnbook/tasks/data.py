"""Toy sequence tasks: vocabularies, the four tasks and their batches.

Dimension legend:
    B  batch size
    S  source length (``task.src_len``)
    L  target length including the final EOS (``task.tgt_len + 1``)

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.types import Device

from .._checks import check_int, shape_str

__all__ = [
    "Vocab",
    "Task",
    "copy_task",
    "reverse_task",
    "sort_task",
    "addition_task",
    "PAD",
    "BOS",
    "EOS",
    "SEP",
]

PAD, BOS, EOS, SEP = "<pad>", "<bos>", "<eos>", "<sep>"
_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz"
_TEST_SHARE = 10  # one source in 10 is held out for testing


def _check_ids_2d(name: str, ids: object) -> None:
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids (B, L), got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got {ids.dtype}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must be (B, L) token ids, got shape {shape_str(ids)}")


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

    def decode(self, ids: torch.Tensor | Sequence[int], *, skip_special: bool = True,
               stop_at_eos: bool = True) -> str | list[str]:
        """LongTensor ``(L,)`` -> str, or ``(B, L)`` -> list of B strings."""
        ids = torch.as_tensor(ids)
        if ids.dim() == 2:
            return [self._decode_row(row, skip_special, stop_at_eos) for row in ids]
        if ids.dim() != 1:
            raise ValueError(f"ids must be (L,) or (B, L), got {shape_str(ids)}")
        return self._decode_row(ids, skip_special, stop_at_eos)

    def shift_right(self, tgt: torch.Tensor) -> torch.Tensor:
        """The decoder's input under teacher forcing: BOS, then ``tgt (B, L)`` shifted right by one (its last
        token dropped), so that position k predicts ``tgt[:, k]`` having seen ``tgt[:, :k]``."""
        _check_ids_2d("tgt", tgt)
        bos = torch.full_like(tgt[:, :1], self.bos_id)  # (B, 1)
        return torch.cat([bos, tgt[:, :-1]], dim=1)  # (B, L)

    def stop_after_eos(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids (B, L)`` with everything after each row's first EOS replaced by PAD (what a greedy decoder
        wrote once it was done)."""
        _check_ids_2d("ids", ids)
        eos = (ids == self.eos_id).long()  # (B, L)
        after = (eos.cumsum(dim=1) - eos) > 0  # (B, L) strictly after the first EOS
        return ids.masked_fill(after, self.pad_id)

    def _decode_row(self, ids: torch.Tensor, skip_special: bool, stop_at_eos: bool) -> str:
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
            raise ValueError(f"{self.name} sources must be (B, S={self.src_len}), got {shape_str(src)}")
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
        device: Device = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch ``(src (B, S), tgt (B, L))``.

        The same ``seed`` gives the same batch; pass a ``generator`` instead to
        draw a stream of different batches. ``split`` is ``"train"`` or
        ``"test"`` (disjoint sets of sources, see the module docstring) or
        ``"all"``.
        """
        check_int("batch_size", batch_size)
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        if generator is None:
            if seed is None:
                raise ValueError("give a seed or a generator")
            generator = torch.Generator().manual_seed(seed)
        chunks: list[torch.Tensor] = []
        have = 0
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

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str | list[str]:
        """Token ids ``(L,)`` or ``(B, L)`` -> text (stops at EOS, hides special tokens)."""
        return self.vocab.decode(ids)

    def pretty(self, src: torch.Tensor, tgt: torch.Tensor) -> list[str]:
        """One readable line per example, e.g. ``"31415926 -> 62951413"`` or ``"123+456=0579"``."""
        srcs, tgts = self.vocab.decode(src), self.vocab.decode(tgt)
        if self._pretty is not None:
            return [self._pretty(s, t) for s, t in zip(srcs, tgts)]
        return [f"{s} -> {t}" for s, t in zip(srcs, tgts)]


def _check_sizes(length: int, num_symbols: int) -> None:
    check_int("length", length)
    check_int("num_symbols", num_symbols, 2, len(_SYMBOLS))


def _symbol_task(name: str, description: str, length: int, num_symbols: int,
                 solve: Callable[[torch.Tensor], torch.Tensor],
                 align: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Task:
    _check_sizes(length, num_symbols)
    vocab = Vocab(_SYMBOLS[:num_symbols])
    first = len(Vocab.specials)

    def sample(n: int, g: torch.Generator) -> torch.Tensor:
        return torch.randint(first, first + num_symbols, (n, length), generator=g)  # (n, S)

    return Task(name, vocab, length, length, description, sample, solve, align)


def copy_task(length: int = 8, num_symbols: int = 10) -> Task:
    """Repeat the source: ``31415926 -> 31415926``. Expected attention: the diagonal."""

    def align(src: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(length, dtype=torch.bool)  # (L, S)
        return eye.expand(src.shape[0], length, length)  # (B, L, S)

    return _symbol_task("copy", "repeat the source", length, num_symbols, lambda s: s.clone(), align)


def reverse_task(length: int = 8, num_symbols: int = 10) -> Task:
    """Reverse the source: ``31415926 -> 62951413``. Expected attention: the anti-diagonal."""

    def align(src: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
        anti = torch.eye(length, dtype=torch.bool).flip(-1)  # (L, S)
        return anti.expand(src.shape[0], length, length)  # (B, L, S)

    return _symbol_task("reverse", "reverse the source", length, num_symbols, lambda s: s.flip(-1), align)


def sort_task(length: int = 8, num_symbols: int = 10) -> Task:
    """Sort the source ascending: ``31415926 -> 11234569``. Expected attention:
    the source positions that hold the symbol being written."""

    def align(src: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
        return answer[:, :, None] == src[:, None, :]  # (B, L, S)

    return _symbol_task("sort", "sort the source ascending", length, num_symbols, lambda s: s.sort(-1).values, align)


def addition_task(num_digits: int = 3, *, reverse_answer: bool = True) -> Task:
    """Add two ``num_digits``-digit numbers: ``"123+456"`` -> the sum with
    ``num_digits + 1`` digits, least significant first when ``reverse_answer``
    (``"9750"``), else ``"0579"``. Operands are zero-padded (``"007+045"``).
    Expected attention: answer digit of place ``k`` looks at both operand
    digits of place ``k`` (the carry-out digit has no such position)."""
    check_int("num_digits", num_digits, 1, 9)
    n = num_digits
    vocab = Vocab("0123456789+")
    zero = int(vocab.encode("0").item())
    plus = int(vocab.encode("+").item())
    powers = 10 ** torch.arange(n - 1, -1, -1)  # (n,) most significant first

    def sample(count: int, g: torch.Generator) -> torch.Tensor:
        a = torch.randint(zero, zero + 10, (count, n), generator=g)
        b = torch.randint(zero, zero + 10, (count, n), generator=g)
        return torch.cat([a, torch.full((count, 1), plus), b], dim=1)  # (count, 2n+1)

    def solve(src: torch.Tensor) -> torch.Tensor:
        if not bool((src[:, n] == plus).all()) or bool((src[:, :n] == plus).any() | (src[:, n + 1 :] == plus).any()):
            raise ValueError(f"addition sources must read 'a+b' with {n} digits on each side")
        a = ((src[:, :n] - zero) * powers).sum(-1)
        b = ((src[:, n + 1 :] - zero) * powers).sum(-1)
        total = a + b  # (B,)
        places = 10 ** torch.arange(n + 1)  # (n+1,) least significant first
        digits = (total[:, None] // places) % 10 + zero  # (B, n+1) least significant first
        return digits if reverse_answer else digits.flip(-1)

    def align(src: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
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
