"""Chapter 9's explorer: what fewer key/value heads (GQA, MQA) save in KV cache memory and decoding time.

How many key/value heads a model keeps (multi-head, grouped-query, multi-query
attention), what that does to the KV cache's memory (counted) and to the time
of one decoding step's attention (measured).

Dimension legend:
    B    batch size (1 here)
    H    number of query heads
    Hkv  number of key/value heads (a divisor of H); G = H / Hkv query heads share one
    T    number of new queries (1 in a decoding step)
    S    number of cached keys (the context so far)
    D    head dimension

The model whose cache is counted is fixed (:data:`MODEL`, that is
:data:`attnbook.kvcache.MODEL_7B`): 32 layers, head dim 128, keys and values in
float16, batch 1, as in the 7B-class models of 2023-24. The decoding step that
is timed is one layer's attention of a single new query per head over
S / :data:`BENCH_DIVISOR` cached keys, in float32, with
:func:`attnbook.mha.grouped_decode_attention`, which reads each key/value head
once for its whole group (no ``repeat_interleave``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from ..kvcache import BENCH_DIVISOR, MODEL_7B, decode_key, kv_cache_bytes, kv_cache_bytes_per_token, measure_decode
from ..mha import valid_kv_heads
from ..plotting import log_bars
from .base import Control, Explorer, device_control

__all__ = ["MODEL", "HEADS", "KV_CHOICES", "KV_HEADS", "SEQ_LENS", "kv_heads_explorer"]

MODEL = MODEL_7B
HEADS = (8, 16, 32)
KV_CHOICES = ("MHA (=H)", "H/2", "H/4", "H/8", "MQA (1)")
_KV_DIVISOR = {"MHA (=H)": 1, "H/2": 2, "H/4": 4, "H/8": 8}
SEQ_LENS = (1024, 2048, 4096, 8192, 16384, 32768)


def _kv_heads(num_heads: int, choice: str) -> int:
    """Hkv for one of :data:`KV_CHOICES`: H, H/2, H/4, H/8 or 1. Where H is not
    divisible by the fraction's denominator, the largest divisor of H below H/n
    (so every choice is valid for every H)."""
    if choice not in KV_CHOICES:
        raise ValueError(f"choice must be one of {KV_CHOICES}, got {choice!r}")
    divisors = valid_kv_heads(num_heads)
    if choice == "MQA (1)":
        return 1
    target = num_heads / _KV_DIVISOR[choice]
    return max(h for h in divisors if h <= max(1.0, target))


KV_HEADS = {H: tuple(_kv_heads(H, choice) for choice in KV_CHOICES) for H in HEADS}
"""For each number of query heads H the explorer offers, the key/value heads of each of :data:`KV_CHOICES`."""

# ----------------------------------------------------------------------------- the explorer

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
_GIB = 2.0**30


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _kv_label(choice: str, hkv: int) -> str:
    return f"{choice.split(' ')[0]}: {hkv} KV head{'s' if hkv > 1 else ''}"


def kv_heads_explorer(
    measured: dict | None = None,
    *,
    num_heads_options: Sequence[int] = HEADS,
    seq_len_options: Sequence[int] = SEQ_LENS,
    static_num_heads: Sequence[int] = HEADS,
    static_seq_len: Sequence[int] = (4096, 32768),
    rounds: int = 5,
    seed: int = 0,
) -> Explorer:
    """Query heads H, key/value heads (a fraction of H), context length S and
    device -> the KV cache memory of :data:`MODEL` (counted, for every choice of
    key/value heads and every context length) and the measured time of one
    decoding step's attention at benchmark scale (:func:`measure_decode`).

    ``measured`` (``{decode_key(...): seconds}``, e.g. from :func:`measure_decode`)
    supplies timings already made; missing ones are measured on first use (all
    key/value choices of one (H, S, device) together) and kept in that same dict.
    Static frames: ``static_num_heads`` x every key/value choice x ``static_seq_len`` on the
    CPU; passing their timings makes the book's frames cost no measuring, and the
    frames' layout never depends on a timing.
    """
    costs = {} if measured is None else measured
    live: set[tuple] = set()  # the timings this explorer measured (the others came in ``measured``)
    heads, seq_lens = list(num_heads_options), list(seq_len_options)

    def missing(H: int, S: int, device: str) -> list[int]:
        bench_len = max(1, S // BENCH_DIVISOR)
        options = sorted({_kv_heads(H, c) for c in KV_CHOICES}, reverse=True)
        return [h for h in options if decode_key(H, h, bench_len, device) not in costs]

    def busy(v: dict) -> str | None:
        if not missing(v["num_heads"], v["seq_len"], v["device"]):
            return None
        return (f"measuring one decoding step for every KV choice at H = {v['num_heads']}, S = {v['seq_len']:,} "
                f"on {v['device']} (fastest of {rounds} rounds); a few seconds")

    def timing(H: int, S: int, device: str) -> dict[int, float]:
        options = sorted({_kv_heads(H, c) for c in KV_CHOICES}, reverse=True)
        bench_len = max(1, S // BENCH_DIVISOR)
        missing = [h for h in options if decode_key(H, h, bench_len, device) not in costs]
        if missing:
            new = measure_decode(H, S, missing, device=device, rounds=rounds, seed=seed)
            costs.update(new)
            live.update(new)
        return {h: costs[decode_key(H, h, bench_len, device)] for h in options}

    def compute(num_heads: int, kv: str, seq_len: int, device: str) -> dict:
        H = num_heads
        options = [_kv_heads(H, c) for c in KV_CHOICES]  # one per choice (H/8 and MQA may coincide)
        times = timing(H, seq_len, device)
        hkv = _kv_heads(H, kv)
        bench_len = max(1, seq_len // BENCH_DIVISOR)
        return {
            "num_heads": H, "kv": kv, "num_kv_heads": hkv, "group": H // hkv, "seq_len": seq_len,
            "device": device, "bench_len": bench_len,
            "bytes_per_token": kv_cache_bytes_per_token(MODEL["num_layers"], hkv, MODEL["head_dim"], MODEL["dtype"]),
            "cache_bytes": kv_cache_bytes(hkv, seq_len),
            "options": options,
            "cache_curves": [[kv_cache_bytes(h, s) for s in seq_lens] for h in options],  # (choice, S)
            "time_s": [times[h] for h in options],
            "bench_read_bytes": [2 * h * bench_len * MODEL["head_dim"] * 4 for h in options],  # K and V, float32
            "current": KV_CHOICES.index(kv),
        }

    def layout(d: dict) -> int:
        return d["num_heads"]  # the curves and the bar labels depend only on H

    def build(d: dict) -> tuple[Figure, dict[str, Any]]:
        options = d["options"]
        fig = Figure(figsize=(9.6, 4.0), dpi=72)
        fig.subplots_adjust(left=0.08, right=0.97, top=0.84, bottom=0.14, wspace=0.62)
        a1, a2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.05]})
        for n, (choice, curve) in enumerate(zip(KV_CHOICES, d["cache_curves"])):
            a1.plot(seq_lens, [b / _GIB for b in curve], "-", marker=".", color=_COLORS[n],
                    label=_kv_label(choice, options[n]), lw=1.4)
        a1.set_xscale("log", base=2)
        a1.set_yscale("log")
        a1.set_xlim(seq_lens[0] / 1.3, seq_lens[-1] * 1.3)
        a1.set_ylim(0.005, 300)  # room above the curves for the legend
        a1.set_xticks(seq_lens, labels=[f"{s // 1024}k" for s in seq_lens])  # plain labels: mathtext is slow
        a1.set_yticks([0.01, 0.1, 1, 10, 100], labels=["0.01", "0.1", "1", "10", "100"])
        a1.minorticks_off()
        a1.set_xlabel("context length S (tokens)")
        a1.set_ylabel("KV cache, GiB (log)")
        a1.grid(alpha=0.3)
        a1.legend(fontsize=10, loc="upper left", ncol=2, handlelength=1.2, columnspacing=0.8, borderaxespad=0.3,
                  labelspacing=0.25)
        (marker,) = a1.plot([seq_lens[0]], [1.0], "o", ms=11, mfc="none", mec="black", mew=2)
        t1 = a1.set_title(" ", fontsize=10)
        ys = list(range(len(KV_CHOICES)))[::-1]
        bars = log_bars(a2, ys, 3e-3, 1e3, [1e-2, 0.1, 1, 10, 100, 1000], color="lightgray", fontsize=10)
        a2.set_ylim(-0.6, len(ys) - 0.4)
        a2.set_yticks(ys, labels=[_kv_label(c, h) for c, h in zip(KV_CHOICES, options)], fontsize=10)
        a2.set_xlabel("one decoding step's attention, ms (log), measured", fontsize=10)
        a2.grid(axis="x", alpha=0.3)
        t2 = a2.set_title(" ", fontsize=10)
        title = fig.suptitle(" ", fontsize=11)
        return fig, {"marker": marker, "t1": t1, "bars": list(bars.bars), "texts": bars.texts, "t2": t2,
                     "title": title, "log_bars": bars}

    def redraw(d: dict, art: dict[str, Any]) -> None:
        art["marker"].set_data([d["seq_len"]], [d["cache_bytes"] / _GIB])
        art["t1"].set_text(f"KV cache of the model (counted): {_fmt_bytes(d['cache_bytes'])}")
        ms = [t * 1e3 for t in d["time_s"]]
        for n, bar in enumerate(art["bars"]):  # the colours first: a label inside a bar takes a colour that reads on it
            bar.set_color(_COLORS[n] if n == d["current"] else "lightgray")
        art["log_bars"].set(ms, [f"{x:.3g} ms, reads {_fmt_bytes(b)}" for x, b in zip(ms, d["bench_read_bytes"])])
        art["t2"].set_text(f"1 layer, {d['bench_len']} cached keys (S/{BENCH_DIVISOR}), fp32, {d['device']}")
        art["title"].set_text(f"H = {d['num_heads']} query heads, {d['num_kv_heads']} KV heads "
                              f"({d['group']} queries per KV head), S = {d['seq_len']:,}")

    def numbers(d: dict) -> str:
        mha = d["time_s"][0]
        t = d["time_s"][d["current"]]
        return (f"{d['kv']} with H = {d['num_heads']}: {d['num_kv_heads']} KV heads; cache "
                f"{_fmt_bytes(d['bytes_per_token'])} per token, {_fmt_bytes(d['cache_bytes'])} at S = {d['seq_len']:,} "
                f"({MODEL['num_layers']} layers, head dim {MODEL['head_dim']}, fp16, batch 1; "
                f"{d['group']}x less than MHA). One step's attention at benchmark scale: {t * 1e3:.3g} ms vs "
                f"{mha * 1e3:.3g} ms for MHA (fastest of interleaved rounds on {d['device']}")

    def static_caption(d: dict) -> str:
        return f"{numbers(d)}, measured when the page was built)"

    def caption(d: dict) -> str:
        now = decode_key(d["num_heads"], d["num_kv_heads"], d["bench_len"], d["device"]) in live
        return f"{numbers(d)}, {'measured just now' if now else 'measured earlier in this notebook'})"

    static_num_heads, static_seq_len = list(static_num_heads), list(static_seq_len)
    return Explorer(
        "KV heads: cache memory and decoding time",
        [
            Control("num_heads", heads, static_num_heads[-1], label="query heads H", kind="toggle", static=static_num_heads),
            Control("kv", KV_CHOICES, "H/4", label="KV heads", kind="toggle"),
            Control("seq_len", seq_lens, static_seq_len[0], label="context length S", static=static_seq_len,
                    fmt=lambda s: f"{s:,}"),
            device_control(),
        ],
        compute, caption=caption, layout=layout, build=build, redraw=redraw, busy=busy, static_caption=static_caption,
    )
