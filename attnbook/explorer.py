"""Old name of :mod:`attnbook.explorers.base` (the explorer machinery), kept so that existing code runs."""

from .explorers.base import (
    WIDGET_VIEW_MIME,
    Control,
    Explorer,
    FastFigure,
    available_devices,
    device_control,
    figure_png,
    in_colab,
)

__all__ = ["Control", "Explorer", "FastFigure", "figure_png", "available_devices", "device_control", "in_colab",
           "WIDGET_VIEW_MIME"]
