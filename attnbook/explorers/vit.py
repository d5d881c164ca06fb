"""Chapter 11's explorer: what a trained Vision Transformer's [CLS] token looks at.

Pick a digit, a layer, a head (or the mean over heads) and raw attention or attention rollout, and see the
[CLS] token's weights over the 16 patches, tinted over the digit and written on the patch grid, with the
model's probability for each class. In the live widget the reader can also draw a digit of their own on a
grid of pixels with a soft pen (:func:`attnbook.vision.paint`), or load one of the stored hand-drawn digits
(:data:`attnbook.vision.HAND_DRAWN`) and edit it (the image choice "your drawing").

Dimension legend: B batch, H heads, T tokens ([CLS] + Th*Tw patches), Ih, Iw image height and width,
Th, Tw patch grid, C classes.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from ..plotting import text_color_on
from ..vision import HAND_DRAWN, VisionTransformer, cls_attention, hand_drawn_digits, paint, paint_line
from .base import Control, Explorer

__all__ = ["vit_explorer", "DRAWN", "PAD_TOOLS"]

# the image choice that shows the reader's own drawing (live only: the book's scrubber has no grid to draw on)
DRAWN = "drawn"
PAD_TOOLS = ("pen", "line", "eraser")  # what a click on the drawing grid does ("line": two clicks, its two ends)
_TINT = (0.84, 0.15, 0.16)  # the attention's colour over the digit (tab:red)


def _grey(value: float) -> str:
    """A pixel's colour on the drawing grid: ink 0 is white, 1 black."""
    level = round(255 * (1.0 - min(max(value, 0.0), 1.0)))
    return f"#{level:02x}{level:02x}{level:02x}"


def _drawing_pad(explorer: Explorer, drawing: torch.Tensor, stored: tuple[torch.Tensor, torch.Tensor],
                 note: str) -> list[Any]:
    """The live widget's drawing grid: one button per pixel of ``drawing`` (Ih, Iw), which is changed in
    place. A click paints with the soft pen or the eraser (:func:`attnbook.vision.paint`) and switches the
    image choice to :data:`DRAWN`. "copy the shown image" starts from the image on show, "clear" blanks the
    grid, and the menu loads one of the ``stored`` drawings ``(images (B, Ih, Iw), labels (B,))``."""
    import ipywidgets as W

    Ih, Iw = drawing.shape
    pixels = [W.Button(tooltip=f"row {r}, column {c}", layout=W.Layout(width="26px", height="26px", padding="0",
                                                                        margin="0", border="1px solid #bbb"))
              for r in range(Ih) for c in range(Iw)]
    # a row, as the explorers' own toggles (ipywidgets 8 puts a description above its buttons otherwise)
    tool = W.ToggleButtons(options=list(PAD_TOOLS), value=PAD_TOOLS[0], description="click to",
                           layout=W.Layout(display="flex", flex_flow="row wrap", align_items="center"),
                           style={"description_width": "initial", "button_width": "auto"},
                           tooltips=["ink the pixel, and its four neighbours half", "click where a stroke "
                                     "starts, then where it ends: the pen along the straight line between",
                                     "clear the pixel, and lighten its four neighbours by half"])
    start: list[tuple[int, int]] = []  # the line tool's first end, between its two clicks
    status = W.HTML("")

    def on_tool(_: Any) -> None:
        start.clear()
        status.value = ""

    tool.observe(on_tool, names="value")

    def paint_grid() -> None:
        for i, button in enumerate(pixels):
            button.style.button_color = _grey(float(drawing[i // Iw, i % Iw]))

    def on_pixel(i: int) -> Any:
        def handler(_: Any) -> None:
            here = (i // Iw, i % Iw)
            if tool.value == "line" and start:
                drawing.copy_(paint_line(drawing, start.pop(), here))
                status.value = ""
            else:
                drawing.copy_(paint(drawing, *here, erase=tool.value == "eraser"))
                if tool.value == "line":
                    start.append(here)
                    status.value = (f'<span style="color:#555">line from row {here[0]}, column {here[1]}: '
                                    'click where it ends</span>')
            paint_grid()
            explorer.update(digit=DRAWN)
        return handler

    for i, button in enumerate(pixels):
        button.on_click(on_pixel(i))

    def set_all(image: torch.Tensor) -> None:
        drawing.copy_(image.clamp(0.0, 1.0))
        paint_grid()
        explorer.update(digit=DRAWN)  # one update for the whole grid

    images, labels = stored
    choose = "load a stored drawing ..."
    menu = W.Dropdown(options=[(choose, -1)] + [(f"a {int(y)} (drawing {i + 1} of {len(labels)})", i)
                                                for i, y in enumerate(labels)],
                      value=-1, layout=W.Layout(width="max-content"))

    def on_menu(change: dict) -> None:
        if change["new"] >= 0:
            set_all(images[change["new"]])
            menu.value = -1  # back to the prompt: the same drawing can be loaded again after editing

    menu.observe(on_menu, names="value")
    paint_grid()
    wide = W.Layout(width="max-content")
    copy = W.Button(description="copy the shown image", layout=wide)
    clear = W.Button(description="clear", layout=wide)
    copy.on_click(lambda _: set_all(explorer.data["image"].clone()))
    clear.on_click(lambda _: set_all(torch.zeros(Ih, Iw)))
    grid = W.GridBox(pixels, layout=W.Layout(grid_template_columns=f"repeat({Iw}, 26px)",
                                             grid_gap="1px", width="max-content", flex="0 0 auto"))
    text = W.HTML(f'<div style="max-width:44em;line-height:1.35"><b>Draw your own</b>: {html.escape(note)}</div>')
    # the buttons go under the grid when the output column is too narrow for both side by side
    return [text, W.HBox([grid, W.VBox([tool, copy, clear, menu, status], layout=W.Layout(margin="0 0 0 1em"))],
                         layout=W.Layout(flex_flow="row wrap", max_width="100%"))]


def vit_explorer(model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor,
                 static_digits: int = 3, drawing: torch.Tensor | None = None) -> Explorer:
    """A trained :class:`attnbook.vision.VisionTransformer` and some images ``(B, Ih, Iw)`` with their labels
    ``(B,)`` -> digit (which image), layer, head (``"mean"`` or 0..H-1; rollout mixes the heads, so the head
    does not apply to it) and view (``"raw"`` or ``"rollout"``) -> the [CLS] token's attention over the
    patches, tinted over the digit and written on the patch grid, and the model's probability for each class.
    The book's scrubber pre-renders the first ``static_digits`` images; live, every image can be picked, and
    the image choice :data:`DRAWN` shows the reader's own drawing: ``drawing`` ``(Ih, Iw)`` (default: a copy
    of the first image), edited on a grid of pixels under the live widget with a soft pen. Its note says how
    many of the stored hand-drawn digits (:func:`attnbook.vision.hand_drawn_digits`) the model classifies
    right (8x8 images only); ``data["drawn_score"]`` holds that ``(right, total)`` (``None`` for other sizes)."""
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"model must be an attnbook.vision.VisionTransformer, got {type(model).__name__}")
    if not isinstance(images, torch.Tensor) or images.dim() != 3 or len(images) != len(labels) or len(images) < 1:
        raise ValueError("images must be (B, Ih, Iw) with one label per image")
    if drawing is None:
        drawing = images[0]  # (Ih, Iw)
    elif not isinstance(drawing, torch.Tensor) or drawing.shape != images.shape[1:]:
        got = tuple(drawing.shape) if isinstance(drawing, torch.Tensor) else type(drawing).__name__
        raise ValueError(f"drawing must be one image of the same size as images, {tuple(images.shape[1:])}, got {got}")
    drawing = drawing.detach().float().clamp(0.0, 1.0).clone()  # (Ih, Iw), edited in place by the drawing grid
    model = model.eval()
    with torch.no_grad():
        logits, weights = model(images, need_weights=True)  # (B, C), N x (B, H, T, T)
    probabilities = logits.softmax(dim=-1)  # (B, C)
    num_layers, H = len(weights), weights[0].shape[1]
    C = logits.shape[-1]
    grid = model.grid
    p = images.shape[1] // grid[0]

    stored = hand_drawn_digits()  # (B, 8, 8), (B,)
    if tuple(stored[0].shape[1:]) == tuple(images.shape[1:]):
        with torch.no_grad():
            right = int((model(stored[0]).argmax(dim=-1) == stored[1]).sum())
        score: tuple[int, int] | None = (right, len(stored[1]))
    else:
        score, stored = None, (stored[0][:0], stored[1][:0])  # drawn for 8x8 images: none to offer
    note = ("click a pixel to ink it with a soft pen (it also inks its four neighbours half, as blurred as the "
            "strokes of the 8x8 digits the model learned from; the eraser does the opposite). Dragging across "
            "the grid draws nothing: the pixels are ipywidgets buttons, which report clicks, not the mouse "
            "passing over them. For a stroke, pick \"line\" and click its two ends. Or start from the image on "
            "show or a stored drawing. The image choice becomes your drawing.")
    if score is not None:
        note += (f" This model classifies {score[0]} of the {score[1]} stored drawings right (attnbook.vision."
                 f"HAND_DRAWN, {len(HAND_DRAWN) // 10} of each digit, drawn by hand on this grid).")

    def compute(digit: int | str, layer: int, head: str | int, view: str) -> dict:
        if digit == DRAWN:
            image = drawing.clone()  # (Ih, Iw)
            with torch.no_grad():
                out, ws = model(image[None], need_weights=True)  # (1, C), N x (1, H, T, T)
            label, probs = None, out.softmax(dim=-1)[0]  # (C,)
        else:
            i = int(digit)
            image, ws = images[i], [w[i : i + 1] for w in weights]  # N x (1, H, T, T)
            label, probs = int(labels[i]), probabilities[i]
        att = cls_attention(ws, layer, head, view, grid)  # (Th, Tw)
        empty = digit == DRAWN and not bool((image > 0).any())  # a blank grid: nothing to classify
        return {"digit": digit, "empty": empty, "layer": layer, "head": head, "view": view, "image": image,
                "attention": att, "per_pixel": att.repeat_interleave(p, 0).repeat_interleave(p, 1),
                "label": label, "probabilities": probs, "prediction": int(probs.argmax()),
                "on_patches": float(att.sum()), "drawn_score": score}

    def layout(d: dict) -> tuple[int, ...]:
        return tuple(d["image"].shape)

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        Ih, Iw = d["image"].shape
        Th, Tw = d["attention"].shape
        fig = Figure(figsize=(8.4, 3.3), dpi=72)
        fig.subplots_adjust(left=0.02, right=0.98, top=0.8, bottom=0.13, wspace=0.25)
        ax_img, ax_att, ax_p = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.0, 1.0, 1.25]})
        digit = ax_img.imshow(np.ones((Ih, Iw, 3)), interpolation="nearest")  # the ink over the tint, as RGB
        # the patches' borders, over the digit (named as changing artists: drawn after the image, as a full
        # render draws them)
        borders = [ax_img.axhline(r * p - 0.5, color="0.6", lw=0.8) for r in range(1, Th)]
        borders += [ax_img.axvline(c * p - 0.5, color="0.6", lw=0.8) for c in range(1, Tw)]
        grid_img = ax_att.imshow(d["attention"].numpy(), cmap="magma", vmin=0, vmax=1, interpolation="nearest")
        values = [ax_att.text(c, r, "", ha="center", va="center", fontsize=10) for r in range(Th) for c in range(Tw)]
        for ax in (ax_img, ax_att):
            ax.set_xticks([])
            ax.set_yticks([])
        ax_img.set_title("the digit over [CLS]'s attention", fontsize=10)
        ax_att.set_title("[CLS] → each patch", fontsize=10)
        bars = ax_p.bar(range(C), [0.0] * C, color="0.7")
        ax_p.set_xticks(range(C), labels=[str(c) for c in range(C)], fontsize=10)
        ax_p.set_ylim(0, 1)
        ax_p.set_yticks([0, 0.5, 1], labels=["0", "0.5", "1"], fontsize=10)
        ax_p.set_xlabel("class", fontsize=10)
        p_title = ax_p.set_title(" ", fontsize=10)
        title = fig.suptitle(" ", fontsize=11)
        return fig, {"digit": digit, "borders": borders, "grid": grid_img, "values": values,
                     "bars": list(bars), "p_title": p_title, "title": title}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        att = d["attention"]
        # colours from 0 to the largest weight, but at least twice the uniform share: a flat map (an untrained
        # model, a blank drawing) shows pale, not as if every patch held the most
        top = max(float(att.max()), 2.0 / att.numel())
        # the paper tinted red as strongly as [CLS]'s weight on the patch, then the ink darkens it: the strokes
        # stay as readable as on white paper wherever the attention goes
        alpha = 0.85 * d["per_pixel"].numpy()[..., None] / top  # (Ih, Iw, 1)
        paper = 1.0 - alpha * (1.0 - np.array(_TINT))  # (Ih, Iw, 3)
        ink = d["image"].numpy()[..., None].clip(0.0, 1.0)  # (Ih, Iw, 1)
        art["digit"].set_data(paper * (1.0 - 0.85 * ink))
        art["grid"].set_data(att.numpy())
        art["grid"].set_clim(0, top)
        cmap, Tw = art["grid"].get_cmap(), att.shape[1]
        for k, text in enumerate(art["values"]):
            w = float(att[k // Tw, k % Tw])
            text.set_text(f"{w:.2f}".lstrip("0") if w < 1 else "1")
            text.set_color(text_color_on(cmap(w / top)))
        for c, bar in enumerate(art["bars"]):
            bar.set_height(float(d["probabilities"][c]))
            bar.set_color("tab:blue" if c == d["prediction"] and not d["empty"] else "0.7")
        truth = "your drawing" if d["label"] is None else f"true class {d['label']}"
        art["p_title"].set_text(f"probability of each class ({truth})")
        which = "rollout through layers 0.." + str(d["layer"]) if d["view"] == "rollout" else (
            f"layer {d['layer']}, " + ("mean of the heads" if d["head"] == "mean" else f"head {d['head']}"))
        what = "your drawing" if d["label"] is None else f"a {d['label']}"
        if d["empty"]:
            art["title"].set_text(f"your drawing is empty: nothing to predict: {which}")
        else:
            art["title"].set_text(f"{what}, predicted {d['prediction']} "
                                  f"({float(d['probabilities'][d['prediction']]):.0%}): {which}")

    def caption(d: dict) -> str:
        if d["empty"]:
            return (f"your drawing is empty: no prediction (the bars are what a blank image gives, "
                    f"{float(d['probabilities'].max()):.2f} for class {d['prediction']}, a guess from no ink at "
                    "all); draw on the grid below")
        what = "your drawing" if d["label"] is None else f"digit {d['label']}"
        return (f"{what} (predicted {d['prediction']}, probability {float(d['probabilities'].max()):.2f}); "
                f"{d['view']} attention of [CLS]; share of its weight on the patches: {d['on_patches']:.2f}")

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
        extras=lambda explorer: _drawing_pad(explorer, drawing, stored, note),
        limits=lambda v: {"head": None} if v["view"] == "rollout" else {},  # rollout mixes the heads
    )
