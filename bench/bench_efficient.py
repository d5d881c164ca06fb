"""Benchmark of attnbook.efficient against PyTorch, measured in one run on the CPU.

    python bench/bench_efficient.py            # T = 2048 and 8192 (about a minute or two)
    python bench/bench_efficient.py --quick    # T = 512 and 2048, a smoke test
    python bench/bench_efficient.py --threads 0  # torch's default thread count

Dimension legend: B batch (1), H heads (2), T sequence length, D head dim (32).

(a) sliding_window_attention (window 64) and linear_attention, non-causal and
    causal: the cost ratio time(T_large) / time(T_small) (goal < 10: a 4x
    longer sequence; quadratic attention is ~16x) and the speed-up over
    ``F.scaled_dot_product_attention`` at T_large (goal > 1).
(b) flash_attention (inference) at T_large: peak memory against the naive explicit path
    (``attnbook.scaled_dot_product_attention``, which builds the (T, T)
    weights), measured in a fresh subprocess for each as the growth of the
    peak RSS over one call (VmHWM reset through /proc/self/clear_refs on
    Linux, else ru_maxrss) (goal <= 1/10), and its time against the naive
    path (goal <= 2x). Its training (forward+backward) and its speed against PyTorch's kernel are
    bench/bench_flash.py's.

Every case is a variant of ``attnbook.efficient.REGISTRY`` run by
``attnbook.efficient.attention_call`` on ``attnbook.efficient.make_inputs(T)``
(:data:`CASES`). Times are medians over interleaved repeats (every case once per
round, so a load spike on this shared machine hits all cases alike) after one
warm-up call, under ``torch.no_grad()`` (``attnbook.measure.time_calls``). Peak
RSS growth is ``attnbook.measure.peak_rss_growth``. Results are printed as a
table and written to bench/results/efficient.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "efficient.json"
B, H, D, WINDOW = 1, 2, 32, 64
FLASH_BLOCK = 256  # flash_attention's default tiles: 256 keys (attnbook.efficient.FLASH_BLOCK) ...
FLASH_QUERY_BLOCK = 512  # ... by 512 queries (attnbook.efficient.FLASH_QUERY_BLOCK)

# case name (the keys of efficient.json and of bench/report.py's tables) -> (registry variant, causal, window)
CASES = {
    "sdpa": ("pytorch", False, WINDOW),
    "sdpa_causal": ("pytorch", True, WINDOW),
    "sliding_window": ("sliding window", False, WINDOW),
    "sliding_window_causal": ("sliding window", True, WINDOW),
    "linear": ("linear", False, WINDOW),
    "linear_causal": ("linear", True, WINDOW),
    "naive": ("exact", False, WINDOW),
    "flash": ("flash", False, FLASH_BLOCK),
    "flash_causal": ("flash", True, FLASH_BLOCK),
}


def setup(threads: int):
    """Make ``attnbook`` importable from the repository and set torch's thread count (0: torch's default)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    return torch


def cases(T: int, names=CASES) -> dict[str, Callable[[], object]]:
    """Case name -> zero-argument callable, for one sequence length (the same inputs for all)."""
    from attnbook.efficient import attention_call, make_inputs

    q, k, v = make_inputs(T, B=B, H=H, D=D)  # (B, H, T, D) each
    return {name: attention_call(variant, q, k, v, window, causal=causal)
            for name, (variant, causal, window) in ((n, CASES[n]) for n in names)}


def time_cases(plan: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per case; every case runs once per round, after one warm-up call."""
    from attnbook.measure import time_calls

    return time_calls(plan, repeats, slow_s=None, reduce="median")


def _measure_memory_child(method: str, T: int, threads: int) -> None:
    """Run in a fresh process: print how far one call raises the peak RSS above
    the RSS just before it (bytes), with ``attnbook.measure.peak_rss_growth``."""
    torch = setup(threads)
    from attnbook.measure import peak_rss_growth

    with torch.no_grad():
        cases(256, [method])[method]()  # warm up: thread pools, kernels, allocator
        fn = cases(T, [method])[method]
        growth, how = peak_rss_growth(fn)
    print(json.dumps({"method": method, "peak_growth_bytes": int(growth), "how": how}))


def measure_memory(method: str, T: int, threads: int) -> dict:
    """Peak RSS growth of one call of case ``method`` ("naive" or "flash") at ``T``, in a fresh process."""
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

    torch = setup(args.threads)
    t_small, t_large = (512, 2048) if args.quick else (2048, 8192)
    repeats = args.repeats or (5 if args.quick else 15)
    big_repeats = max(1, min(repeats, 3))  # the naive (T, T) path takes seconds per call
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), B={B} H={H} D={D} window={WINDOW}, "
        f"T={t_small} and {t_large}, {repeats} rounds (naive/flash: {big_repeats})",
        flush=True,
    )

    small, large = cases(t_small), cases(t_large)
    variants = ["sliding_window", "sliding_window_causal", "linear", "linear_causal"]
    plan = {f"{n}@{t_small}": small[n] for n in variants}
    plan.update({f"{n}@{t_large}": large[n] for n in variants + ["sdpa", "sdpa_causal"]})
    times = time_cases(plan, repeats)
    print("timed (a)", flush=True)
    big = {f"{n}@{t_large}": large[n] for n in ("naive", "flash", "flash_causal")}
    times.update(time_cases(big, big_repeats))
    print("timed (b)", flush=True)

    measured = {m: measure_memory(m, t_large, args.threads) for m in ("naive", "flash")}
    mem = {m: r["peak_growth_bytes"] for m, r in measured.items()}
    analytic = {  # float32 bytes of the largest score tensor each path holds
        "naive": B * H * t_large * t_large * 4,
        "flash": B * H * FLASH_QUERY_BLOCK * FLASH_BLOCK * 4,  # one (query block, key block) tile per head
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
                "flash_block_size": FLASH_BLOCK,
                "flash_query_block_size": FLASH_QUERY_BLOCK,
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
