"""How many torch threads the heavy training cells should run with on a two-vCPU machine (a Colab CPU runtime).

Each workload is a chapter's own training code, read from its MyST source and executed up to the function it
defines, then called once in a fresh process per setting: torch's intra-op threads 1 or 2, OpenMP's default
(active) or passive waiting, and the machine either as it is or with one competing busy process (a notebook
kernel next to another, a Colab neighbour, the helpers of a build). Interleaved rounds, medians.

    .venv/bin/python bench/bench_threads.py               # every workload, 3 rounds (a few minutes)
    .venv/bin/python bench/bench_threads.py --rounds 1 --no-save
    .venv/bin/python bench/bench_threads.py --workloads ch05 --as-is-only   # one workload, no competing process

Writes bench/results/threads.json; no goals (the chapters set what it finds fastest where it matters most:
the busy machine). Times depend on the machine and its load; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

import common  # first: puts the repository root on sys.path

NAME = "threads"
# name -> (chapter source, text of the cell to stop after, the call to time)
WORKLOADS: dict[str, tuple[str, str, str]] = {
    "ch05 tiny LM, 100 steps": ("05_positional_encoding", "def train(kind", 'train("RoPE", steps=100)'),
    "ch11 ViT, 5 epochs": ("11_beyond_text", "x_train, y_train, x_test, y_test",
                           "vision.fit_images(vision.VisionTransformer(image_size=8, patch=2, d_model=32, num_heads=4, "
                           "num_layers=2, dim_feedforward=96), x_train, y_train, epochs=5, batch_size=32, lr=2e-3)"),
}
SETTINGS = [(1, "default"), (2, "default"), (2, "PASSIVE")]

CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[5])
import jupytext, torch
threads, chapter, stop, call = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
torch.set_num_threads(threads)
ns = {}
for cell in jupytext.read(f"{sys.argv[5]}/chapters/{chapter}.md").cells:
    if cell.cell_type != "code" or "_explorer(" in cell.source:
        continue
    exec(compile(cell.source, chapter, "exec"), ns)
    torch.set_num_threads(threads)  # a chapter's own setting does not count here
    if stop in cell.source:
        break
start = time.perf_counter()
eval(call, ns)
print(json.dumps({"seconds": time.perf_counter() - start, "threads": torch.get_num_threads()}))
'''


def time_one(workload: tuple[str, str, str], threads: int, wait: str) -> float:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("OMP_NUM_THREADS", None)
    if wait == "PASSIVE":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        env.pop("OMP_WAIT_POLICY", None)
    chapter, stop, call = workload
    res = subprocess.run([sys.executable, "-c", CHILD, str(threads), chapter, stop, call, str(common.ROOT)],
                         capture_output=True, text=True, check=True, env=env)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["threads"] == threads
    return float(out["seconds"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per setting (default 3)")
    ap.add_argument("--workloads", nargs="*", default=None,
                    help="only the workloads whose name starts with one of these (e.g. ch05)")
    ap.add_argument("--as-is-only", action="store_true",
                    help="measure the machine as it is, without the competing busy process")
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args(argv)
    workloads = {name: w for name, w in WORKLOADS.items()
                 if args.workloads is None or any(name.startswith(prefix) for prefix in args.workloads)}
    if not workloads:
        raise SystemExit(f"no workload starts with {args.workloads}; the workloads are {list(WORKLOADS)}")
    common.setup(1)
    rows: list[dict[str, Any]] = []
    for busy in ((False,) if args.as_is_only else (False, True)):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for name, workload in workloads.items():
                times: dict[tuple[int, str], list[float]] = {s: [] for s in SETTINGS}
                for _ in range(args.rounds):
                    for threads, wait in SETTINGS:
                        times[threads, wait].append(time_one(workload, threads, wait))
                for (threads, wait), values in times.items():
                    row = {"workload": name, "busy": busy, "threads": threads, "omp_wait": wait,
                           "median_s": round(statistics.median(values), 2), "load": common.load_average()}
                    rows.append(row)
                    print(f"{name:<26} {'busy' if busy else 'as is':<6} threads {threads} ({wait:>7}): "
                          f"{row['median_s']:6.2f} s", flush=True)
        finally:
            if hog is not None:
                hog.kill()
    for name in workloads:
        for busy in sorted({r["busy"] for r in rows}):
            best = min((r for r in rows if r["workload"] == name and r["busy"] == busy), key=lambda r: r["median_s"])
            print(f"fastest for {name}, {'busy' if busy else 'as is'}: {best['threads']} thread(s), {best['omp_wait']}")
    if not args.no_save:
        path = common.save_results(NAME, {"run": common.run_info(), "rows": rows})
        print(f"wrote {common.shown(path)}")


if __name__ == "__main__":
    main()
