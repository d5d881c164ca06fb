"""Chapter 11's explorer: what a trained Vision Transformer's [CLS] token looks at.

Pick a digit, a layer, a head (or the mean over heads) and raw attention or attention rollout, and see the
[CLS] token's weights over the 16 patches, drawn over the digit, with the model's prediction. In the live
widget the reader can also draw a digit of their own on a grid of pixels (the image choice "your drawing").

Dimension legend: B batch, H heads, T tokens ([CLS] + Th*Tw patches), Ih, Iw image height and width,
Th, Tw patch grid.
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from ..vision import VisionTransformer, cls_attention
from .base import Control, Explorer

__all__ = ["vit_explorer", "DRAWN"]

# the image choice that shows the reader's own drawing (live only: the book's scrubber has no grid to draw on)
DRAWN = "drawn"


def _drawing_pad(explorer: Explorer, drawing: torch.Tensor) -> list[Any]:
    """The live widget's drawing grid: one button per pixel of ``drawing`` (Ih, Iw), which is changed in
    place; a click turns the pixel on (black) or off (white) and switches the image choice to :data:`DRAWN`.
    "copy the shown image" starts from the image on show (pixels >= 0.5 on); "clear" blanks the grid."""
    import ipywidgets as W

    Ih, Iw = drawing.shape
    pixels = [W.Button(tooltip=f"row {r}, column {c}", layout=W.Layout(width="22px", height="22px", padding="0",
                                                                        margin="0", border="1px solid #bbb"))
              for r in range(Ih) for c in range(Iw)]

    def paint() -> None:
        for i, button in enumerate(pixels):
            button.style.button_color = "black" if drawing[i // Iw, i % Iw] > 0 else "white"

    def on_pixel(i: int) -> Any:
        def handler(_: Any) -> None:
            drawing[i // Iw, i % Iw] = 0.0 if drawing[i // Iw, i % Iw] > 0 else 1.0
            paint()
            explorer.update(digit=DRAWN)
        return handler

    for i, button in enumerate(pixels):
        button.on_click(on_pixel(i))

    def set_all(image: torch.Tensor) -> None:
        drawing.copy_((image >= 0.5).float())
        paint()
        explorer.update(digit=DRAWN)  # one update for the whole grid

    paint()
    wide = W.Layout(width="max-content")
    copy = W.Button(description="copy the shown image", layout=wide)
    clear = W.Button(description="clear", layout=wide)
    copy.on_click(lambda _: set_all(explorer.data["image"].clone()))
    clear.on_click(lambda _: set_all(torch.zeros(Ih, Iw)))
    grid = W.GridBox(pixels, layout=W.Layout(grid_template_columns=f"repeat({Iw}, 22px)",
                                             grid_gap="1px", width="max-content"))
    note = W.HTML("<b>Draw your own</b>: click a pixel to turn it on or off (the image choice becomes "
                  "<i>your drawing</i>), or start from the image on show.")
    return [note, W.HBox([grid, W.VBox([copy, clear])])]


def vit_explorer(model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor,
                 static_digits: int = 3, drawing: torch.Tensor | None = None) -> Explorer:
    """A trained :class:`attnbook.vision.VisionTransformer` and some images ``(B, Ih, Iw)`` with their labels
    ``(B,)`` -> digit (which image), layer, head (``"mean"`` or 0..H-1) and view (``"raw"`` or
    ``"rollout"``) -> the [CLS] token's attention over the patches, drawn over the digit and as a patch grid.
    The book's scrubber pre-renders the first ``static_digits`` images; live, every image can be picked, and
    the image choice :data:`DRAWN` shows the reader's own drawing: ``drawing`` ``(Ih, Iw)`` (default: the
    first image, pixels >= 0.5 on), edited on a grid of pixels under the live widget."""
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"model must be an attnbook.vision.VisionTransformer, got {type(model).__name__}")
    if not isinstance(images, torch.Tensor) or images.dim() != 3 or len(images) != len(labels) or len(images) < 1:
        raise ValueError("images must be (B, Ih, Iw) with one label per image")
    if drawing is None:
        drawing = (images[0] >= 0.5).float()  # (Ih, Iw)
    elif not isinstance(drawing, torch.Tensor) or drawing.shape != images.shape[1:]:
        got = tuple(drawing.shape) if isinstance(drawing, torch.Tensor) else type(drawing).__name__
        raise ValueError(f"drawing must be one image of the same size as images, {tuple(images.shape[1:])}, got {got}")
    drawing = drawing.detach().float().clone()  # (Ih, Iw), edited in place by the drawing grid
    model = model.eval()
    with torch.no_grad():
        logits, weights = model(images, need_weights=True)  # (B, C), N x (B, H, T, T)
    predictions = logits.argmax(dim=-1)  # (B,)
    num_layers, H = len(weights), weights[0].shape[1]
    grid = model.grid
    p = images.shape[1] // grid[0]

    def compute(digit: int | str, layer: int, head: str | int, view: str) -> dict:
        if digit == DRAWN:
            image = drawing.clone()  # (Ih, Iw)
            with torch.no_grad():
                out, ws = model(image[None], need_weights=True)  # (1, C), N x (1, H, T, T)
            label, prediction = None, int(out.argmax(dim=-1)[0])
        else:
            i = int(digit)
            image, ws = images[i], [w[i : i + 1] for w in weights]  # N x (1, H, T, T)
            label, prediction = int(labels[i]), int(predictions[i])
        att = cls_attention(ws, layer, head, view, grid)  # (Th, Tw)
        return {"digit": digit, "layer": layer, "head": head, "view": view, "image": image,
                "attention": att, "per_pixel": att.repeat_interleave(p, 0).repeat_interleave(p, 1),
                "label": label, "prediction": prediction, "on_patches": float(att.sum())}
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
        what = "your drawing" if d["label"] is None else f"a {d['label']}"
        art["title"].set_text(f"{what}, predicted {d['prediction']}: {which}")

    def caption(d: dict) -> str:
        what = "your drawing" if d["label"] is None else f"digit {d['label']}"
        return (f"{what} (predicted {d['prediction']}); {d['view']} attention of [CLS]; "
                f"share of its weight on the patches: {d['on_patches']:.2f}")

    digits = list(range(len(images)))
    return Explorer(
        "What the ViT's [CLS] token looks at",
        [
            Control("digit", [*digits, DRAWN], 0, label="image", kind="dropdown", static=digits[:static_digits],
                    fmt=lambda i: "your drawing (the grid below)" if i == DRAWN else f"#{i}: a {int(labels[i])}"),
            Control("layer", list(range(num_layers)), num_layers - 1, label="layer"),
            Control("head", ["mean", *range(H)], "mean", label="head", kind="toggle"),
            Control("view", ["raw", "rollout"], "raw", label="view", kind="toggle"),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
        extras=lambda explorer: _drawing_pad(explorer, drawing),
    )
