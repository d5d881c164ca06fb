"""Chapter 8's sequence-length explorer and the measuring behind it: which
(query, key) pairs each efficient attention variant of :mod:`attnbook.efficient`
scores, how long it takes and how much memory it holds, against exact
attention, as the sequence grows.

Dimension legend:
    B  batch size (1 by default)
    H  number of heads (2)
    T  sequence length; self-attention, so the key length S equals T
    D  head dimension (32)
    W  a variant's locality size, ``window``: the sliding window's half-width,
       BigBird's block size, Reformer's chunk size, FlashAttention's tile size
    R  side of a downsampled picture of the (T, T) pairs (``resolution``)

The variants (:data:`VARIANTS`), each on q, k, v of shape ``(B, H, T, D)``:

* ``"exact"``: :func:`attnbook.scaled_dot_product_attention`, which builds the
  (T, T) scores and weights;
* ``"sliding window"``, ``"block sparse"`` (BigBird: one window block on each
  side, one global block, one random block), ``"flash"``: exact under their
  pattern (flash: no pattern, all pairs, a tile of ``W`` keys at a time);
* ``"linear"`` (elu + 1 features) and ``"performer"`` (FAVOR+, 64 random
  features): no pair is ever scored, keys are summed into a small state;
* ``"LSH"`` (Reformer, shared queries and keys, one hash round, ``T / W``
  buckets, chunks of ``W``): the pairs depend on the data.

``"pytorch"`` (:func:`torch.nn.functional.scaled_dot_product_attention`,
PyTorch's fused kernel; on a CPU a tiled C++ kernel) is the second reference.

Memory is *tracked*, not sampled: :class:`TensorMemoryTracker` sees every
tensor PyTorch's operators create and learns when its storage is freed, so
the peak is the same number of bytes on every run. It cannot see scratch
buffers that a C++ kernel allocates for itself (PyTorch's fused CPU attention
keeps per-thread tiles that way).
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .core import scaled_dot_product_attention
from .efficient import (
    bigbird_block_pattern,
    bigbird_pattern,
    block_sparse_attention,
    flash_attention,
    linear_attention,
    lsh_attention,
    lsh_buckets,
    performer_attention,
    sliding_window_attention,
)
from .explorer import Control, Explorer, FastFigure
from .masks import sliding_window_mask

__all__ = [
    "VARIANTS",
    "REFERENCES",
    "EXACT_VARIANTS",
    "WINDOW_MEANING",
    "T_VALUES",
    "WINDOWS",
    "NUM_FEATURES",
    "make_inputs",
    "lsh_n_buckets",
    "attention_call",
    "attended_pairs",
    "pair_picture",
    "pair_share",
    "TensorMemoryTracker",
    "tracked_memory",
    "time_calls",
    "cost_key",
    "measure_costs",
    "crossover",
    "sequence_explorer",
]

VARIANTS = ("exact", "sliding window", "block sparse", "linear", "performer", "LSH", "flash")
REFERENCES = ("exact", "pytorch")
EXACT_VARIANTS = frozenset({"exact", "pytorch", "sliding window", "block sparse", "flash"})
WINDOW_MEANING = {
    "sliding window": "window half-width",
    "block sparse": "block size",
    "LSH": "chunk size",
    "flash": "tile size",
}
T_VALUES = (256, 512, 1024, 2048, 4096)
WINDOWS = (16, 32, 64, 128, 256)
NUM_FEATURES = 64  # Performer's random features
BAR_LABELS = ("this variant", "exact, T×T", "PyTorch SDPA")


def _check_name(name: str, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if name not in allowed:
        raise ValueError(f"variant must be one of {allowed}, got {name!r}")
    return name


def make_inputs(T: int, *, B: int = 1, H: int = 2, D: int = 32, seed: int = 0):
    """Random q, k, v, each ``(B, H, T, D)`` float32, from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g) for _ in range(3))


def lsh_n_buckets(T: int, window: int) -> int:
    """Reformer's choice: about one chunk of ``window`` positions per bucket, so
    ``T // window`` buckets, made even (buckets come in +/- pairs), or 1."""
    n = max(1, T // window)
    return n if n == 1 or n % 2 == 0 else n + 1


def attention_call(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 64) -> Callable[[], torch.Tensor]:
    """A zero-argument callable computing variant ``name`` (one of :data:`VARIANTS`
    or ``"pytorch"``) on q, k, v ``(B, H, T, D)``; returns the output ``(B, H, T, D)``."""
    _check_name(name, VARIANTS + ("pytorch",))
    T = q.shape[2]
    calls = {
        "exact": lambda: scaled_dot_product_attention(q, k, v)[0],
        "pytorch": lambda: F.scaled_dot_product_attention(q, k, v),
        "sliding window": lambda: sliding_window_attention(q, k, v, window),
        "block sparse": lambda: block_sparse_attention(q, k, v, window),
        "linear": lambda: linear_attention(q, k, v),
        "performer": lambda: performer_attention(q, k, v, NUM_FEATURES),
        "LSH": lambda: lsh_attention(q, v, lsh_n_buckets(T, window), window),
        "flash": lambda: flash_attention(q, k, v, block_size=window),
    }
    return calls[name]


# ----------------------------------------------------------------------------- which pairs


@functools.lru_cache(maxsize=16)
def _lsh_pair_index(T: int, window: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query positions, key positions) of the pairs LSH attention weights, head 0."""
    qk = make_inputs(T, seed=seed)[0][:1, :1]  # (1, 1, T, D): head 0 of the shared query/key
    buckets = lsh_buckets(qk, lsh_n_buckets(T, window), 1, seed=0)[0, 0, 0]  # (T,)
    order = torch.argsort(buckets * T + torch.arange(T))  # (T,) sorted slot -> position
    slot = torch.arange(T)[:, None]  # (T, 1) a query's slot in the sorted order
    keys = (slot // window - 1) * window + torch.arange(2 * window)  # (T, 2C): previous chunk and own chunk
    real = (keys >= 0) & (keys < T)  # (T, 2C)
    others = real & (keys != slot)  # a query skips itself ...
    alone = ~others.any(dim=-1, keepdim=True)  # (T, 1) ... unless it has nobody else
    use = others | (alone & (keys == slot))  # (T, 2C)
    qi = order[slot.expand_as(keys)[use]]  # (pairs,) query positions
    kj = order[keys[use]]  # (pairs,) key positions
    return qi, kj


def attended_pairs(name: str, T: int, window: int = 64, *, seed: int = 0) -> torch.Tensor | None:
    """Bool ``(T, T)``, True where query i attends key j under variant ``name``;
    ``None`` for ``"linear"`` and ``"performer"``, which never score a pair.

    LSH's pairs depend on the data: these are head 0's on ``make_inputs(T, seed=seed)``
    (as used by :func:`attention_call`), one hash round."""
    _check_name(name, VARIANTS + ("pytorch",))
    if name in ("linear", "performer"):
        return None
    if name == "sliding window":
        return sliding_window_mask(T, window)
    if name == "block sparse":
        return bigbird_pattern(T, window)
    if name == "LSH":
        pairs = torch.zeros(T, T, dtype=torch.bool)
        pairs[_lsh_pair_index(T, window, seed)] = True
        return pairs
    return torch.ones(T, T, dtype=torch.bool)


def _overlap(T: int, size: int, R: int) -> torch.Tensor:
    """(R, n) share of each of R equal cells of 0..T that falls in each of the
    n = ceil(T / size) blocks of ``size`` positions (rows sum to 1)."""
    edges = torch.arange(R + 1, dtype=torch.float64) * T / R  # (R+1,) cell edges
    starts = torch.arange(0, T, size, dtype=torch.float64)  # (n,) block starts
    ends = (starts + size).clamp(max=T)
    lo = torch.maximum(edges[:-1, None], starts[None, :])
    hi = torch.minimum(edges[1:, None], ends[None, :])
    return (hi - lo).clamp(min=0) / (T / R)  # (R, n)


@functools.lru_cache(maxsize=64)
def _picture(name: str, T: int, window: int, R: int, seed: int) -> torch.Tensor:
    if name in ("linear", "performer"):
        return torch.full((R, R), float("nan"))
    if name in ("exact", "pytorch", "flash"):
        return torch.ones(R, R)
    if name == "block sparse":  # pool the block-level pattern: no (T, T) mask needed
        A = _overlap(T, window, R)  # (R, nb)
        blocks = bigbird_block_pattern(A.shape[1], 1, 1, 1, 0).double()  # (nb, nb) as bigbird_pattern
        return (A @ blocks @ A.T).float()  # (R, R)
    if T % R:
        return F.adaptive_avg_pool2d(attended_pairs(name, T, window, seed=seed).float()[None], R)[0]  # (R, R)
    f = T // R  # positions per cell side
    if name == "sliding window":  # the share depends only on the cell diagonal d = b - a
        delta = torch.arange(-(f - 1), f)  # (2f-1,) j - i within a pair of cells
        d = torch.arange(-(R - 1), R)[:, None]  # (2R-1, 1)
        inside = ((d * f + delta).abs() <= window).double()  # (2R-1, 2f-1)
        share = inside @ (f - delta.abs()).double() / (f * f)  # (2R-1,)
        a = torch.arange(R)
        return share[(a[None, :] - a[:, None]) + R - 1].float()  # (R, R)
    qi, kj = _lsh_pair_index(T, window, seed)  # LSH: count the pairs in each cell
    counts = torch.bincount((qi // f) * R + kj // f, minlength=R * R)  # (R*R,)
    return counts.view(R, R).float() / (f * f)  # (R, R)


def pair_picture(name: str, T: int, window: int = 64, resolution: int = 128, *, seed: int = 0) -> torch.Tensor:
    """Float ``(R, R)``, R = min(resolution, T): the share of the (query, key) pairs
    in each cell that variant ``name`` attends (the mask itself when R == T);
    all NaN for ``"linear"`` and ``"performer"``. Computed without building the
    ``(T, T)`` mask (it equals pooling :func:`attended_pairs`)."""
    _check_name(name, VARIANTS + ("pytorch",))
    return _picture(name, T, window, min(resolution, T), seed).clone()


def pair_share(name: str, T: int, window: int = 64, *, seed: int = 0) -> float | None:
    """The share of the T * T (query, key) pairs that variant ``name`` attends;
    ``None`` for ``"linear"`` and ``"performer"``."""
    _check_name(name, VARIANTS + ("pytorch",))
    if name in ("linear", "performer"):
        return None
    if name in ("exact", "pytorch", "flash"):
        return 1.0
    if name == "LSH":
        return len(_lsh_pair_index(T, window, seed)[0]) / (T * T)
    if name == "sliding window":
        i = torch.arange(T)
        return int(((i + window).clamp(max=T - 1) - (i - window).clamp(min=0) + 1).sum()) / (T * T)
    nb = -(-T // window)  # block sparse: block sizes times the block-level pattern
    sizes = torch.full((nb,), float(window), dtype=torch.float64)
    sizes[-1] = T - window * (nb - 1)
    blocks = bigbird_block_pattern(nb, 1, 1, 1, 0).double()  # (nb, nb)
    return float(sizes @ blocks @ sizes) / (T * T)


# ----------------------------------------------------------------------------- measuring


class TensorMemoryTracker(TorchDispatchMode):
    """Inside ``with TensorMemoryTracker() as m:``, count the bytes of every
    tensor storage PyTorch's operators allocate, until it is freed.

    ``m.peak``: the most bytes alive at once; ``m.largest``: the largest single
    storage; ``m.current``: bytes still alive; ``m.ops``: the operators seen
    (e.g. ``"aten::mm"``). An output that shares its storage with an input of
    the same operator (a view, an in-place op) allocates nothing. Storages that
    existed before the block (the inputs) are not counted. Deterministic: the
    same code gives the same bytes. Scratch memory a C++ kernel allocates for
    itself, below the operator level, is invisible.
    """

    def __init__(self):
        super().__init__()
        self.current = self.peak = self.largest = 0
        self.ops: set[str] = set()
        self._live: dict[int, tuple[weakref.ref, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.add(func._schema.name)
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st._cdata not in inputs:
                    self._add(st)
        return out

    def _add(self, st) -> None:
        key = st._cdata
        entry = self._live.get(key)
        if entry is not None and entry[0]() is st:
            return
        n = st.nbytes()
        self._live[key] = (weakref.ref(st, functools.partial(self._free, key)), n)
        self.current += n
        self.peak = max(self.peak, self.current)
        self.largest = max(self.largest, n)

    def _free(self, key: int, ref: weakref.ref) -> None:
        entry = self._live.get(key)
        if entry is not None and entry[0] is ref:
            del self._live[key]
            self.current -= entry[1]


def tracked_memory(fn: Callable[[], object]) -> dict:
    """Run ``fn()`` once under ``torch.no_grad()`` and a :class:`TensorMemoryTracker`;
    the output is dropped inside, so it counts towards the peak but not after.
    Returns ``{"peak_bytes", "largest_bytes", "ops"}``."""
    with torch.no_grad(), TensorMemoryTracker() as m:
        out = fn()
        del out
    return {"peak_bytes": m.peak, "largest_bytes": m.largest, "ops": sorted(m.ops)}


def time_calls(calls: dict[str, Callable[[], object]], rounds: int = 3, slow_s: float = 0.25) -> dict[str, float]:
    """Seconds per call of each of ``calls`` (name -> zero-argument callable): the
    fastest of its timed calls.

    Under ``torch.no_grad()``: one warm-up call each, then ``rounds`` interleaved
    rounds (every call once per round). The fastest round, not the mean: on a
    shared machine other processes only ever add time, so the minimum is the
    steadiest estimate of what the code itself costs. A call whose warm-up took
    longer than ``slow_s`` seconds runs in the first two rounds only (its cost
    dwarfs the noise)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    samples: dict[str, list[float]] = {name: [] for name in calls}
    slow = set()
    with torch.no_grad():
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            if time.perf_counter() - t0 > slow_s:
                slow.add(name)
        for r in range(rounds):
            for name, fn in calls.items():
                if r >= 2 and name in slow:
                    continue
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    return {name: min(ts) for name, ts in samples.items()}


def cost_key(name: str, T: int, window: int) -> tuple:
    """The key of a measurement: ``(name, T, window)``, window ``None`` for the
    variants that do not use one (exact, pytorch, linear, performer)."""
    return (name, T, window if name in WINDOW_MEANING else None)


def measure_costs(
    names: Sequence[str],
    t_values: Sequence[int],
    window: int = 64,
    *,
    rounds: int = 3,
    memory: bool = True,
    threads: int | None = 1,
    seed: int = 0,
    B: int = 1,
    H: int = 2,
    D: int = 32,
) -> dict[tuple, dict]:
    """Time (and track the memory of) each variant in ``names`` at each T, on
    ``make_inputs(T)``. Returns ``{cost_key(name, T, window): {"time_s", "peak_bytes",
    "largest_bytes"}}`` (no memory keys with ``memory=False``). All variants of one
    T are timed together, interleaved (:func:`time_calls`), with ``threads`` torch
    threads (default 1, as ``bench/``: steadier on a shared machine; ``None``
    keeps the current setting; the setting is restored afterwards)."""
    for name in names:
        _check_name(name, VARIANTS + ("pytorch",))
    out: dict[tuple, dict] = {}
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for T in t_values:
            q, k, v = make_inputs(T, B=B, H=H, D=D, seed=seed)
            calls = {name: attention_call(name, q, k, v, window) for name in names}
            times = time_calls(calls, rounds)
            for name, fn in calls.items():
                entry = {"time_s": times[name]}
                if memory:
                    mem = tracked_memory(fn)
                    entry.update(peak_bytes=mem["peak_bytes"], largest_bytes=mem["largest_bytes"])
                out[cost_key(name, T, window)] = entry
    finally:
        torch.set_num_threads(before)
    return out


def crossover(t_values: Sequence[float], cost: Sequence[float], ref_cost: Sequence[float]) -> float | None:
    """Where ``cost`` drops below ``ref_cost`` for good: the smallest measured T
    from which on every ``cost < ref_cost``, refined by interpolating the log of
    the ratio linearly in log T between that T and the one before it. Returns
    ``t_values[0]`` when ``cost`` is below from the start, ``None`` when it is
    not below at the last T."""
    if not (len(t_values) == len(cost) == len(ref_cost)) or not t_values:
        raise ValueError(f"t_values, cost and ref_cost need the same nonzero length, got "
                         f"{len(t_values)}, {len(cost)}, {len(ref_cost)}")
    ratio = [math.log(c / r) for c, r in zip(cost, ref_cost)]  # < 0: cheaper than the reference
    i = len(ratio)
    while i > 0 and ratio[i - 1] < 0:
        i -= 1
    if i == len(ratio):
        return None
    if i == 0:
        return float(t_values[0])
    t0, t1 = math.log(t_values[i - 1]), math.log(t_values[i])
    r0, r1 = ratio[i - 1], ratio[i]
    return math.exp(t0 + (t1 - t0) * r0 / (r0 - r1))


# ----------------------------------------------------------------------------- the explorer


def _checker(T: int, window: int, R: int) -> torch.Tensor:
    """(R, R) shading that alternates between FlashAttention's tiles (1 when a
    tile is smaller than a cell: nothing to show)."""
    cell = T / R
    if window < cell:
        return torch.ones(R, R)
    tile = (torch.arange(R) * cell / window).floor().long()  # (R,) tile of each cell
    return 1.0 - 0.35 * ((tile[:, None] + tile[None, :]) % 2).float()  # (R, R)


def _fmt(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def sequence_explorer(
    measured: dict | None = None,
    *,
    t_values: Sequence[int] = T_VALUES,
    windows: Sequence[int] = WINDOWS,
    static_t: Sequence[int] = (256, 1024, 4096),
    static_windows: Sequence[int] = (64,),
    rounds: int = 2,
    resolution: int = 128,
    seed: int = 0,
) -> Explorer:
    """Variant, sequence length T and window -> the (query, key) pairs the variant
    scores (downsampled to at most ``resolution`` cells a side) and its measured
    time and tracked peak memory next to exact attention's and PyTorch's fused
    kernel's, on ``make_inputs(T)`` (B=1, H=2, D=32).

    ``measured`` (``{cost_key(...): {"time_s", "peak_bytes"}}``, e.g. from
    :func:`measure_costs`) supplies costs already measured; the rest are measured
    on first use (``rounds`` timed rounds) and kept in that same dict. Passing the
    numbers for the static combinations makes the book's frames cost no
    measuring. The static frames: every variant x ``static_t``, window ``static_windows``.
    """
    costs = {} if measured is None else measured

    def cost(name: str, T: int, window: int) -> dict:
        key = cost_key(name, T, window)
        if key not in costs or "peak_bytes" not in costs[key]:
            costs.update(measure_costs([name], [T], window, rounds=rounds, seed=seed))
        return costs[key]

    def compute(variant, T, window):
        share = pair_share(variant, T, window, seed=seed)
        roles = {"variant": variant, "exact": "exact", "pytorch": "pytorch"}
        c = {role: cost(name, T, window) for role, name in roles.items()}
        return {
            "variant": variant, "T": T, "window": window, "uses_window": variant in WINDOW_MEANING,
            "picture": pair_picture(variant, T, window, resolution, seed=seed), "pair_share": share,
            "time_s": {role: x["time_s"] for role, x in c.items()},
            "peak_bytes": {role: x["peak_bytes"] for role, x in c.items()},
        }

    roles = ("variant", "exact", "pytorch")
    colors = ("tab:orange", "tab:blue", "tab:green")
    art = {}

    def _build():
        import matplotlib as mpl

        fig = Figure(figsize=(10.0, 3.3), dpi=72)
        fig.subplots_adjust(left=0.03, right=0.97, top=0.84, bottom=0.16, wspace=0.12)
        gs = fig.add_gridspec(1, 5, width_ratios=[1.0, 0.32, 1.3, 0.1, 1.3])
        a0 = fig.add_subplot(gs[0])
        cmap = mpl.colormaps["Blues"].with_extremes(bad="#e8e8e8")
        norm = mpl.colors.PowerNorm(0.5, vmin=0, vmax=1)  # sparse scattered pairs stay visible
        image = a0.imshow(torch.ones(resolution, resolution).numpy(), cmap=cmap, norm=norm,
                          extent=(0, 1, 1, 0), interpolation="nearest")
        a0.set_xticks([])
        a0.set_yticks([])
        a0.set_xlabel("key j →")
        a0.set_ylabel("← query i")
        note = a0.text(0.5, 0.5, "", ha="center", va="center", fontsize=9, transform=a0.transAxes)
        art.update(image=image, note=note, title0=a0.set_title(" ", fontsize=10))
        for n, (what, unit, lo, hi) in enumerate((("time", "ms", 1e-2, 1e4), ("peak memory (tracked)", "MiB", 1e-2, 1e4))):
            ax = fig.add_subplot(gs[2 * n + 2])
            ax.set_xscale("log")
            ax.set_xlim(lo, hi)
            ax.set_xticks([1e-2, 1, 1e2, 1e4], labels=["0.01", "1", "100", "10000"])  # plain: mathtext is slow
            ax.minorticks_off()
            ax.set_ylim(-0.6, 2.6)
            bars = ax.barh([2, 1, 0], [lo * 1.0001] * 3, left=lo, color=colors, height=0.6)
            ax.set_yticks([2, 1, 0], labels=BAR_LABELS if n == 0 else [""] * 3, fontsize=8)
            ax.set_xlabel(f"{what}, {unit} (log scale)", fontsize=9)
            ax.grid(axis="x", alpha=0.3)
            texts = [ax.text(lo, y, "", va="center", fontsize=8) for y in (2, 1, 0)]
            art[unit] = (bars, texts, lo)
        art["title"] = fig.suptitle(" ", fontsize=11)
        dynamic = [image, note, art["title0"], art["title"], *art["ms"][0], *art["ms"][1], *art["MiB"][0], *art["MiB"][1]]
        FastFigure(fig, dynamic)
        art["fig"] = fig

    def draw(d):
        if not art:
            _build()
        T, window, variant = d["T"], d["window"], d["variant"]
        picture = d["picture"]
        if variant == "flash":
            picture = picture * _checker(T, window, picture.shape[0])
        art["image"].set_data(picture.numpy())
        if d["pair_share"] is None:
            width = "D = 32" if variant == "linear" else f"m = {NUM_FEATURES}"
            art["note"].set_text(f"no (query, key) score\nis ever computed:\nkeys are summed into a\n({width}) × D state")
            art["title0"].set_text("pairs scored: none")
        else:
            art["note"].set_text("")
            art["title0"].set_text(f"pairs scored: {d['pair_share']:.1%} of T²")
        for unit, values, scale in (("ms", d["time_s"], 1e3), ("MiB", d["peak_bytes"], 2.0**-20)):
            bars, texts, lo = art[unit]
            for bar, text, role in zip(bars, texts, roles):
                x = max(values[role] * scale, lo * 1.0001)
                bar.set_width(x - lo)
                text.set_x(x * 1.15)
                text.set_text(_fmt(values[role] * scale))
        used = f", {WINDOW_MEANING[variant]} {window}" if d["uses_window"] else ""
        art["title"].set_text(f"{variant}{used}, T = {T}")
        return art["fig"]

    def caption(d):
        t, m = d["time_s"], d["peak_bytes"]
        share = "no pairs scored" if d["pair_share"] is None else f"{d['pair_share']:.1%} of the T² pairs scored"
        return (f"{d['variant']}, T = {d['T']}: {share}; time {t['variant'] * 1e3:.3g} ms vs exact "
                f"{t['exact'] * 1e3:.3g} ms and PyTorch's fused kernel {t['pytorch'] * 1e3:.3g} ms; peak memory "
                f"{m['variant'] / 2**20:.3g} MiB vs {m['exact'] / 2**20:.3g} MiB and {m['pytorch'] / 2**20:.3g} MiB "
                "(measured on this machine when the page was built)")

    t_values, windows = list(t_values), list(windows)
    static_t, static_windows = list(static_t), list(static_windows)
    return Explorer(
        "Efficient attention: cost against sequence length",
        [
            Control("variant", VARIANTS, "sliding window", label="variant", kind="dropdown"),
            Control("T", t_values, 1024 if 1024 in static_t else static_t[0], label="sequence length T",
                    static=list(static_t)),
            Control("window", windows, static_windows[0], label="window / block", static=list(static_windows)),
        ],
        compute, draw, caption,
    )
