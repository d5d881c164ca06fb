"""The course's interactive explorers: one module per family, each with one factory named ``<family>_explorer``.

* ``saturation.saturation_explorer()``: d_k and scaling -> softmax saturation (chapter 2);
* ``heads.heads_explorer()``: the number of heads -> every head's map (chapter 3);
* ``masks.masks_explorer()``: mask kind, window, padding -> the mask and the weights it leaves (chapter 4);
* ``positions.positions_explorer()``: encoding, d_model, offset -> how positions relate (chapter 5);
* ``trained_heads.trained_heads_explorer(models, examples)``: task, input, block, layer -> a trained toy
  model's heads (chapter 7);
* ``variants.variants_explorer()``: variant, T, window -> pairs scored, time, memory (chapter 8);
* ``kv_heads.kv_heads_explorer()``: query and key/value heads, context -> KV cache and decoding time (chapter 9);
* ``minilm.minilm_explorer(model, tokenizer)``: layer, head, sentence -> all-MiniLM-L6-v2's heads (chapter 10);
* ``kv_budget.kv_budget_explorer()``: a published model's config and a context length -> its KV cache per
  sequence, split by kind of layer (chapter 12);
* ``block_mask.block_mask_explorer()``: a mask program and a length -> the dense mask and the tiles a
  FlexAttention block mask computes in full, in part or skips (chapter 13);
* ``induction.induction_explorer(history, batch)``: training step, layer, head -> an attention-only model's
  head on a repeated sequence as an induction head forms (chapter 15);
* ``vit.vit_explorer(model, images, labels)``: digit, layer, head, raw or rollout -> what a trained Vision
  Transformer's [CLS] token looks at (chapter 11).

Each factory returns an :class:`attnbook.explorers.base.Explorer`: display it (or leave it as a cell's
last expression) to get the live widget in Jupyter/Colab and the pre-rendered scrubber in the static
book; call ``.update(...)`` and read ``.data`` / ``.figure`` to use it without a browser.
:mod:`attnbook.explorers.base` is the machinery they share; :mod:`attnbook.explorers.live` makes some of them
compute in the rendered book (their computations exported as ONNX graphs, run by the page).

Each factory's home is this package: ``from attnbook.explorers import heads_explorer`` (it loads on first
use, so importing attnbook does not import matplotlib or ipywidgets). A family module holds only its
factory and the constants of its interface (the choices its controls offer); what an explorer computes
lives in the module of that concept (``efficient``, ``kvcache``, ``train``, ...).
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
    "variants_explorer",
    "kv_heads_explorer",
    "minilm_explorer",
    "vit_explorer",
    "kv_budget_explorer",
    "block_mask_explorer",
    "induction_explorer",
    "FACTORIES",
]

_FAMILIES = ("saturation", "heads", "masks", "positions", "trained_heads", "variants", "kv_heads", "minilm", "vit",
             "kv_budget", "block_mask", "induction")
FACTORIES = {f"{family}_explorer": family for family in _FAMILIES}
"""Each factory's name -> the module of its family (``attnbook.explorers.<family>``)."""


def __getattr__(name: str) -> Any:
    if name in FACTORIES:
        return getattr(importlib.import_module(f"{__name__}.{FACTORIES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The factories load on first use (``__getattr__``), so they are not in the module's namespace yet:
    # list them here so that ``dir()`` and tab completion show them.
    return sorted(set(globals()) | set(__all__))
