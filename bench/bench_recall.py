"""Associative recall with softmax, linear, additive and delta-rule attention: the sweep chapter 13.3 plots.

Every configuration trains three seeds together (``attnbook.recall.recall_curves``) and records each seed's
held-out accuracy (1,000 sequences) at several steps, so the chapter can show accuracy against steps and say
where it stopped improving. Three groups, in this order:

* ``curves``: the pre-paired single-query task (chapter 11's) at N = 16 and 64 pairs, 2 heads of D = 16, the
  four kinds (and at N = 16 the delta rule whose query does not write, ``query_writes=False``), 4,800 steps
  (softmax, at 1.000 well before, 1,600);
* ``mqar``: Zoology's multi-query task, N = 16 pairs and 8 queries, the same five models, 1,600 steps
  (softmax 800);
* ``sizes``: the additive control and the delta rule at N = 4 and 16 and head dims 8, 16, 32 (2 heads, a
  D x D state each), 1,600 steps (N = 16 at D = 16 is the ``curves`` run, read at step 1,600).

    .venv/bin/python bench/bench_recall.py              # everything, two worker processes (2.7 hours of one core; about 1.5 hours on a busy 2-core CPU)
    .venv/bin/python bench/bench_recall.py --only curves --jobs 1
    .venv/bin/python bench/bench_recall.py --only curves --num-pairs 64 --kind linear,delta   # some again

Writes ``bench/results/recall.json`` after each configuration (a partial sweep is kept; a run restricted by
``--only``, ``--num-pairs`` or ``--kind`` replaces only the configurations it ran and keeps the file's others): ``{"runs": [{"group",
"task", "kind", "query_writes", "num_pairs", "num_queries", "head_dim", "steps", "curve": {step: {seed: acc}},
"seconds"}, ...]}`` plus where it ran. One torch thread per worker: the same rounding as the chapter's live
runs, which retrain a few of these configurations and compare.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import common  # first: puts the repository root on sys.path

NAME = "recall"  # bench/results/recall.json
SEEDS = (0, 1, 2)
EVAL_SIZE = 1000
LONG = (0, 100, 200, 400, 800, 1200, 1600)  # eval steps of the 1,600-step runs
LONGER = LONG + (2400, 3200, 4000, 4800)  # of the 4,800-step runs (the fixed-size states)
SHORT = (0, 200, 400, 800)  # of the 800-step runs (softmax's MQAR)


def configs() -> list[dict[str, Any]]:
    """Every configuration of the sweep, in the order they are run."""
    five = [("softmax", True), ("linear", True), ("additive", True), ("delta", True), ("delta", False)]
    out: list[dict[str, Any]] = []
    for n in (16, 64):
        for kind, writes in five if n == 16 else five[:4]:
            at = LONG if kind == "softmax" else LONGER  # softmax is at 1.000 long before 1,600 steps
            out.append({"group": "curves", "task": "pairs", "kind": kind, "query_writes": writes, "num_pairs": n,
                        "num_queries": 1, "head_dim": 16, "steps": at[-1], "eval_at": at})
    for kind, writes in five:
        at = SHORT if kind == "softmax" else LONG
        out.append({"group": "mqar", "task": "mqar", "kind": kind, "query_writes": writes, "num_pairs": 16,
                    "num_queries": 8, "head_dim": 16, "steps": at[-1], "eval_at": at})
    for n in (4, 16):
        for d in (8, 16, 32):
            if d == 16 and n != 4:
                continue  # in "curves"
            for kind in ("additive", "delta"):
                out.append({"group": "sizes", "task": "pairs", "kind": kind, "query_writes": True, "num_pairs": n,
                            "num_queries": 1, "head_dim": d, "steps": LONG[-1], "eval_at": LONG})
    return out


def _key(cfg: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one configuration from another (the steps are not part of it: a longer run replaces)."""
    return tuple(cfg[k] for k in ("group", "task", "kind", "query_writes", "num_pairs", "num_queries", "head_dim"))


def run_one(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train one configuration's seeds (one torch thread) and return its record."""
    common.setup(1)
    from attnbook.recall import recall_curves

    start = time.perf_counter()
    curve = recall_curves(cfg["kind"], cfg["num_pairs"], cfg["steps"], task=cfg["task"], seeds=SEEDS,
                          eval_at=cfg["eval_at"], num_queries=cfg["num_queries"], head_dim=cfg["head_dim"],
                          query_writes=cfg["query_writes"], eval_size=EVAL_SIZE, threads=1)
    record = {k: v for k, v in cfg.items() if k != "eval_at"}
    record["curve"] = {str(step): {str(s): round(a, 4) for s, a in accs.items()} for step, accs in curve.items()}
    record["seconds"] = round(time.perf_counter() - start, 1)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--only", choices=("curves", "mqar", "sizes"), help="run one group")
    ap.add_argument("--out", help="write the results here instead of bench/results/recall.json")
    ap.add_argument("--num-pairs", type=int, help="run only the configurations with this many pairs")
    ap.add_argument("--kind", help="run only the configurations of these kinds of attention (comma-separated)")
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args()
    todo = [c for c in configs() if (args.only is None or c["group"] == args.only)
            and (args.num_pairs is None or c["num_pairs"] == args.num_pairs)
            and (args.kind is None or c["kind"] in args.kind.split(","))]
    if not todo:
        raise SystemExit("no configuration matches --only/--num-pairs/--kind")
    kept: list[dict[str, Any]] = []
    path = Path(args.out) if args.out else common.results_path(NAME)
    if len(todo) < len(configs()) and path.exists():  # a partial rerun keeps the file's other configurations
        import json
        ran = {_key(c) for c in todo}
        kept = [r for r in json.loads(path.read_text())["runs"] if _key(r) not in ran]
    payload: dict[str, Any] = {"seeds": list(SEEDS), "eval_size": EVAL_SIZE, "batch_size": 64, "lr": 3e-3,
                               "load_average": common.load_average(), **common.run_info(), "runs": list(kept)}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, c) for c in todo]
        for fut in as_completed(futures):
            rec = fut.result()
            payload["runs"].append(rec)
            last = rec["curve"][str(rec["steps"])]
            print(f"{rec['group']:6s} {rec['task']:5s} {rec['kind']:8s} writes={rec['query_writes']!s:5s} "
                  f"N={rec['num_pairs']:2d} D={rec['head_dim']:2d}: " + " ".join(f"{a:.3f}" for a in last.values())
                  + f" ({rec['seconds']:.0f} s)", flush=True)
            if not args.no_save:
                common.save_results(NAME, payload, args.out)
    if not args.no_save:
        print(f"wrote {common.shown(Path(args.out) if args.out else common.results_path(NAME))}")


if __name__ == "__main__":
    main()
