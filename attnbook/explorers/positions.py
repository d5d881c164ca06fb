"""Chapter 5's explorer: how each positional encoding relates positions.

Pick an encoding (sinusoidal, learned, RoPE, ALiBi), d_model, a position
offset and the device, and see the encodings of positions offset ..
offset+T-1 next to how strongly each position relates to each other one.

Dimension legend: T positions shown, E model dim (d_model), H heads (ALiBi).
"""

from __future__ import annotations

from typing import Any

import torch
from matplotlib.figure import Figure

from ..plotting import index_ticks
from ..positional import alibi_bias, apply_rotary, sinusoidal_encoding
from .base import Control, Explorer, device_control

__all__ = ["positions_explorer", "POSITION_KINDS"]

POSITION_KINDS = ["sinusoidal", "learned (untrained)", "RoPE", "ALiBi"]


def positions_explorer(T: int = 32, seed: int = 0) -> Explorer:
    """Encoding kind, d_model and a position offset -> the encodings of positions
    offset .. offset+T-1 and how strongly each position relates to each other one."""

    def compute(kind: str, d_model: int, offset: int, device: str) -> dict:
        pos = torch.arange(offset, offset + T, device=device)  # (T,)
        if kind == "sinusoidal":
            enc = sinusoidal_encoding(offset + T, d_model, device=device)[offset:]  # (T, E)
            sim = enc @ enc.T / enc.norm(dim=-1).pow(2).mean()  # (T, T)
            what = "PE(i) · PE(j), normalised"
        elif kind == "learned (untrained)":
            g = torch.Generator().manual_seed(seed)
            table = torch.randn(offset + T, d_model, generator=g).to(device) * 0.02  # (max_len, E)
            enc = table[offset:]
            sim = enc @ enc.T / enc.norm(dim=-1).pow(2).mean()
            what = "embedding(i) · embedding(j), normalised (no structure until trained)"
        elif kind == "RoPE":
            g = torch.Generator().manual_seed(seed)
            v = torch.randn(d_model, generator=g).to(device)  # one content vector at every position
            enc = apply_rotary(v.expand(T, d_model), pos)  # (T, E): rotated copies
            sim = enc @ enc.T / v.pow(2).sum()  # depends on i - j only
            what = "rotated(q, i) · rotated(k, j) for the same vector q = k, normalised"
        elif kind == "ALiBi":
            bias = alibi_bias(8, T, causal=False, device=device)  # (H, T, S)
            enc = bias[:, T // 2, :].T.expand(T, 8)  # (T, H): each head's bias for the middle query
            sim = bias[0]  # head 0's bias, -slope * |i - j|
            what = "ALiBi bias of head 0 (no encoding is added; scores get -slope·|i - j|)"
        else:
            raise ValueError(f"kind must be one of {POSITION_KINDS}, got {kind!r}")
        return {"kind": kind, "d_model": d_model, "offset": offset, "device": device,
                "encoding": enc.float().cpu(), "similarity": sim.float().cpu(), "what": what}

    def layout(d: dict) -> int:
        return d["encoding"].shape[1]  # the encoding's width (ALiBi: heads)

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        fig = Figure(figsize=(7.6, 3.4), dpi=72)
        fig.subplots_adjust(left=0.08, right=0.98, top=0.84, bottom=0.15, wspace=0.3)
        a1, a2 = fig.subplots(1, 2)
        im1 = a1.imshow(d["encoding"].numpy(), cmap="RdBu_r", aspect="auto")
        a1.set_xlabel("feature (ALiBi: head)")
        a1.set_ylabel("position (offset + row)")
        im2 = a2.imshow(d["similarity"].numpy(), cmap="viridis")
        a2.set_xlabel("position j (offset + column)")
        a2.set_ylabel("position i (offset + row)")
        a2.set_title("position-to-position", fontsize=10)
        index_ticks(a1)  # features, heads and positions are whole numbers
        index_ticks(a2)
        t1 = a1.set_title(" ", fontsize=10)
        title = fig.suptitle(" ", fontsize=11)
        return fig, {"encoding": im1, "similarity": im2, "t1": t1, "title": title}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        enc, sim = d["encoding"], d["similarity"]
        lim = float(enc.abs().max()) or 1.0
        art["encoding"].set_data(enc.numpy())
        art["encoding"].set_clim(-lim, lim)
        art["similarity"].set_data(sim.numpy())
        art["similarity"].set_clim(float(sim.min()), float(sim.max()) if sim.max() > sim.min() else float(sim.min()) + 1)
        art["t1"].set_text("bias per head (middle query)" if d["kind"] == "ALiBi" else "encoding")
        art["title"].set_text("ALiBi, 8 heads: a bias on the scores that depends on i - j only" if d["kind"] == "ALiBi"
                              else f"{d['kind']}, d_model = {d['d_model']}, positions {d['offset']}..{d['offset'] + T - 1}")

    def caption(d: dict) -> str:
        return str(d["what"])

    return Explorer(
        "Positional encodings",
        [
            Control("kind", POSITION_KINDS, "sinusoidal", label="encoding", kind="dropdown"),
            Control("d_model", [8, 16, 32, 64, 128], 64, label="d_model", static=[16, 64]),
            Control("offset", [0, 10, 100, 1000], 0, label="position offset", static=[0, 1000]),
            device_control(),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
        # ALiBi adds nothing to the tokens: its bias depends on i - j only, not on d_model or the offset
        limits=lambda v: {"d_model": None, "offset": None} if v["kind"] == "ALiBi" else {},
    )
