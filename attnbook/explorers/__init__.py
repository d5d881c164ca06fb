"""The course's explorers: one module per family, each with one factory named ``<family>_explorer``.

=====================  ===========================  ==================================================
module                 factory                      what the reader moves, and sees
=====================  ===========================  ==================================================
``saturation``         ``saturation_explorer()``    d_k, scaling on/off: softmax saturation (ch. 2)
``heads``              ``heads_explorer()``         number of heads: per-head maps (ch. 3)
``masks``              ``masks_explorer()``         mask kind, window, padding: the mask and its weights
                                                    (ch. 4)
``positions``          ``positions_explorer()``     encoding, d_model, offset: position similarities
                                                    (ch. 5)
``trained_heads``      ``trained_heads_explorer()`` task, input, block, layer: a trained toy model's
                                                    heads (ch. 7)
``efficient``          ``efficient_explorer()``     variant, T, window: pairs scored, time, memory (ch. 8)
``gqa``                ``gqa_explorer()``           query and key/value heads, context: KV cache and
                                                    decoding time (ch. 9)
``minilm``             ``minilm_explorer()``        layer, head, sentence: all-MiniLM-L6-v2's heads
                                                    (ch. 10)
=====================  ===========================  ==================================================

Each factory returns an :class:`attnbook.explorers.base.Explorer`: display it (or leave it as a cell's
last expression) to get the live widget in Jupyter/Colab and the pre-rendered scrubber in the static
book; call ``.update(...)`` and read ``.data`` / ``.figure`` to use it without a browser.
:mod:`attnbook.explorers.base` is the machinery they share.

The factories load on first use (``from attnbook.explorers import heads_explorer``); the names the
chapters were written with (``attnbook.widgets.head_explorer``, ``attnbook.efficient_explorer.sequence_explorer``,
...) still work.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "saturation_explorer",
    "heads_explorer",
    "masks_explorer",
    "positions_explorer",
    "trained_heads_explorer",
    "efficient_explorer",
    "gqa_explorer",
    "minilm_explorer",
]

_FAMILIES = ("saturation", "heads", "masks", "positions", "trained_heads", "efficient", "gqa", "minilm")
FACTORIES = {f"{family}_explorer": family for family in _FAMILIES}


def __getattr__(name: str) -> Any:
    if name in FACTORIES:
        return getattr(importlib.import_module(f"{__name__}.{FACTORIES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
