"""A real pretrained model rebuilt from attnbook's own modules: all-MiniLM-L6-v2 (chapter 10).

* :mod:`attnbook.pretrained.files`: where the three files come from (a directory, an installed bundle, or
  the Hugging Face hub where allowed) and their sha256 check;
* :mod:`attnbook.pretrained.model`: :class:`MiniLM` built from :class:`attnbook.layers.TransformerEncoderLayer`,
  :func:`load_minilm`, the tokenizer helpers and :func:`head_stats` (what each head attends to).

Its explorer is :func:`attnbook.explorers.minilm_explorer`.

Credit and licence: the weights are by the sentence-transformers authors (Nils Reimers and colleagues),
fine-tuned from Microsoft's MiniLM (Wang et al., 2020, "MiniLM: Deep Self-Attention Distillation for
Task-Agnostic Compression of Pre-Trained Transformers", checkpoint ``nreimers/MiniLM-L6-H384-uncased``),
and are released under the Apache License 2.0. attnbook redistributes nothing: it reads the files from
where they are installed.
"""

from __future__ import annotations

from .files import BUNDLES, INSTALL_HINT, MODEL_ID, REVISION, SHA256, locate_files, verify_files
from .model import MEASURES, BertEmbeddings, Encoded, MiniLM, head_stats, load_minilm, tokenize, word_spans

__all__ = [
    "MODEL_ID",
    "REVISION",
    "SHA256",
    "BUNDLES",
    "INSTALL_HINT",
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
]
