"""Old name of :mod:`attnbook.explorers.trained_heads` (chapter 7's explorer), kept so that existing code runs."""

from .explorers.trained_heads import (
    KINDS,
    TaskAttention,
    run_with_attention,
    trained_head_explorer,
    trained_heads_explorer,
)

__all__ = ["KINDS", "TaskAttention", "run_with_attention", "trained_head_explorer", "trained_heads_explorer"]
