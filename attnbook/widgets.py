"""The explorers of chapters 2 to 5 under the names the chapters use: ``attnbook.widgets.saturation_explorer()``.

A thin re-export: the code lives in :mod:`attnbook.explorers` (``saturation``, ``heads``, ``masks``,
``positions``).
"""

from .explorers.heads import SENTENCES, head_explorer, heads_explorer, token_embeddings
from .explorers.masks import MASK_KINDS, build_mask, mask_explorer, masks_explorer
from .explorers.positions import POSITION_KINDS, position_explorer, positions_explorer
from .explorers.saturation import DK_VALUES, saturation_explorer, softmax_stats
from .plotting import heads_mosaic as mosaic

__all__ = [
    "saturation_explorer",
    "head_explorer",
    "heads_explorer",
    "softmax_stats",
    "DK_VALUES",
    "SENTENCES",
    "mosaic",
    "token_embeddings",
    "mask_explorer",
    "masks_explorer",
    "build_mask",
    "MASK_KINDS",
    "position_explorer",
    "positions_explorer",
    "POSITION_KINDS",
]
