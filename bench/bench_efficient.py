"""Benchmark of attnbook.efficient against PyTorch, measured in one run on the CPU.

    python bench/bench_efficient.py            # T = 2048 and 8192 (about a minute or two)
    python bench/bench_efficient.py --quick    # T = 512 and 2048, a smoke test
    python bench/bench_efficient.py --threads 0  # torch's default thread count

Dimension legend: B batch (1), H heads (2), T sequence length, D head dim (32).

(a) sliding_window_attention (window 64) and linear_attention, non-causal and
    causal: the cost ratio time(T_large) / time(T_small) (goal < 10: a 4x
    longer sequence; quadratic attention is ~16x) and the speed-up over
    ``F.scaled_dot_product_attention`` at T_large (goal > 1).
(b) flash_attention at T_large: peak memory against the naive explicit path
    (``attnbook.scaled_dot_product_attention``, which builds the (T, T)
    weights), measured in a fresh subprocess for each as the growth of the
    peak RSS over one call (VmHWM reset through /proc/self/clear_refs on
    Linux, else ru_maxrss) (goal <= 1/10), and its time against the naive
    path (goal <= 2x).

Times are medians over interleaved repeats (every case once per round, so a
load spike on this shared machine hits all cases alike) after one warm-up
call, under ``torch.no_grad()``. Results are printed as a table and written to
bench/results/efficient.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "efficient.json"
B, H, D, WINDOW = 1, 2, 32, 64


def _setup(threads: int):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    return torch


def _inputs(torch, T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g) for _ in range(3))  # (B, H, T, D) each


def _cases(torch, T: int):
    """name -> zero-argument callable, for one sequence length."""
    import torch.nn.functional as F

    from attnbook import scaled_dot_product_attention
    from attnbook.efficient import flash_attention, linear_attention, sliding_window_attention

    q, k, v = _inputs(torch, T)
    return {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "sdpa_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sliding_window": lambda: sliding_window_attention(q, k, v, WINDOW),
        "sliding_window_causal": lambda: sliding_window_attention(q, k, v, WINDOW, causal=True),
        "linear": lambda: linear_attention(q, k, v),
        "linear_causal": lambda: linear_attention(q, k, v, causal=True),
        "naive": lambda: scaled_dot_product_attention(q, k, v)[0],
        "flash": lambda: flash_attention(q, k, v),
        "flash_causal": lambda: flash_attention(q, k, v, causal=True),
    }


def _time_interleaved(torch, plan: list[tuple[str, object]], repeats: int) -> dict[str, float]:
    """Median seconds per case; every case runs once per round, after one warm-up call."""
    samples: dict[str, list[float]] = {name: [] for name, _ in plan}
    with torch.no_grad():
        for _, fn in plan:
            fn()
        for _ in range(repeats):
            for name, fn in plan:
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in samples.items()}


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Linux: reset the peak RSS (VmHWM) to the current RSS (``echo 5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def _measure_memory_child(method: str, T: int, threads: int) -> None:
    """Run in a fresh process: print how far one call raises the peak RSS above
    the RSS just before it (bytes).

    On Linux the peak is reset first, so the growth is VmHWM after the call
    minus VmRSS before it. Elsewhere it is the growth of ``ru_maxrss``, which
    can under-count: memory freed before the call (imports) may be reused.
    """
    torch = _setup(threads)
    from attnbook import scaled_dot_product_attention
    from attnbook.efficient import flash_attention

    fns = {
        "naive": lambda q, k, v: scaled_dot_product_attention(q, k, v)[0],
        "flash": lambda q, k, v: flash_attention(q, k, v),
    }
    fn = fns[method]
    with torch.no_grad():
        fn(*_inputs(torch, 256, seed=1))  # warm up: thread pools, kernels, allocator
        q, k, v = _inputs(torch, T)
        if _reset_peak_rss():
            how = "VmHWM after - VmRSS before (peak reset via /proc/self/clear_refs)"
            before = _status_kib("VmRSS")
            out = fn(q, k, v)
            after = _status_kib("VmHWM")
        else:
            how = "ru_maxrss after - before"
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            out = fn(q, k, v)
            after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            if sys.platform == "darwin":  # bytes there, KiB on Linux
                before, after = before / 1024, after / 1024
    assert out.shape == (B, H, T, D)
    print(json.dumps({"method": method, "peak_growth_bytes": int((after - before) * 1024), "how": how}))


def _measure_memory(method: str, T: int, threads: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_memory-child", method, "--T", str(T)]
    cmd += ["--threads", str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _verdict(value: float, goal: str, target: float) -> bool:
    return value < target if goal == "<" else value > target if goal == ">" else value <= target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (T = 512 and 2048), fewer repeats")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: this shared 2-core machine gives steadier timings with one; 0 = torch's default)",
    )
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 15, or 5 with --quick)")
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results/efficient.json")
    ap.add_argument("--_memory-child", dest="memory_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--T", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        _measure_memory_child(args.memory_child, args.T, args.threads)
        return 0

    torch = _setup(args.threads)
    t_small, t_large = (512, 2048) if args.quick else (2048, 8192)
    repeats = args.repeats or (5 if args.quick else 15)
    big_repeats = max(1, min(repeats, 3))  # the naive (T, T) path takes seconds per call
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), B={B} H={H} D={D} window={WINDOW}, "
        f"T={t_small} and {t_large}, {repeats} rounds (naive/flash: {big_repeats})",
        flush=True,
    )

    small, large = _cases(torch, t_small), _cases(torch, t_large)
    variants = ["sliding_window", "sliding_window_causal", "linear", "linear_causal"]
    plan = [(f"{n}@{t_small}", small[n]) for n in variants]
    plan += [(f"{n}@{t_large}", large[n]) for n in variants + ["sdpa", "sdpa_causal"]]
    times = _time_interleaved(torch, plan, repeats)
    print("timed (a)", flush=True)
    big = [(f"{n}@{t_large}", large[n]) for n in ("naive", "flash", "flash_causal")]
    times.update(_time_interleaved(torch, big, big_repeats))
    print("timed (b)", flush=True)

    measured = {m: _measure_memory(m, t_large, args.threads) for m in ("naive", "flash")}
    mem = {m: r["peak_growth_bytes"] for m, r in measured.items()}
    analytic = {  # float32 bytes of the largest score tensor each path holds
        "naive": B * H * t_large * t_large * 4,
        "flash": B * H * t_large * 128 * 4,
    }

    rows = []  # (name, value, goal, target, note)
    for n in variants:
        ref = "sdpa_causal" if n.endswith("causal") else "sdpa"
        rows.append(
            (f"{n}: time(T={t_large}) / time(T={t_small})", times[f"{n}@{t_large}"] / times[f"{n}@{t_small}"], "<", 10.0, "")
        )
        rows.append(
            (f"{n}: time({ref}) / time({n}) at T={t_large}", times[f"{ref}@{t_large}"] / times[f"{n}@{t_large}"], ">", 1.0, "")
        )
    rows.append(
        (
            f"flash: peak memory / naive peak at T={t_large}",
            mem["flash"] / max(mem["naive"], 1),
            "<=",
            0.1,
            f"peak RSS growth {mem['flash'] / 2**20:.1f} vs {mem['naive'] / 2**20:.1f} MiB "
            f"(largest scores tensor {analytic['flash'] / 2**20:.0f} vs {analytic['naive'] / 2**20:.0f} MiB)",
        )
    )
    rows.append((f"flash: time(flash) / time(naive) at T={t_large}", times[f"flash@{t_large}"] / times[f"naive@{t_large}"], "<=", 2.0, ""))
    rows.append(
        (
            f"flash_causal: time(flash_causal) / time(naive) at T={t_large}",
            times[f"flash_causal@{t_large}"] / times[f"naive@{t_large}"],
            "<=",
            2.0,
            "naive path is non-causal: an upper bound",
        )
    )

    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'ratio':<{width}}  {'measured':>9}  {'goal':>8}  result")
    results = []
    for name, value, goal, target, note in rows:
        ok = _verdict(value, goal, target)
        print(f"{name:<{width}}  {value:>9.3f}  {goal + ' ' + format(target, 'g'):>8}  {'PASS' if ok else 'MISS'}  {note}")
        results.append({"ratio": name, "measured": round(value, 4), "goal": f"{goal} {target:g}", "pass": ok, "note": note})
    if args.quick:
        print("(--quick is a smoke test: the goals are set for T = 2048 and 8192, where a fixed overhead weighs less)")
    print()
    print("median seconds: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(times.items())))

    if not args.no_save:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "config": {
                "B": B,
                "H": H,
                "D": D,
                "window": WINDOW,
                "T_small": t_small,
                "T_large": t_large,
                "quick": args.quick,
                "threads": torch.get_num_threads(),
                "rounds": repeats,
                "rounds_naive_flash": big_repeats,
                "flash_block_size": 128,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "machine": platform.machine(),
            },
            "median_seconds": {k: round(v, 6) for k, v in sorted(times.items())},
            "peak_memory_growth_bytes": mem,
            "peak_memory_method": measured["flash"]["how"],
            "largest_scores_tensor_bytes": analytic,
            "ratios": results,
            "all_pass": all(r["pass"] for r in results),
        }
        RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
