"""The course's explorers. Each returns an :class:`attnbook.explorer.Explorer`:
display it (or leave it as a cell's last expression) to get the live widget in
Jupyter/Colab and the pre-rendered scrubber in the static book; call
``.update(...)`` and read ``.data`` / ``.figure`` to use it without a browser.

Dimension legend: B batch, H heads, T query length, S key length, D head dim
(d_k), E model dim (d_model).
"""

from __future__ import annotations

import math
import zlib
from functools import lru_cache

import torch
from matplotlib.figure import Figure

from .explorer import Control, Explorer, FastFigure, available_devices
from .mha import MultiHeadAttention

__all__ = [
    "saturation_explorer",
    "head_explorer",
    "softmax_stats",
    "DK_VALUES",
    "SENTENCES",
    "mosaic",
    "token_embeddings",
    "mask_explorer",
    "build_mask",
    "MASK_KINDS",
    "position_explorer",
    "POSITION_KINDS",
]

DK_VALUES = [2**i for i in range(11)]  # 1 .. 1024
DK_TICKS = [1, 4, 16, 64, 256, 1024]
SENTENCES = [
    "the cat sat on the mat because it was tired",
    "a bird in the hand is worth two in the bush",
    "she gave him the book and he read it twice",
]


# --------------------------------------------------------------------- saturation
def softmax_stats(logits: torch.Tensor) -> dict:
    """Entropy, largest weight and softmax-Jacobian norm for logits (N, T), averaged over N.

    The Jacobian of p = softmax(z) is diag(p) - p p^T; its Frobenius norm is how
    much the weights can still move when the logits move: near 0 means
    saturated (vanishing gradients).
    """
    p = torch.softmax(logits.double(), dim=-1)  # (N, T)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (N,)
    jac = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # (N, T, T)
    grad_norm = jac.flatten(1).norm(dim=-1)  # (N,)
    return {
        "entropy": entropy.mean().item(),
        "max_weight": p.max(-1).values.mean().item(),
        "grad_norm": grad_norm.mean().item(),
    }


def _queries_keys(d_k: int, T: int, n: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed * 7919 + d_k)
    q = torch.randn(n, d_k, generator=g)  # (N, D) unit-variance queries
    k = torch.randn(n, T, d_k, generator=g)  # (N, T, D) unit-variance keys
    return q.to(device), k.to(device)


@lru_cache(maxsize=32)
def _saturation_curves(T: int, device: str, n: int = 256, seed: int = 0) -> dict:
    curves = {"d_k": DK_VALUES, "scaled": {}, "unscaled": {}}
    for name in ("scaled", "unscaled"):
        rows = []
        for d_k in DK_VALUES:
            q, k = _queries_keys(d_k, T, n, device, seed)
            logits = (k @ q[:, :, None]).squeeze(-1)  # (N, T)
            if name == "scaled":
                logits = logits / math.sqrt(d_k)
            rows.append(softmax_stats(logits.cpu()))
        curves[name] = {key: [r[key] for r in rows] for key in rows[0]}
    return curves


def saturation_explorer(seed: int = 0) -> Explorer:
    """d_k, sequence length, scaling on/off and device -> the logits' spread, one
    query's weights, and entropy / max weight / gradient norm against d_k."""

    def compute(d_k, T, scaled, device):
        q, k = _queries_keys(d_k, T, 64, device, seed)
        logits = (k @ q[:, :, None]).squeeze(-1)  # (N, T): N queries against T keys each
        if scaled:
            logits = logits / math.sqrt(d_k)
        logits = logits.cpu()
        curves = _saturation_curves(T, device, seed=seed)
        at = curves["d_k"].index(d_k)
        name = "scaled" if scaled else "unscaled"
        stats = {key: curves[name][key][at] for key in ("entropy", "max_weight", "grad_norm")}  # 256 queries
        return {
            "d_k": d_k, "T": T, "scaled": scaled, "device": device,
            "logits": logits, "weights": torch.softmax(logits[0].double(), -1),
            "logit_std": logits.std().item(), **stats, "curves": curves,
        }

    figures = {}  # (T, device) -> (fig, artists): built once, then only their data change
    bins = torch.linspace(-64, 64, 65)  # one fixed logit axis for every d_k, so the spread is comparable

    def _build(d):
        fig = Figure(figsize=(8.4, 5.2), dpi=72)
        fig.subplots_adjust(left=0.06, right=0.98, top=0.94, bottom=0.09, hspace=0.42, wspace=0.18)
        (a1, a2), (a3, a4) = fig.subplots(2, 2)
        width = float(bins[1] - bins[0])
        hist = a1.bar(bins[:-1].tolist(), [0.0] * 64, width=width, align="edge", color="tab:blue")
        a1.set_xlim(-64, 64)
        a1.set_ylim(0, 0.5)
        a1.set_xlabel("logit (values beyond ±64 are piled into the end bins)")
        a1.set_ylabel("share of logits")
        bars = a2.bar(range(d["T"]), [0.0] * d["T"], color="tab:orange")
        a2.set_ylim(0, 1)
        a2.set_xlabel("key")
        c = d["curves"]
        for name, style in (("unscaled", "--"), ("scaled", "-")):
            a3.plot(c["d_k"], c[name]["entropy"], style, marker=".", label=name)
            a4.plot(c["d_k"], c[name]["grad_norm"], style, marker=".", label=f"{name}: ‖Jacobian‖")
            a4.plot(c["d_k"], c[name]["max_weight"], style, alpha=0.5, label=f"{name}: max weight")
        a3.axhline(math.log(d["T"]), color="gray", lw=0.8, ls=":")
        a3.set_title(f"entropy (uniform = log T = {math.log(d['T']):.2f})", fontsize=10)
        a4.set_title("softmax Jacobian norm and max weight", fontsize=10)
        marks = []
        for ax in (a3, a4):
            ax.set_xscale("log", base=2)
            ax.set_xticks(DK_TICKS, labels=[str(t) for t in DK_TICKS])  # plain labels: mathtext is slow
            ax.minorticks_off()
            marks.append(ax.axvline(d["d_k"], color="red", lw=1))
            ax.set_xlabel("d_k")
            ax.legend(fontsize=7)
        t1 = a1.set_title(" ", fontsize=10)
        t2 = a2.set_title(" ", fontsize=10)
        FastFigure(fig, [*hist, *bars, *marks, t1, t2])
        return fig, {"hist": hist, "bars": bars, "marks": marks, "a1": a1, "a2": a2}

    def draw(d):
        key = (d["T"], d["device"])
        if key not in figures:
            figures[key] = _build(d)
        fig, art = figures[key]
        z = d["logits"].flatten().double().clamp(-63.999, 63.999)
        share = torch.histogram(z, bins=bins.double())[0] / z.numel()
        for rect, h in zip(art["hist"], share.tolist()):
            rect.set_height(h)
        art["a1"].set_title(f"logits q·k{' / √d_k' if d['scaled'] else ''}: std {d['logit_std']:.2f}", fontsize=10)
        for rect, w in zip(art["bars"], d["weights"].tolist()):
            rect.set_height(w)
        art["a2"].set_title(f"one query's weights over {d['T']} keys (max {d['weights'].max():.2f})", fontsize=10)
        for mark in art["marks"]:
            mark.set_xdata([d["d_k"], d["d_k"]])
        return fig

    def caption(d):
        return (f"d_k = {d['d_k']}, T = {d['T']}, {'scaled by 1/√d_k' if d['scaled'] else 'unscaled'} "
                f"({d['device']}): entropy {d['entropy']:.2f}, max weight {d['max_weight']:.2f}, "
                f"Jacobian norm {d['grad_norm']:.3f}")

    return Explorer(
        "Softmax saturation",
        [
            Control("d_k", DK_VALUES, 64, label="d_k"),
            Control("T", [4, 8, 16, 32, 64], 16, label="sequence length", static=[16]),
            Control("scaled", [True, False], True, label="scaling", kind="toggle",
                    fmt=lambda s: "on (÷√d_k)" if s else "off"),
            Control("device", available_devices(), "cpu", label="device", kind="dropdown", static=["cpu"]),
        ],
        compute, draw, caption,
    )


# --------------------------------------------------------------------- heads
def token_embeddings(tokens: list[str], d_model: int, seed: int = 0) -> torch.Tensor:
    """A fixed random vector per word (stable across runs), plus a little position signal."""
    rows = []
    for pos, tok in enumerate(tokens):
        g = torch.Generator().manual_seed(zlib.crc32(tok.encode()) + seed)
        rows.append(torch.randn(d_model, generator=g) + 0.5 * torch.sin(torch.arange(d_model) * 0.7 + pos))
    return torch.stack(rows)  # (T, E)


def mosaic(weights: torch.Tensor, ncols: int) -> torch.Tensor:
    """Tile H maps (H, T, S) into one (rows*(T+1)-1, ncols*(S+1)-1) image, NaN between tiles."""
    H, T, S = weights.shape
    nrows = -(-H // ncols)
    out = torch.full((nrows * (T + 1) - 1, ncols * (S + 1) - 1), float("nan"))
    for h in range(H):
        r, c = divmod(h, ncols)
        out[r * (T + 1): r * (T + 1) + T, c * (S + 1): c * (S + 1) + S] = weights[h]
    return out


def _divisors(n: int) -> list[int]:
    return [h for h in range(1, n + 1) if n % h == 0]


def head_explorer(d_model: int = 32, sentences: list[str] | None = None, seed: int = 0, gain: float = 3.0) -> Explorer:
    """Number of heads (over the divisors of d_model), the input sentence and the
    device -> the grid of per-head attention maps.

    The projections W^Q, W^K, W^V, W^O are the *same* matrices for every head
    count; only how their d_model columns are split into heads changes. So the
    parameter count stays put while the maps change.
    """
    sentences = list(sentences or SENTENCES)
    torch.manual_seed(seed)
    base = MultiHeadAttention(d_model, 1)
    with torch.no_grad():
        for lin in (base.q_proj, base.k_proj):
            lin.weight.mul_(gain)  # sharper maps than a fresh init, so heads differ visibly
    state = base.state_dict()

    def compute(num_heads, sentence, device):
        tokens = sentence.split()
        mha = MultiHeadAttention(d_model, num_heads)
        mha.load_state_dict(state)
        mha = mha.to(device).eval()
        x = token_embeddings(tokens, d_model, seed).to(device)[None]  # (1, T, E)
        with torch.no_grad():
            out, w = mha(x)  # w: (1, H, T, T)
        return {
            "num_heads": num_heads, "head_dim": d_model // num_heads, "tokens": tokens, "device": device,
            "weights": w[0].cpu(), "params": sum(p.numel() for p in mha.parameters()),
            "entropy": (-(w * torch.log(w.clamp_min(1e-12))).sum(-1)).mean().item(),
        }

    figures = {}  # (H, T) -> (fig, image): the layout depends only on these

    def draw(d):
        H, T = d["num_heads"], len(d["tokens"])
        ncols = min(H, 8)
        tiles = mosaic(d["weights"], ncols)  # one image for all heads: far faster than H axes
        if (H, T) not in figures:
            fig = Figure(figsize=(min(1.3 * ncols + 1.2, 11), 1.3 * (-(-H // ncols)) + 0.9), dpi=72)
            fig.subplots_adjust(left=0.02, right=0.98, top=0.8, bottom=0.03)
            ax = fig.subplots()
            image = ax.imshow(tiles, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            for h in range(H):
                r, c = divmod(h, ncols)
                ax.text(c * (T + 1), r * (T + 1) - 0.7, f"head {h}", fontsize=7, va="bottom")
            ax.axis("off")
            fig.suptitle(f"{H} head{'s' if H > 1 else ''} of d_k = {d['head_dim']}\n"
                         "(each map: queries down, keys across)", fontsize=9)
            FastFigure(fig, [image])
            figures[H, T] = fig, image
        fig, image = figures[H, T]
        image.set_data(tiles)
        return fig

    def caption(d):
        return (f"{d['num_heads']} heads × d_k = {d['head_dim']} = d_model {d_model}; parameters: {d['params']:,} "
                f"(the same for every head count); mean entropy {d['entropy']:.2f}")

    heads = _divisors(d_model)
    return Explorer(
        "Attention heads",
        [
            Control("num_heads", heads, 4 if 4 in heads else heads[0], label="heads"),
            Control("sentence", sentences, sentences[0], label="sentence", kind="dropdown", static=sentences[:2]),
            Control("device", available_devices(), "cpu", label="device", kind="dropdown", static=["cpu"]),
        ],
        compute, draw, caption,
    )




# --------------------------------------------------------------------- masks
MASK_KINDS = ["causal", "padding", "sliding window", "causal + padding", "causal + window"]


def build_mask(kind: str, T: int, window: int, length: int) -> torch.Tensor:
    """The bool (T, T) mask an explorer kind stands for (True = may attend)."""
    from .masks import causal_mask, combine_masks, padding_mask, sliding_window_mask

    if kind not in MASK_KINDS:
        raise ValueError(f"kind must be one of {MASK_KINDS}, got {kind!r}")
    pad = padding_mask([min(length, T)], max_len=T)[0, 0]  # (1, S) -> broadcasts over queries
    parts = {
        "causal": [causal_mask(T)],
        "padding": [pad],
        "sliding window": [sliding_window_mask(T, window)],
        "causal + padding": [causal_mask(T), pad],
        "causal + window": [sliding_window_mask(T, window, causal=True)],
    }[kind]
    return combine_masks(*parts).expand(T, T)


def mask_explorer(seed: int = 0, d_model: int = 16) -> Explorer:
    """Mask kind (causal, padding lengths, sliding window, combinations), window,
    padding length, sequence length and device -> the mask and the attention it allows."""
    from .core import scaled_dot_product_attention

    def compute(kind, T, window, length, device):
        mask = build_mask(kind, T, window, length)  # (T, S)
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(T, d_model, generator=g)  # (T, E)
        wq, wk = (torch.randn(d_model, d_model, generator=g) / d_model**0.5 for _ in range(2))
        q, k = (x @ wq).to(device), (x @ wk).to(device)  # (T, D) each
        _, w = scaled_dot_product_attention(q, k, k, mask.to(device))  # (T, S)
        w = w.cpu()
        empty = int((~mask.any(-1)).sum())
        return {"kind": kind, "T": T, "window": window, "length": length, "device": device,
                "mask": mask, "weights": w, "allowed": int(mask.sum()), "empty_rows": empty}

    figures = {}  # T -> (fig, mask image, weight image, title)

    def draw(d):
        T = d["T"]
        if T not in figures:
            fig = Figure(figsize=(7.2, 3.4), dpi=72)
            fig.subplots_adjust(left=0.08, right=0.98, top=0.86, bottom=0.15, wspace=0.3)
            a1, a2 = fig.subplots(1, 2)
            im1 = a1.imshow(torch.zeros(T, T).numpy(), cmap="Greys_r", vmin=0, vmax=1)
            a1.set_title("mask (white = may attend)", fontsize=10)
            im2 = a2.imshow(torch.zeros(T, T).numpy(), cmap="viridis", vmin=0, vmax=1)
            a2.set_title("attention weights", fontsize=10)
            for ax in (a1, a2):
                ax.set_xlabel("key j")
                ax.set_ylabel("query i")
            title = fig.suptitle(" ", fontsize=11)
            FastFigure(fig, [im1, im2, title])
            figures[T] = fig, im1, im2, title
        fig, im1, im2, title = figures[T]
        im1.set_data(d["mask"].float().numpy())
        im2.set_data(d["weights"].numpy())
        title.set_text(d["kind"])
        return fig

    def caption(d):
        return (f"{d['kind']}, T = {d['T']}, window = {d['window']}, real length = {min(d['length'], d['T'])}: "
                f"{d['allowed']} of {d['T'] ** 2} (query, key) pairs allowed; "
                f"{d['empty_rows']} query row(s) with no key (their weights are all 0, not NaN)")

    return Explorer(
        "Masks",
        [
            Control("kind", MASK_KINDS, "causal", label="mask", kind="dropdown"),
            Control("T", [4, 6, 8, 12, 16], 8, label="sequence length", static=[8]),
            Control("window", [0, 1, 2, 3, 4], 2, label="window", static=[1, 3]),
            Control("length", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16], 5, label="real length (padding)", static=[5]),
            Control("device", available_devices(), "cpu", label="device", kind="dropdown", static=["cpu"]),
        ],
        compute, draw, caption,
    )


# --------------------------------------------------------------------- positions
POSITION_KINDS = ["sinusoidal", "learned (untrained)", "RoPE", "ALiBi"]


def position_explorer(T: int = 32, seed: int = 0) -> Explorer:
    """Encoding kind, d_model and a position offset -> the encodings of positions
    offset .. offset+T-1 and how strongly each position relates to each other one."""
    from .positional import alibi_bias, apply_rotary, sinusoidal_encoding

    def compute(kind, d_model, offset, device):
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

    figures = {}  # encoding width -> (fig, encoding image, similarity image, titles)

    def draw(d):
        enc, sim = d["encoding"], d["similarity"]
        width = enc.shape[1]
        if width not in figures:
            fig = Figure(figsize=(7.6, 3.4), dpi=72)
            fig.subplots_adjust(left=0.08, right=0.98, top=0.84, bottom=0.15, wspace=0.3)
            a1, a2 = fig.subplots(1, 2)
            im1 = a1.imshow(enc.numpy(), cmap="RdBu_r", aspect="auto")
            a1.set_xlabel("feature (ALiBi: head)")
            a1.set_ylabel("position (offset + row)")
            im2 = a2.imshow(sim.numpy(), cmap="viridis")
            a2.set_xlabel("position j (offset + column)")
            a2.set_ylabel("position i (offset + row)")
            a2.set_title("position-to-position", fontsize=10)
            t1 = a1.set_title(" ", fontsize=10)
            title = fig.suptitle(" ", fontsize=11)
            FastFigure(fig, [im1, im2, t1, title])
            figures[width] = fig, im1, im2, t1, title
        fig, im1, im2, t1, title = figures[width]
        lim = float(enc.abs().max()) or 1.0
        im1.set_data(enc.numpy())
        im1.set_clim(-lim, lim)
        im2.set_data(sim.numpy())
        im2.set_clim(float(sim.min()), float(sim.max()) if sim.max() > sim.min() else float(sim.min()) + 1)
        t1.set_text("bias per head (middle query)" if d["kind"] == "ALiBi" else "encoding")
        title.set_text(f"{d['kind']}, d_model = {d['d_model']}, positions {d['offset']}..{d['offset'] + T - 1}")
        return fig

    def caption(d):
        return d["what"]

    return Explorer(
        "Positional encodings",
        [
            Control("kind", POSITION_KINDS, "sinusoidal", label="encoding", kind="dropdown"),
            Control("d_model", [8, 16, 32, 64, 128], 64, label="d_model", static=[16, 64]),
            Control("offset", [0, 10, 100, 1000], 0, label="position offset", static=[0, 1000]),
            Control("device", available_devices(), "cpu", label="device", kind="dropdown", static=["cpu"]),
        ],
        compute, draw, caption,
    )
