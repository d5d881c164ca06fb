"""Regenerate the book's results page, ``benchmarks.md``, and its plots in one command.

    .venv/bin/python bench/report.py            # T up to 8192: a few minutes
    .venv/bin/python bench/report.py --quick    # T up to 2048: about a minute, a smoke test

Dimension legend: B batch (1), H heads (2), T sequence length, D head dim (32).

What it does, in order:

1. runs the goals of ``bench/bench_efficient.py`` and ``bench/bench_flash.py`` (their
   ``main``; ``--quick`` and ``--threads`` are passed on), which write
   ``bench/results/efficient.json`` and ``bench/results/flash.json``; ``--skip-goals``
   reuses the JSON already there;
2. times every case of ``bench_efficient.cases`` at several T with
   ``bench_efficient.time_cases`` (median of interleaved rounds after a warm-up), plus
   the other variants of chapter 8 (block sparse, Performer, LSH) from the same
   registry (:func:`attnbook.efficient.attention_call`) on the same inputs;
   peak memory is tracked for every case
   (:func:`attnbook.measure.tracked_memory`: every tensor PyTorch
   allocates, deterministic) and, for the naive and flash paths, also measured
   as the peak RSS growth of a fresh process (``bench_efficient.measure_memory``);
3. reads ``bench/results/explorers.json`` (written by ``bench/bench_explorers.py``)
   and, when present, ``bench/results/tasks.json`` (``bench/bench_tasks.py``);
4. writes ``benchmarks.md`` (top level, part of the book) and
   ``images/bench/time_vs_T.png`` and ``images/bench/memory_vs_T.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PAGE = ROOT / "benchmarks.md"
IMAGES = ROOT / "images" / "bench"
for p in (ROOT, BENCH):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import bench_efficient as be  # noqa: E402
import bench_flash as bf  # noqa: E402

EXTRA = ("block sparse", "performer", "LSH")  # chapter 8's other variants, window/block/chunk 64
STYLE = {  # case -> (label, color, line style)
    "naive": ("exact, explicit T×T (attnbook)", "tab:blue", "-"),
    "sdpa": ("PyTorch fused SDPA", "tab:green", "-"),
    "sdpa_causal": ("PyTorch fused SDPA, causal", "tab:green", ":"),
    "flash": (f"flash (Python, tiles {be.FLASH_QUERY_BLOCK}×{be.FLASH_BLOCK})", "tab:gray", "-."),
    "flash_causal": ("flash, causal", "tab:gray", ":"),
    "sliding_window": ("sliding window (64)", "tab:orange", "--"),
    "sliding_window_causal": ("sliding window, causal", "tab:orange", ":"),
    "linear": ("linear (elu + 1)", "tab:purple", "--"),
    "linear_causal": ("linear, causal", "tab:purple", ":"),
    "block sparse": ("block sparse (BigBird, 64)", "tab:red", "--"),
    "performer": ("Performer (m = 64)", "tab:brown", "--"),
    "LSH": ("LSH (chunks of 64)", "tab:pink", "-."),
}
SLOW = ("naive", "flash", "flash_causal")  # seconds per call at the largest T: fewer rounds


def sweep(t_values: list[int], repeats: int, threads: int, progress=print) -> dict:
    """Times (s), tracked peaks (bytes) for every case at every T; RSS peaks for naive and flash."""
    from attnbook.efficient import attention_call, make_inputs
    from attnbook.measure import tracked_memory

    times: dict[str, dict[int, float]] = {}
    tracked: dict[str, dict[int, int]] = {}
    rss: dict[str, dict[int, int]] = {"naive": {}, "flash": {}}
    for T in t_values:
        cases = be.cases(T)
        q, k, v = make_inputs(T, B=be.B, H=be.H, D=be.D)  # the inputs be.cases uses
        for name in EXTRA:
            cases[name] = attention_call(name, q, k, v, be.WINDOW)
        fast = {n: fn for n, fn in cases.items() if n not in SLOW}
        slow = {n: cases[n] for n in SLOW}
        measured = be.time_cases(fast, repeats)
        measured.update(be.time_cases(slow, repeats if T <= 2048 else 2))
        for name, fn in cases.items():
            times.setdefault(name, {})[T] = measured[name]
            tracked.setdefault(name, {})[T] = tracked_memory(fn)["peak_bytes"]
        for name in rss:
            rss[name][T] = be.measure_memory(name, T, threads)["peak_growth_bytes"]
        progress(f"  T = {T}: timed and tracked {len(cases)} cases", flush=True)
    return {"times": times, "tracked": tracked, "rss": rss}


def plot(data: dict, t_values: list[int]) -> list[str]:
    from matplotlib.figure import Figure

    IMAGES.mkdir(parents=True, exist_ok=True)
    written = []
    for key, fname, ylabel, title in (
        ("times", "time_vs_T.png", "time (ms, median)", "time against sequence length (CPU, log-log)"),
        ("tracked", "memory_vs_T.png", "peak memory (MiB, tracked)", "peak memory against sequence length (log-log)"),
    ):
        fig = Figure(figsize=(10, 5), dpi=90)
        ax = fig.subplots()
        scale = 1e3 if key == "times" else 2.0**-20
        for name, (label, color, line) in STYLE.items():
            series = data[key].get(name)
            if series:
                ax.plot(t_values, [series[T] * scale for T in t_values], line, marker="o", ms=3, color=color, label=label)
        if key == "tracked":
            for name, color in (("naive", "tab:blue"), ("flash", "tab:gray")):
                ax.plot(t_values, [data["rss"][name][T] / 2**20 for T in t_values], "x", color=color, ms=7,
                        label=f"{STYLE[name][0]}: peak RSS growth, measured")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(t_values, labels=[str(T) for T in t_values])
        ax.minorticks_off()
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        fig.savefig(IMAGES / fname)
        written.append(f"images/bench/{fname}")
    return written


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def _fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def _when(t_values, cost, ref) -> str:
    from attnbook.measure import crossover

    x = crossover(t_values, cost, ref)
    if x is None:
        return f"not by T = {t_values[-1]}"
    return f"already at T = {t_values[0]}" if x == t_values[0] else f"T ≈ {x:.0f}"


def render(eff: dict, data: dict, t_values: list[int], images: list[str], explorers: dict | None,
           tasks: dict | None, meta: dict, flash: dict | None = None) -> str:
    L = ["# Benchmarks", ""]
    L.append(
        f"Measured on {meta['date']} on a machine with {meta['cpus']} CPU(s) ({meta['machine']}), torch "
        f"{meta['torch']}, Python {meta['python']}, {meta['threads']} torch thread(s); load average "
        f"{meta['load']:.2f} at the start (the machine is shared: timings vary from run to run, compare ratios "
        "measured in one run). Regenerate this page, its plots and `bench/results/efficient.json` with one "
        "command, `.venv/bin/python bench/report.py` (add `--quick` for smaller sizes)."
    )
    L.append("")
    goals = [r["pass"] for r in eff["ratios"]]
    if flash:
        goals += [r["pass"] for r in flash["ratios"]]
    if explorers:
        goals += [r["meets_goal"] for r in explorers["results"].values()]
    if tasks:
        goals += [r["status"] == "PASS" for r in tasks["results"] if r.get("status") in ("PASS", "MISS")]
    L.append(f"**{sum(goals)} of {len(goals)} goals met.**")
    L.append("")

    c = eff["config"]
    L += ["## Efficient attention: the goals", ""]
    L.append(
        f"`bench/bench_efficient.py`{' --quick' if c.get('quick') else ''}: CPU, B={c['B']}, H={c['H']}, "
        f"D={c['D']}, float32, window {c['window']}, T = {c['T_small']} and {c['T_large']}, median of "
        f"{c['rounds']} interleaved rounds ({c['rounds_naive_flash']} for the naive and flash paths), "
        f"{c['threads']} thread(s). \"naive\" is `attnbook.scaled_dot_product_attention`, which builds the "
        "(T, T) weights; \"sdpa\" is PyTorch's `F.scaled_dot_product_attention`."
    )
    L.append("")
    L += _table(
        ["ratio", "measured", "goal", "result", "note"],
        [[r["ratio"], f"{r['measured']:.3f}", r["goal"], "PASS" if r["pass"] else "MISS", r.get("note", "")]
         for r in eff["ratios"]],
    )

    if flash:
        f = flash["config"]
        L += ["## Flash attention: training, against PyTorch's kernel", ""]
        L.append(
            f"`bench/bench_flash.py`{' --quick' if f.get('quick') else ''}: CPU, T = {f['T']}, float32, "
            f"{f['threads']} thread(s), tiles of {f['query_block_size']} queries × {f['block_size']} keys, median of "
            f"{f['rounds']} interleaved rounds, load average {f['load_average']:.2f} at its start. \"forward+backward\" "
            "is one training step of the attention (`attnbook.measure.forward_backward`); \"SDPA\" is PyTorch's "
            "`F.scaled_dot_product_attention` (forward and backward), \"explicit\" `attnbook.scaled_dot_product_attention`, "
            "whose (T, T) weights autograd keeps. Memory is tracked (deterministic) and measured as a fresh "
            "process's peak RSS growth."
        )
        L.append("")
        L += _table(
            ["shape", "ratio", "measured", "goal", "result", "note"],
            [[r["shape"], r["ratio"], f"{r['measured']:.3f}", r["goal"], "PASS" if r["pass"] else "MISS", r["note"]]
             for r in flash["ratios"]],
        )

    L += ["## Time and memory against sequence length", ""]
    L.append(
        f"Every case at T = {', '.join(map(str, t_values))} (B=1, H=2, D=32), the same inputs for all; time is the "
        "median of interleaved rounds after a warm-up call. Memory is the peak of the bytes of all tensors alive "
        "at once, tracked operator by operator (`attnbook.measure.tracked_memory`, deterministic; "
        "scratch memory inside a C++ kernel is invisible to it); for the naive and flash paths it is also measured "
        "as the growth of a fresh process's peak RSS (the crosses). See chapter 8 for what each variant computes."
    )
    L.append("")
    for img in images:
        L += [f"![{Path(img).stem.replace('_', ' ')}]({img})", ""]
    names = [n for n in STYLE if n in data["times"]]
    L += ["Median time (ms):", ""]
    L += _table(["case"] + [f"T={T}" for T in t_values],
                [[STYLE[n][0]] + [_fmt_ms(data["times"][n][T]) for T in t_values] for n in names])
    L += ["Peak memory (MiB; tracked, and RSS growth measured where given):", ""]
    rows = []
    for n in names:
        row = [STYLE[n][0]]
        for T in t_values:
            cell = f"{data['tracked'][n][T] / 2**20:.2f}"
            if n in data["rss"]:
                cell += f" ({data['rss'][n][T] / 2**20:.1f} RSS)"
            row.append(cell)
        rows.append(row)
    L += _table(["case"] + [f"T={T}" for T in t_values], rows)

    L += ["Where each variant becomes cheaper than the exact paths, from the numbers above (the smallest measured T "
          "from which on it stays cheaper, interpolated on log-log axes; `attnbook.measure.crossover`):", ""]
    rows = []
    for n in names:
        if n in ("naive", "sdpa", "sdpa_causal"):
            continue
        ref = "sdpa_causal" if n.endswith("causal") else "sdpa"
        t = [data["times"][n][T] for T in t_values]
        rows.append([
            STYLE[n][0],
            _when(t_values, t, [data["times"]["naive"][T] for T in t_values]),
            _when(t_values, t, [data["times"][ref][T] for T in t_values]) + (" (causal)" if ref.endswith("causal") else ""),
            _when(t_values, [data["tracked"][n][T] for T in t_values], [data["tracked"]["naive"][T] for T in t_values]),
        ])
    L += _table(["variant", "time below naive", "time below PyTorch SDPA", "memory below naive"], rows)

    L += ["## Explorers: one update", ""]
    if explorers:
        L.append(
            f"`bench/bench_explorers.py` (read from `bench/results/explorers.json`, measured on {explorers.get('cpu_count', '?')} "
            f"CPU(s)): median time of one live update (move a control, recompute, redraw, encode the PNG), goal under "
            f"{explorers['goal_ms']:.0f} ms, and the time to render the static scrubber."
        )
        L.append("")
        L += _table(
            ["explorer", "median update (ms)", "/ goal", "static frames (s)", "result"],
            [[name, f"{r['median_update_ms']:.1f}", f"{r['ratio_to_goal']:.2f}", f"{r['static_html_s']:.1f}",
              "PASS" if r["meets_goal"] else "MISS"] for name, r in explorers["results"].items()],
        )
    else:
        L += ["No `bench/results/explorers.json` yet: run `.venv/bin/python bench/bench_explorers.py`.", ""]

    if tasks:
        L += ["## Toy tasks: training a small Transformer", ""]
        L.append(
            f"`bench/bench_tasks.py` (read from `bench/results/tasks.json`, run on {tasks.get('date', '?')}, "
            f"{tasks.get('cpus', '?')} CPU(s), {tasks.get('threads', '?')} thread(s)): whole-sequence accuracy on "
            f"held-out data after training for the given wall time (limit {tasks.get('time_limit_s', '?')} s)."
        )
        L.append("")
        rows = []
        for r in tasks["results"]:
            goal = r.get("goal_accuracy")
            best = r.get("best_head") or {}
            rows.append([
                r.get("task", "?"), r.get("model", "?"), f"{r.get('params', 0):,}", f"{r.get('train_seconds', 0):.1f}",
                f"{r.get('accuracy', 0):.4f}", "-" if goal is None else f"{goal:.2f}", r.get("status", "-"),
                f"layer {best.get('layer', '?')}, head {best.get('head', '?')} ({best.get('share', 0):.3f})",
            ])
        L += _table(["task", "model", "params", "train s", "accuracy", "goal", "result", "best-aligned head (share)"],
                    rows)
    return "\n".join(L).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="T up to 2048 and fewer rounds (a smoke test)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as bench_efficient.py)")
    ap.add_argument("--skip-goals", action="store_true", help="reuse bench/results/efficient.json instead of rerunning")
    args = ap.parse_args(argv)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if not args.skip_goals:
        print("1/3 bench_efficient.py goals", flush=True)
        rc = be.main((["--quick"] if args.quick else []) + ["--threads", str(args.threads)])
        if rc:
            return rc
        print("1/3 bench_flash.py goals", flush=True)
        rc = bf.main((["--quick"] if args.quick else []) + ["--threads", str(args.threads)])
        if rc:
            return rc
    eff = json.loads((RESULTS / "efficient.json").read_text())
    flash = json.loads((RESULTS / "flash.json").read_text()) if (RESULTS / "flash.json").exists() else None

    torch = be.setup(args.threads)
    t_values = [256, 512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
    repeats = 3 if args.quick else 5
    print(f"2/3 sweep over T = {t_values}, {repeats} rounds", flush=True)
    data = sweep(t_values, repeats, args.threads)
    images = plot(data, t_values)

    print("3/3 page", flush=True)
    explorers = json.loads((RESULTS / "explorers.json").read_text()) if (RESULTS / "explorers.json").exists() else None
    tasks = json.loads((RESULTS / "tasks.json").read_text()) if (RESULTS / "tasks.json").exists() else None
    meta = {
        "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "machine": platform.machine(),
        "torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
        "load": load,
    }
    PAGE.write_text(render(eff, data, t_values, images, explorers, tasks, meta, flash), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} and {', '.join(images)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
