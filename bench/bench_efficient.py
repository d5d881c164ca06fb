"""Benchmark of attnbook.efficient against PyTorch, measured in one run on the CPU.

    python bench/bench_efficient.py            # T = 1024 .. 8192 (a few minutes)
    python bench/bench_efficient.py --quick    # T = 256 .. 2048, a smoke test
    python bench/bench_efficient.py --threads 0  # torch's default thread count

Dimension legend: B batch (1), H heads (2), T sequence length, D head dim (32).

Every case (:data:`CASES`) is timed at every T of :data:`T_VALUES` (``--quick``: :data:`T_VALUES_QUICK`)
in one sweep (:func:`measure`), and the goals are computed from that sweep (:func:`goal_rows`), so the
goals and the tables of bench/report.py, which calls the same two functions, come from the same numbers:

(a) the linear-cost variants (:data:`LINEAR_COST`: sliding window (window 64) and linear attention,
    non-causal and causal, BigBird block sparse (blocks of 64), Performer (64 features)): the slope of
    log(time) against log(T), fitted by least squares over the T values, goal <= 1.15 (1 is linear, 2
    quadratic; a ratio time(8192) / time(2048) < 10 would let a T^1.66 method pass). The slope of every
    other case is reported too, without a goal (exact and flash are quadratic; LSH with T/64 buckets
    hashes at O(T^2 D / 128) cost and sorts at O(T log T));
(b) sliding window and linear attention: the speed-up over ``F.scaled_dot_product_attention`` at the
    largest T (goal > 1);
(c) flash_attention (inference) at the largest T: peak memory against the naive explicit path
    (``attnbook.scaled_dot_product_attention``, which builds the (T, T) weights), measured in a fresh
    subprocess for each as the growth of the peak RSS over one call (VmHWM reset through
    /proc/self/clear_refs on Linux, else ru_maxrss) (goal <= 1/10), and its time against the naive path
    (goal <= 2x). Its training (forward+backward) and its speed against PyTorch's kernel are
    bench/bench_flash.py's.

Each case runs through ``attnbook.efficient.attention_call`` on ``attnbook.efficient.make_inputs(T)``.
Times are medians over interleaved rounds (every case once per round, so a load spike on this shared
machine hits all cases alike) after one warm-up call, under ``torch.no_grad()``
(``attnbook.measure.time_calls``). Doubling steps whose time grows faster than any case's arithmetic
(local slope above 2.5) or shrinks are listed as anomalies (:func:`anomalies`), not hidden.
Results are printed and written to bench/results/efficient.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import common  # first: puts the repository root on sys.path

from attnbook.efficient import FLASH_BLOCK, FLASH_QUERY_BLOCK  # flash_attention's default tiles

NAME = "efficient"  # bench/results/efficient.json
RESULTS = common.results_path(NAME)
B, H, D, WINDOW = 1, 2, 32, 64
T_VALUES = (1024, 2048, 4096, 8192)  # the slopes are fitted over these
T_VALUES_QUICK = (256, 512, 1024, 2048)
SLOPE_GOAL = 1.15
ANOMALY_SLOPE = 2.5  # a doubling step whose local slope is above this grows faster than T^2 arithmetic

# case name (the keys of efficient.json and of bench/report.py's tables) -> (registry variant, causal, window)
CASES = {
    "naive": ("exact", False, WINDOW),
    "sdpa": ("pytorch", False, WINDOW),
    "sdpa_causal": ("pytorch", True, WINDOW),
    "flash": ("flash", False, FLASH_BLOCK),
    "flash_causal": ("flash", True, FLASH_BLOCK),
    "sliding_window": ("sliding window", False, WINDOW),
    "sliding_window_causal": ("sliding window", True, WINDOW),
    "linear": ("linear", False, WINDOW),
    "linear_causal": ("linear", True, WINDOW),
    "block_sparse": ("block sparse", False, WINDOW),
    "performer": ("performer", False, WINDOW),
    "lsh": ("LSH", False, WINDOW),
}
LINEAR_COST = ("sliding_window", "sliding_window_causal", "linear", "linear_causal", "block_sparse", "performer")
SLOW = ("naive", "flash", "flash_causal")  # a second or more per call at T = 8192: fewer rounds there
SPEEDUP = ("sliding_window", "sliding_window_causal", "linear", "linear_causal")  # goal: faster than SDPA


def cases(T: int, names: Iterable[str] = CASES) -> dict[str, Callable[[], object]]:
    """Case name -> zero-argument callable, for one sequence length (the same inputs for all)."""
    from attnbook.efficient import attention_call, make_inputs

    q, k, v = make_inputs(T, batch_size=B, num_heads=H, head_dim=D)  # (B, H, T, D) each
    return {name: attention_call(variant, q, k, v, window, causal=causal)
            for name, (variant, causal, window) in ((n, CASES[n]) for n in names)}


def time_cases(plan: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per case; every case runs once per round, after one warm-up call."""
    from attnbook.measure import time_calls

    return time_calls(plan, repeats, slow_s=None, reduce="median")


def loglog_slope(t_values: Sequence[int], seconds: Sequence[float]) -> float:
    """Least-squares slope of log(seconds) against log(T): 1 for a linear cost, 2 for a quadratic one."""
    x = [math.log(t) for t in t_values]
    y = [math.log(s) for s in seconds]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def slopes(times: dict[str, dict[int, float]], t_values: Sequence[int]) -> dict[str, float]:
    """Fitted slope of every case over ``t_values`` (which must all have been measured)."""
    return {name: loglog_slope(t_values, [series[T] for T in t_values]) for name, series in times.items()}


def anomalies(times: dict[str, dict[int, float]]) -> list[str]:
    """Doubling steps a reader should not take at face value: time growing faster than T^ANOMALY_SLOPE
    (more than any case's arithmetic, which is at most quadratic) or falling while T grows."""
    notes = []
    for name, series in times.items():
        ts = sorted(series)
        for a, b in zip(ts, ts[1:]):
            local = math.log(series[b] / series[a]) / math.log(b / a)
            if local > ANOMALY_SLOPE or local < 0:
                notes.append(f"{name}: T = {a} -> {b} took {series[b] / series[a]:.1f}x the time "
                             f"(local slope {local:.2f}, outside 0 .. {ANOMALY_SLOPE})")
    return notes


def measure(t_values: Sequence[int], repeats: int, threads: int, memory: bool = True,
            progress: Callable[..., object] = print) -> dict[str, Any]:
    """The sweep: median seconds of every case at every T (``times[case][T]``), the tracked peak bytes of
    every case (``tracked[case][T]``, with ``memory``) and the peak RSS growth of the naive and flash paths
    in fresh processes (``rss[case][T]``). Slow cases run 3 rounds above T = 2048."""
    from attnbook.measure import tracked_memory

    times: dict[str, dict[int, float]] = {}
    tracked: dict[str, dict[int, int]] = {}
    rss: dict[str, dict[int, int]] = {"naive": {}, "flash": {}}
    for T in t_values:
        plan = cases(T)
        fast = {n: fn for n, fn in plan.items() if n not in SLOW}
        slow = {n: plan[n] for n in SLOW}
        measured = time_cases(fast, repeats)
        measured.update(time_cases(slow, repeats if T <= 2048 else min(repeats, 3)))
        for name, fn in plan.items():
            times.setdefault(name, {})[T] = measured[name]
            if memory:
                tracked.setdefault(name, {})[T] = tracked_memory(fn)["peak_bytes"]
        for name in rss:
            rss[name][T] = measure_memory(name, T, threads)["peak_growth_bytes"]
        progress(f"  T = {T}: timed {len(plan)} cases ({repeats} rounds)", flush=True)
    return {"times": times, "tracked": tracked, "rss": rss}


def goal_rows(data: dict[str, Any], slope_t: Sequence[int]) -> list[tuple[str, float, str, float, str]]:
    """(ratio, measured, goal, target, note) for every goal, from one :func:`measure` sweep; the slopes are
    fitted over ``slope_t``, the other goals are at its largest T."""
    times, rss = data["times"], data["rss"]
    t_large = max(slope_t)
    fitted = slopes(times, slope_t)
    span = f"T = {min(slope_t)}..{t_large}"
    rows = []
    for n in LINEAR_COST:
        rows.append((f"{n}: fitted log-log slope of time, {span}", fitted[n], "<=", SLOPE_GOAL, "linear cost: 1"))
    for n in SPEEDUP:
        ref = "sdpa_causal" if n.endswith("causal") else "sdpa"
        rows.append((f"{n}: time({ref}) / time({n}) at T={t_large}", times[ref][t_large] / times[n][t_large], ">", 1.0,
                     f"{times[ref][t_large] * 1e3:.3g} vs {times[n][t_large] * 1e3:.3g} ms"))
    mem = {m: rss[m][t_large] for m in ("naive", "flash")}
    largest = {"naive": B * H * t_large * t_large * 4, "flash": B * H * FLASH_QUERY_BLOCK * FLASH_BLOCK * 4}
    rows.append((f"flash: peak memory / naive peak at T={t_large}", mem["flash"] / max(mem["naive"], 1), "<=", 0.1,
                 f"peak RSS growth {mem['flash'] / 2**20:.1f} vs {mem['naive'] / 2**20:.1f} MiB (largest scores "
                 f"tensor {largest['flash'] / 2**20:.0f} vs {largest['naive'] / 2**20:.0f} MiB)"))
    for n, note in (("flash", ""), ("flash_causal", "naive path is non-causal: an upper bound")):
        rows.append((f"{n}: time({n}) / time(naive) at T={t_large}", times[n][t_large] / times["naive"][t_large], "<=",
                     2.0, (f"{times[n][t_large] * 1e3:.0f} vs {times['naive'][t_large] * 1e3:.0f} ms" + (f"; {note}" if note else ""))))
    return rows


def _measure_memory_child(method: str, T: int, threads: int) -> None:
    """Run in a fresh process: print how far one call raises the peak RSS above
    the RSS just before it (bytes), with ``attnbook.measure.peak_rss_growth``."""
    torch = common.setup(threads)
    from attnbook.measure import peak_rss_growth

    with torch.no_grad():
        cases(256, [method])[method]()  # warm up: thread pools, kernels, allocator
        fn = cases(T, [method])[method]
        growth, how = peak_rss_growth(fn)
    print(json.dumps({"method": method, "peak_growth_bytes": int(growth), "how": how}))


def measure_memory(method: str, T: int, threads: int) -> dict[str, Any]:
    """Peak RSS growth of one call of case ``method`` ("naive" or "flash") at ``T``, in a fresh process."""
    return common.run_child(Path(__file__).resolve(),
                            ["--_memory-child", method, "--T", str(T), "--threads", str(threads)])


def evaluate(data: dict[str, Any], slope_t: Sequence[int]) -> list[dict[str, Any]]:
    """The goal rows of one sweep as dicts with PASS/MISS (``pass``), as efficient.json stores them."""
    return [{"ratio": name, "measured": round(value, 4), "goal": f"{goal} {target:g}",
             "pass": common.verdict(value, goal, target), "note": note}
            for name, value, goal, target, note in goal_rows(data, slope_t)]


def save(data: dict[str, Any], slope_t: Sequence[int], results: list[dict[str, Any]], config: dict[str, Any]) -> None:
    """Write bench/results/efficient.json: the config, every median and peak of the sweep, the fitted slopes,
    the anomalies and the goals."""
    payload = {
        "config": config,
        "median_seconds": {n: {str(T): round(s, 6) for T, s in series.items()} for n, series in data["times"].items()},
        "tracked_peak_bytes": {n: {str(T): b for T, b in series.items()} for n, series in data["tracked"].items()},
        "peak_memory_growth_bytes": {n: {str(T): b for T, b in series.items()} for n, series in data["rss"].items()},
        "fitted_slopes": {n: round(s, 3) for n, s in slopes(data["times"], slope_t).items()},
        "slope_T": list(slope_t),
        "anomalies": anomalies(data["times"]),
        "ratios": results,
        "all_pass": all(r["pass"] for r in results),
    }
    common.save_results(NAME, payload)


def config(torch: ModuleType, t_values: Sequence[int], repeats: int, quick: bool, threads: int,
           load_start: float | None) -> dict[str, Any]:
    """What efficient.json records about the run (call it right after the sweep: it reads the load at the end)."""
    return {
        "B": B, "H": H, "D": D, "window": WINDOW, "T_values": list(t_values), "quick": quick,
        "rounds": repeats, "rounds_slow_above_2048": min(repeats, 3), "statistic": "median of interleaved rounds",
        "flash_block_size": FLASH_BLOCK, "flash_query_block_size": FLASH_QUERY_BLOCK,
        **common.run_info(),  # torch, threads, python, machine, cpus, date, machine_summary
        "load_average_start": load_start, "load_average_end": common.load_average(),
    }


def print_results(data: dict[str, Any], slope_t: Sequence[int], results: list[dict[str, Any]]) -> None:
    width = max(len(r["ratio"]) for r in results)
    print()
    print(f"{'ratio':<{width}}  {'measured':>9}  {'goal':>8}  result")
    for r in results:
        print(f"{r['ratio']:<{width}}  {r['measured']:>9.3f}  {r['goal']:>8}  {common.pass_miss(r['pass'])}  {r['note']}")
    print()
    print(f"fitted slopes, T = {min(slope_t)}..{max(slope_t)}: "
          + ", ".join(f"{n} {s:.2f}" for n, s in slopes(data["times"], slope_t).items()))
    for note in anomalies(data["times"]):
        print("anomaly:", note)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (T = 256 .. 2048), fewer repeats")
    common.add_threads_option(ap)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 15, or 5 with --quick)")
    common.add_no_save_option(ap, NAME)
    ap.add_argument("--_memory-child", dest="memory_child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--T", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        _measure_memory_child(args.memory_child, args.T, args.threads)
        return 0

    torch = common.setup(args.threads)
    t_values = T_VALUES_QUICK if args.quick else T_VALUES
    repeats = args.repeats or (5 if args.quick else 15)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), B={B} H={H} D={D} window={WINDOW}, "
          f"T = {list(t_values)}, {repeats} rounds", flush=True)
    load_start = common.load_average()
    data = measure(t_values, repeats, args.threads, memory=False)
    run = config(torch, t_values, repeats, args.quick, args.threads, load_start)
    results = evaluate(data, t_values)
    print_results(data, t_values, results)
    if args.quick:
        print("(--quick is a smoke test: the goals are set for T = 1024 .. 8192, where a fixed overhead weighs less)")
    if not args.no_save:
        data["tracked"] = {}
        save(data, t_values, results, run)
        print(f"wrote {common.shown(RESULTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
