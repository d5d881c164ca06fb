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

from .explorer import Control, Explorer, available_devices
from .mha import MultiHeadAttention
from .plotting import heads_grid

__all__ = [
    "saturation_explorer",
    "head_explorer",
    "softmax_stats",
    "DK_VALUES",
    "SENTENCES",
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
def _saturation_curves(T: int, device: str, n: int = 256) -> dict:
    curves = {"d_k": DK_VALUES, "scaled": {}, "unscaled": {}}
    for name in ("scaled", "unscaled"):
        rows = []
        for d_k in DK_VALUES:
            q, k = _queries_keys(d_k, T, n, device)
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
        q, k = _queries_keys(d_k, T, 256, device, seed)
        logits = (k @ q[:, :, None]).squeeze(-1)  # (N, T): N queries against T keys each
        if scaled:
            logits = logits / math.sqrt(d_k)
        logits = logits.cpu()
        stats = softmax_stats(logits)
        return {
            "d_k": d_k, "T": T, "scaled": scaled, "device": device,
            "logits": logits, "weights": torch.softmax(logits[0].double(), -1),
            "logit_std": logits.std().item(), **stats,
            "curves": _saturation_curves(T, device),
        }

    def draw(d):
        fig = Figure(figsize=(8.4, 5.2), dpi=72)
        fig.subplots_adjust(left=0.06, right=0.98, top=0.94, bottom=0.09, hspace=0.42, wspace=0.18)
        (a1, a2), (a3, a4) = fig.subplots(2, 2)
        a1.hist(d["logits"].flatten().numpy(), bins=40, color="tab:blue")
        a1.set_title(f"logits q·k{' / √d_k' if d['scaled'] else ''}: std {d['logit_std']:.2f}", fontsize=10)
        a1.set_xlabel("logit")
        a2.bar(range(d["T"]), d["weights"].numpy(), color="tab:orange")
        a2.set_ylim(0, 1)
        a2.set_title(f"one query's weights over {d['T']} keys (max {d['weights'].max():.2f})", fontsize=10)
        a2.set_xlabel("key")
        c = d["curves"]
        for name, style in (("unscaled", "--"), ("scaled", "-")):
            a3.plot(c["d_k"], c[name]["entropy"], style, marker=".", label=name)
            a4.plot(c["d_k"], c[name]["grad_norm"], style, marker=".", label=f"{name}: ‖Jacobian‖")
            a4.plot(c["d_k"], c[name]["max_weight"], style, alpha=0.5, label=f"{name}: max weight")
        a3.axhline(math.log(d["T"]), color="gray", lw=0.8, ls=":")
        a3.set_title(f"entropy (uniform = log T = {math.log(d['T']):.2f})", fontsize=10)
        a4.set_title("softmax Jacobian norm and max weight", fontsize=10)
        for ax in (a3, a4):
            ax.set_xscale("log", base=2)
            ax.set_xticks(DK_TICKS, labels=[str(t) for t in DK_TICKS])  # plain labels: mathtext is slow
            ax.minorticks_off()
            ax.axvline(d["d_k"], color="red", lw=1)
            ax.set_xlabel("d_k")
            ax.legend(fontsize=7)
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
def _token_embeddings(tokens: list[str], d_model: int, seed: int = 0) -> torch.Tensor:
    """A fixed random vector per word (stable across runs), plus a little position signal."""
    rows = []
    for pos, tok in enumerate(tokens):
        g = torch.Generator().manual_seed(zlib.crc32(tok.encode()) + seed)
        rows.append(torch.randn(d_model, generator=g) + 0.5 * torch.sin(torch.arange(d_model) * 0.7 + pos))
    return torch.stack(rows)  # (T, E)


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
        x = _token_embeddings(tokens, d_model, seed).to(device)[None]  # (1, T, E)
        with torch.no_grad():
            out, w = mha(x)  # w: (1, H, T, T)
        return {
            "num_heads": num_heads, "head_dim": d_model // num_heads, "tokens": tokens, "device": device,
            "weights": w[0].cpu(), "params": sum(p.numel() for p in mha.parameters()),
            "entropy": (-(w * torch.log(w.clamp_min(1e-12))).sum(-1)).mean().item(),
        }

    def draw(d):
        H = d["num_heads"]
        ncols = min(H, 8)
        nrows = -(-H // ncols)
        fig = Figure(figsize=(min(1.6 * ncols + 0.6, 12), 1.6 * nrows + 0.6), dpi=72, layout="constrained")
        heads_grid(d["weights"], fig, tokens=d["tokens"] if H <= 4 else None, ncols=ncols)
        fig.suptitle(f"{H} head{'s' if H > 1 else ''} of d_k = {d['head_dim']}", fontsize=10)
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


