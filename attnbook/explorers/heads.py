"""Chapter 3's explorer: the same projections split into 1, 2, 4, ... heads.

Pick the number of heads (a divisor of d_model), a sentence and the device,
and see every head's attention map. W^Q, W^K, W^V and W^O are the *same*
matrices for every head count; only how their d_model columns are split
into heads changes, so the parameter count stays put while the maps change.

Dimension legend: H heads, T tokens of the sentence (queries and keys),
D head dim (d_k), E model dim (d_model).
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
from matplotlib.figure import Figure

from ..mha import MultiHeadAttention
from ..plotting import heads_mosaic
from .base import Control, Explorer, device_control

__all__ = ["heads_explorer", "SENTENCES"]

SENTENCES = [
    "the cat sat on the mat because it was tired",
    "a bird in the hand is worth two in the bush",
    "she gave him the book and he read it twice",
]


def _token_embeddings(tokens: list[str], d_model: int, seed: int = 0) -> torch.Tensor:
    """A fixed random vector per word (stable across runs), plus a little position signal: ``(T, E)``."""
    rows = []
    for pos, tok in enumerate(tokens):
        g = torch.Generator().manual_seed(zlib.crc32(tok.encode()) + seed)
        rows.append(torch.randn(d_model, generator=g) + 0.5 * torch.sin(torch.arange(d_model) * 0.7 + pos))
    return torch.stack(rows)  # (T, E)


def _divisors(n: int) -> list[int]:
    return [h for h in range(1, n + 1) if n % h == 0]


def heads_explorer(d_model: int = 32, sentences: list[str] | None = None, seed: int = 0,
                   gain: float = 3.0) -> Explorer:
    """Number of heads (over the divisors of d_model), the input sentence and the
    device -> the grid of per-head attention maps.

    The projections W^Q, W^K, W^V, W^O are the *same* matrices for every head
    count; only how their d_model columns are split into heads changes. So the
    parameter count stays put while the maps change. The weights are drawn from
    their own seeded generator state (``torch.random.fork_rng``): the reader's
    global random numbers are left as they were.
    """
    sentences = list(sentences or SENTENCES)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        base = MultiHeadAttention(d_model, 1)
    with torch.no_grad():
        for lin in (base.q_proj, base.k_proj):
            lin.weight.mul_(gain)  # sharper maps than a fresh init, so heads differ visibly
    state = base.state_dict()

    def compute(num_heads: int, sentence: str, device: str) -> dict:
        tokens = sentence.split()
        with torch.random.fork_rng(devices=[]):  # the fresh init is overwritten: keep the global RNG as it was
            mha = MultiHeadAttention(d_model, num_heads)
        mha.load_state_dict(state)
        mha = mha.to(device).eval()
        x = _token_embeddings(tokens, d_model, seed).to(device)[None]  # (1, T, E)
        with torch.no_grad():
            out, w = mha(x)  # w: (1, H, T, T)
        assert w is not None
        return {
            "num_heads": num_heads, "head_dim": d_model // num_heads, "tokens": tokens, "device": device,
            "weights": w[0].cpu(), "params": sum(p.numel() for p in mha.parameters()),
            "entropy": (-(w * torch.log(w.clamp_min(1e-12))).sum(-1)).mean().item(),
        }

    def mosaic(weights: torch.Tensor) -> torch.Tensor:
        """The maps ``(H, T, T)`` tiled, four a row, with a blank row above each (room for its head's name)."""
        H, T, S = weights.shape
        blank = torch.full((H, 1, S), float("nan"))
        return heads_mosaic(torch.cat([blank, weights], dim=1), ncols(H))  # (rows, cols)

    def ncols(H: int) -> int:
        # four tiles a row: with a word on every row and column, the figure fits the page; 32 heads take eight
        # a row of smaller tiles, a word on every other row (eight rows of tiles would make a figure too big
        # to redraw in a tenth of a second)
        return min(H, 4) if H <= 16 else 8

    def layout(d: dict) -> tuple[int, tuple[str, ...]]:
        return d["num_heads"], tuple(d["tokens"])  # the words are drawn once per figure

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        H, tokens = layout(d)
        T = len(tokens)
        n = ncols(H)
        nrows = -(-H // n)
        rows, cols = nrows * (T + 2) - 1, n * (T + 1) - 1  # the mosaic's size in cells (a blank row on each tile)
        # inches per attention cell: a 10 pt word per row and per column needs 0.17 inches; a long sentence
        # gets smaller cells (the page is about 9.6 inches wide) and a word on every k-th row only
        longest = max(len(t) for t in tokens)
        side = 0.15 + 0.085 * longest  # inches for the query words left of the tiles, and the key words below
        cell = min(0.17, (9.6 - side - 0.15) / cols)
        every = max(1, round(0.165 / cell + 0.49))
        top = 0.6  # inches above the tiles: the title
        needed = cols * cell + side + 0.15
        width = max(needed, 3.6)  # at least as wide as the title
        height = rows * cell + side + top
        fig = Figure(figsize=(width, height), dpi=72)
        left = side + (width - needed) / 2  # the words and tiles centred under the title
        ax = fig.add_axes((left / width, side / height, cols * cell / width, rows * cell / height))
        image = ax.imshow(mosaic(d["weights"]).numpy(), cmap="viridis", vmin=0, vmax=1,
                          interpolation="nearest", aspect="auto")
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
        for h in range(H):
            r, c = divmod(h, n)
            ax.text(c * (T + 1) - 0.5, r * (T + 2) + 0.3, f"head {h}", fontsize=10, va="bottom")
        for r in range(nrows):  # the queries, left of each row of tiles
            for i in range(0, T, every):
                ax.text(-0.8, r * (T + 2) + 1 + i, tokens[i], fontsize=10, ha="right", va="center")
        for c in range(n):  # the keys, under each column of tiles
            for j in range(0, T, every):
                ax.text(c * (T + 1) + j, rows - 0.2, tokens[j], fontsize=10, ha="center", va="top", rotation=90)
        ax.axis("off")
        fig.text(0.5, 1 - 0.06 / height, f"{H} head{'s' if H > 1 else ''} of d_k = {d['head_dim']}\n"
                 "(each map: queries down, keys across)", fontsize=11, ha="center", va="top")
        return fig, {"image": image}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        art["image"].set_data(mosaic(d["weights"]).numpy())  # one image for all heads

    def caption(d: dict) -> str:
        H = d["num_heads"]
        return (f"{H} head{'s' if H > 1 else ''} × d_k = {d['head_dim']} = d_model {d_model}; parameters: "
                f"{d['params']:,} (the same for every head count); mean entropy {d['entropy']:.2f}")

    heads = _divisors(d_model)
    return Explorer(
        "Attention heads",
        [
            Control("num_heads", heads, 4 if 4 in heads else heads[0], label="heads"),
            Control("sentence", sentences, sentences[0], label="sentence", kind="dropdown", static=sentences[:2]),
            device_control(),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw,
    )
