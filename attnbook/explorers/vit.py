"""Chapter 11's explorer: what a trained Vision Transformer's [CLS] token looks at.

Pick a digit, a layer, a head (or the mean over heads) and raw attention or attention rollout, and see the
[CLS] token's weights over the 16 patches, drawn over the digit, with the model's prediction.

Dimension legend: B batch, H heads, T tokens ([CLS] + Th*Tw patches), Ih, Iw image height and width,
Th, Tw patch grid.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from ..vision import VisionTransformer, attention_rollout, patch_grid
from .base import Control, Explorer

__all__ = ["vit_explorer", "cls_attention"]


def cls_attention(weights: list[torch.Tensor], layer: int, head: str | int, view: str,
                  grid: tuple[int, int]) -> torch.Tensor:
    """The [CLS] row of one layer's attention over the patches, ``(Th, Tw)``, for image 0 of the batch:
    ``view="raw"`` takes layer ``layer``'s head ``head`` (an int, or ``"mean"`` over heads);
    ``view="rollout"`` takes :func:`attnbook.vision.attention_rollout` through layers 0..``layer``
    (rollout mixes the heads, so ``head`` is ignored). The weight [CLS] gives itself is left out, so the
    patches' weights sum to at most 1."""
    if view == "rollout":
        row = attention_rollout(weights[: layer + 1])[0, 0, 1:]  # (Th*Tw,)
    elif view == "raw":
        w = weights[layer][0]  # (H, T, T)
        row = (w.mean(dim=0) if head == "mean" else w[int(head)])[0, 1:]  # (Th*Tw,)
    else:
        raise ValueError(f"view must be 'raw' or 'rollout', got {view!r}")
    return patch_grid(row[None], grid)[0]  # (Th, Tw)


def vit_explorer(model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor,
                 static_digits: int = 3) -> Explorer:
    """A trained :class:`attnbook.vision.VisionTransformer` and some images ``(B, Ih, Iw)`` with their labels
    ``(B,)`` -> digit (which image), layer, head (``"mean"`` or 0..H-1) and view (``"raw"`` or
    ``"rollout"``) -> the [CLS] token's attention over the patches, drawn over the digit and as a patch grid.
    The book's scrubber pre-renders the first ``static_digits`` images; live, every image can be picked."""
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"model must be an attnbook.vision.VisionTransformer, got {type(model).__name__}")
    if not isinstance(images, torch.Tensor) or images.dim() != 3 or len(images) != len(labels) or len(images) < 1:
        raise ValueError("images must be (B, Ih, Iw) with one label per image")
    model = model.eval()
    with torch.no_grad():
        logits, weights = model(images, need_weights=True)  # (B, C), N x (B, H, T, T)
    predictions = logits.argmax(dim=-1)  # (B,)
    num_layers, H = len(weights), weights[0].shape[1]
    grid = model.grid
    p = images.shape[1] // grid[0]

    def compute(digit: int, layer: int, head: str | int, view: str) -> dict:
        ws = [w[digit : digit + 1] for w in weights]  # N x (1, H, T, T)
        att = cls_attention(ws, layer, head, view, grid)  # (Th, Tw)
        return {"digit": digit, "layer": layer, "head": head, "view": view, "image": images[digit],
                "attention": att, "per_pixel": att.repeat_interleave(p, 0).repeat_interleave(p, 1),
                "label": int(labels[digit]), "prediction": int(predictions[digit]),
                "on_patches": float(att.sum())}

    def layout(d: dict) -> tuple[int, ...]:
        return tuple(d["image"].shape)

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        fig = Figure(figsize=(5.2, 2.6), dpi=72)
        fig.subplots_adjust(left=0.02, right=0.98, top=0.82, bottom=0.03, wspace=0.1)
        ax_img, ax_att = fig.subplots(1, 2)
        digit = ax_img.imshow(d["image"].numpy(), cmap="gray_r", vmin=0, vmax=1, interpolation="nearest")
        overlay = ax_img.imshow(d["per_pixel"].numpy(), cmap="magma", alpha=0.55, vmin=0, vmax=float(d["attention"].max()),
                                interpolation="nearest")
        grid_img = ax_att.imshow(d["attention"].numpy(), cmap="magma", vmin=0, vmax=float(d["attention"].max()),
                                 interpolation="nearest")
        for ax in (ax_img, ax_att):
            ax.set_xticks([])
            ax.set_yticks([])
        ax_img.set_title("digit, attention over it", fontsize=8)
        ax_att.set_title("[CLS] -> each patch (0 to the largest)", fontsize=8)
        title = fig.suptitle("", fontsize=9)
        return fig, {"digit": digit, "overlay": overlay, "grid": grid_img, "title": title}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        top = max(float(d["attention"].max()), 1e-6)
        art["digit"].set_data(d["image"].numpy())
        art["overlay"].set_data(d["per_pixel"].numpy())
        art["overlay"].set_clim(0, top)
        art["grid"].set_data(d["attention"].numpy())
        art["grid"].set_clim(0, top)
        which = "rollout through layers 0.." + str(d["layer"]) if d["view"] == "rollout" else (
            f"layer {d['layer']}, " + ("mean of the heads" if d["head"] == "mean" else f"head {d['head']}"))
        art["title"].set_text(f"a {d['label']}, predicted {d['prediction']}: {which}")

    def caption(d: dict) -> str:
        return (f"digit {d['label']} (predicted {d['prediction']}); {d['view']} attention of [CLS]; "
                f"share of its weight on the patches: {d['on_patches']:.2f}")

    digits = list(range(len(images)))
    return Explorer(
        "What the ViT's [CLS] token looks at",
        [
            Control("digit", digits, 0, label="image", kind="dropdown", static=digits[:static_digits],
                    fmt=lambda i: f"#{i}: a {int(labels[i])}"),
            Control("layer", list(range(num_layers)), num_layers - 1, label="layer"),
            Control("head", ["mean", *range(H)], "mean", label="head", kind="toggle"),
            Control("view", ["raw", "rollout"], "raw", label="view", kind="toggle"),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
    )
