"""Toy sequence tasks and two tiny transformers that learn them in seconds on a CPU (chapter 7).

* :mod:`attnbook.tasks.data`: the vocabulary (:class:`Vocab`), the tasks (:class:`Task`: copy, reverse,
  sort, addition) and their seeded, split batches;
* :mod:`attnbook.tasks.models`: :class:`Seq2SeqTransformer` and :class:`DecoderOnlyTransformer`, built from
  :mod:`attnbook.layers`.

Training and evaluation live in :mod:`attnbook.train`. Everything is importable from here, e.g.
``from attnbook.tasks import DecoderOnlyTransformer, copy_task``.
"""

from .data import BOS, EOS, PAD, SEP, Task, Vocab, addition_task, copy_task, reverse_task, sort_task
from .models import DecoderOnlyTransformer, Seq2SeqTransformer, TokenEmbedding

__all__ = [
    "Vocab",
    "Task",
    "copy_task",
    "reverse_task",
    "sort_task",
    "addition_task",
    "Seq2SeqTransformer",
    "DecoderOnlyTransformer",
    "TokenEmbedding",
    "PAD",
    "BOS",
    "EOS",
    "SEP",
]
