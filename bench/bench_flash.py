"""Benchmark of attnbook.efficient.flash_attention, forward and forward+backward, against PyTorch, in one run.

    python bench/bench_flash.py            # T = 8192, two shapes (a few minutes)
    python bench/bench_flash.py --quick    # T = 2048, a smoke test
    python bench/bench_flash.py --threads 0  # torch's default thread count

Dimension legend: B batch (1), H heads, T sequence length (= S), D head dim.

Two shapes (:data:`SHAPES`): bench_efficient.py's B=1, H=2, D=32 and B=1, H=1, D=64. For each, at T_large:

(a) speed against ``F.scaled_dot_product_attention`` (PyTorch's fused kernel), float32, one thread:
    time(flash forward) / time(SDPA forward) (goal <= 2) and time(flash forward+backward) /
    time(SDPA forward+backward) (goal <= 3), non-causal and causal (against SDPA with ``is_causal``);
(b) peak memory of forward+backward against the explicit path (``attnbook.scaled_dot_product_attention``,
    which builds the (T, T) weights, and autograd keeps them): goal <= 1/10, both tracked
    (``attnbook.measure.tracked_memory``: every tensor PyTorch's operators allocate, deterministic) and
    measured (the growth of a fresh process's peak RSS over one call, ``attnbook.measure.peak_rss_growth``).

A forward+backward call is ``attnbook.measure.forward_backward``: the output's gradient is a fixed random
tensor, the gradients of q, k and v are returned (nothing accumulates in ``.grad``). Times are medians
of interleaved rounds (every call once per round, so a load spike on this shared machine hits all
alike) after one warm-up call each (``attnbook.measure.time_calls``). Results are printed as a table
with PASS/MISS per goal and written to bench/results/flash.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # first: puts the repository root on sys.path
import torch

from attnbook.efficient import FLASH_BLOCK, FLASH_QUERY_BLOCK

NAME = "flash"  # bench/results/flash.json
RESULTS = common.results_path(NAME)
SHAPES = {"H2 D32": (1, 2, 32), "H1 D64": (1, 1, 64)}  # name -> (B, H, D); the first is bench_efficient.py's
GOALS = {"forward": 2.0, "forward+backward": 3.0, "memory": 0.1}
PATHS = ("flash", "sdpa", "explicit")


def attention(path: str, causal: bool) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn(q, k, v) -> out (B, H, T, D)`` for one path: attnbook's flash, PyTorch's SDPA, or the explicit one."""
    import torch.nn.functional as F

    import attnbook
    from attnbook.efficient import flash_attention

    if path == "flash":
        return lambda q, k, v: flash_attention(q, k, v, causal=causal)
    if path == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if path == "explicit":
        if causal:
            raise ValueError("the explicit path is measured non-causal only")
        return lambda q, k, v: attnbook.scaled_dot_product_attention(q, k, v)[0]
    raise ValueError(f"path must be one of {PATHS}, got {path!r}")


def inputs(T: int, shape: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``(B, H, T, D)`` (``attnbook.efficient.make_inputs``) and the output's gradient, all float32."""
    from attnbook.efficient import make_inputs

    B, H, D = SHAPES[shape]
    q, k, v = make_inputs(T, batch_size=B, num_heads=H, head_dim=D, dtype=torch.float32)
    dout = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(1))  # (B, H, T, D)
    return q, k, v, dout


def calls(T: int, shape: str) -> dict[str, Callable[[], object]]:
    """Every timed call at one T: ``"<path> <forward|forward+backward>[ causal]"`` -> zero-argument callable."""
    from attnbook.measure import forward_backward

    q, k, v, dout = inputs(T, shape)
    out: dict[str, Callable[[], object]] = {}
    for causal in (False, True):
        tag = " causal" if causal else ""
        for path in ("sdpa", "flash"):
            fn = attention(path, causal)
            out[f"{path} forward{tag}"] = functools.partial(fn, q, k, v)
            out[f"{path} forward+backward{tag}"] = forward_backward(fn, q, k, v, grad_out=dout)
    return out


def tracked_peaks(T: int, shape: str) -> dict[str, int]:
    """Tracked peak bytes of one forward+backward call of each path (deterministic)."""
    from attnbook.measure import forward_backward, tracked_memory

    q, k, v, dout = inputs(T, shape)
    return {path: tracked_memory(forward_backward(attention(path, False), q, k, v, grad_out=dout))["peak_bytes"]
            for path in PATHS}


def _measure_memory_child(path: str, T: int, shape: str, threads: int) -> None:
    """Run in a fresh process: print how far one forward+backward call raises the peak RSS (bytes)."""
    common.setup(threads)
    from attnbook.measure import forward_backward, peak_rss_growth

    q, k, v, dout = inputs(256, shape)
    forward_backward(attention(path, False), q, k, v, grad_out=dout)()  # warm up: thread pools, kernels, allocator
    q, k, v, dout = inputs(T, shape)
    growth, how = peak_rss_growth(forward_backward(attention(path, False), q, k, v, grad_out=dout))
    print(json.dumps({"path": path, "peak_growth_bytes": int(growth), "how": how}))


def measured_peak(path: str, T: int, shape: str, threads: int) -> dict[str, Any]:
    """Peak RSS growth of one forward+backward call of ``path`` at ``T``, in a fresh process."""
    return common.run_child(Path(__file__).resolve(), ["--_memory-child", path, "--T", str(T), "--shape", shape,
                                                       "--threads", str(threads)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="T = 2048 instead of 8192, fewer rounds (a smoke test)")
    common.add_threads_option(ap)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5, or 3 with --quick)")
    common.add_no_save_option(ap, NAME)
    ap.add_argument("--_memory-child", dest="memory_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--T", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        _measure_memory_child(args.memory_child, args.T, args.shape, args.threads)
        return 0

    common.setup(args.threads)
    from attnbook.measure import machine_summary, time_calls

    T = 2048 if args.quick else 8192
    repeats = args.repeats or (3 if args.quick else 5)
    load = common.load_average()
    print(f"{machine_summary()}; load average {load}", flush=True)
    print(f"T={T}, float32, tiles {FLASH_QUERY_BLOCK} queries x {FLASH_BLOCK} keys, {repeats} interleaved rounds",
          flush=True)

    rows: list[tuple[str, str, float, float, str]] = []  # (shape, ratio name, measured, goal, note)
    times: dict[str, dict[str, float]] = {}
    memory: dict[str, dict[str, dict[str, int]]] = {}
    how = ""
    for shape in SHAPES:
        t = time_calls(calls(T, shape), repeats, slow_s=None, reduce="median")
        times[shape] = t
        print(f"{shape}: timed", flush=True)
        for tag in ("", " causal"):
            for kind in ("forward", "forward+backward"):
                ratio = t[f"flash {kind}{tag}"] / t[f"sdpa {kind}{tag}"]
                rows.append((shape, f"time(flash {kind}{tag}) / time(SDPA {kind}{tag})", ratio, GOALS[kind],
                             f"{t[f'flash {kind}{tag}'] * 1e3:.0f} vs {t[f'sdpa {kind}{tag}'] * 1e3:.0f} ms"))
        tracked = tracked_peaks(T, shape)
        measured = {p: measured_peak(p, T, shape, args.threads) for p in ("flash", "explicit")}
        how = measured["flash"]["how"]
        rss = {p: r["peak_growth_bytes"] for p, r in measured.items()}
        memory[shape] = {"tracked": tracked, "rss_growth": rss}
        print(f"{shape}: memory measured", flush=True)
        for kind, peaks in (("tracked", tracked), ("peak RSS growth", rss)):
            rows.append((shape, f"peak memory of forward+backward, flash / explicit ({kind})",
                         peaks["flash"] / max(peaks["explicit"], 1), GOALS["memory"],
                         f"{peaks['flash'] / 2**20:.1f} vs {peaks['explicit'] / 2**20:.0f} MiB"
                         + (f" (SDPA {peaks['sdpa'] / 2**20:.1f} MiB)" if "sdpa" in peaks else "")))

    width = max(len(r[1]) for r in rows)
    print()
    print(f"{'shape':7s} {'ratio':<{width}}  {'measured':>8}  {'goal':>6}  result")
    results: list[dict[str, Any]] = []
    for shape, name, value, target, note in rows:
        ok = common.verdict(value, "<=", target)
        print(f"{shape:7s} {name:<{width}}  {value:>8.3f}  {'<= ' + format(target, 'g'):>6}  "
              f"{common.pass_miss(ok)}  {note}")
        results.append({"shape": shape, "ratio": name, "measured": round(value, 4), "goal": f"<= {target:g}",
                        "pass": ok, "note": note})
    print(f"{sum(r['pass'] for r in results)} of {len(results)} goals met; load average {load} at the start, "
          f"{common.load_average()} at the end")
    if args.quick:
        print("(--quick is a smoke test: the goals are set for T = 8192)")

    if not args.no_save:
        payload = {
            "config": {
                "T": T, "shapes": {name: dict(zip("BHD", s)) for name, s in SHAPES.items()}, "quick": args.quick,
                "rounds": repeats, "block_size": FLASH_BLOCK, "query_block_size": FLASH_QUERY_BLOCK,
                **common.run_info(),  # torch, threads, python, machine, cpus, date, machine_summary
                "load_average": load,
            },
            "median_seconds": {shape: {k: round(v, 6) for k, v in t.items()} for shape, t in times.items()},
            "peak_memory_bytes": memory,
            "peak_memory_method": how,
            "ratios": results,
            "all_pass": all(r["pass"] for r in results),
        }
        common.save_results(NAME, payload)
        print(f"wrote {common.shown(RESULTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
