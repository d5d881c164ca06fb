"""Train tiny transformers on the toy tasks and check the goals.

Goals (2-core CPU, torch's default thread count): copy and reverse at >= 99%
whole-sequence accuracy, 3-digit addition at >= 95%, each in under 60 s of
training wall time; the best head's attention should sit on the expected
source positions (diagonal, anti-diagonal, same-place digits).

    .venv/bin/python bench/bench_tasks.py            # the three goal tasks
    .venv/bin/python bench/bench_tasks.py --extra    # also sort and a decoder-only adder

Prints a table and writes bench/results/tasks.json. Time is the wall time of
``attnbook.train.fit`` (its periodic evaluations included); accuracy is then
measured on 2000 held-out sources. Other processes on the machine inflate the
times (the load average is recorded alongside).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # first: puts the repository root on sys.path

from attnbook.tasks import (
    DecoderOnlyTransformer,
    Seq2SeqTransformer,
    Task,
    addition_task,
    copy_task,
    reverse_task,
    sort_task,
)
from attnbook.train import attention_alignment, evaluate, fit

NAME = "tasks"  # bench/results/tasks.json

TIME_LIMIT_S = 60.0
COMMON = dict(batch_size=64, lr=3e-3, warmup=20, clip_grad=1.0)
SMALL_S2S = dict(d_model=64, num_heads=4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=256)

# name -> (task, model class, model kwargs, fit kwargs, accuracy goal or None)
CONFIGS = {
    "copy": (
        lambda: copy_task(length=10, num_symbols=10),
        Seq2SeqTransformer,
        SMALL_S2S,
        dict(COMMON, steps=150),
        0.99,
    ),
    "reverse": (
        lambda: reverse_task(length=10, num_symbols=10),
        Seq2SeqTransformer,
        SMALL_S2S,
        dict(COMMON, steps=150),
        0.99,
    ),
    "addition": (lambda: addition_task(num_digits=3), Seq2SeqTransformer, SMALL_S2S, dict(COMMON, steps=1000), 0.95),
}
EXTRA = {
    "sort": (lambda: sort_task(length=8, num_symbols=10), Seq2SeqTransformer, SMALL_S2S, dict(COMMON, steps=500), None),
    "addition (decoder-only)": (
        lambda: addition_task(num_digits=3),
        DecoderOnlyTransformer,
        dict(d_model=64, num_heads=4, num_layers=2, dim_feedforward=256),
        dict(COMMON, steps=1200),
        None,
    ),
}


def run_one(name: str, make_task: Callable[[], Task], model_cls: Any, model_kw: dict[str, Any],
            fit_kw: dict[str, Any], goal: float | None, seed: int, progress: bool) -> dict[str, Any]:
    import torch

    task = make_task()
    torch.manual_seed(seed)
    model = model_cls(task.vocab, **model_kw)
    params = sum(p.numel() for p in model.parameters())
    hist = fit(
        model, task, device="cpu", seed=seed, progress=progress, eval_every=max(1, fit_kw["steps"] // 4), **fit_kw
    )
    acc = evaluate(model, task, n=2000, seed=10_000 + seed)
    align = attention_alignment(model, task, n=512)
    ok = goal is None or (acc >= goal and hist.seconds < TIME_LIMIT_S)
    return {
        "task": name,
        "description": task.description,
        "model": model_cls.__name__,
        "model_kwargs": model_kw,
        "params": params,
        "fit_kwargs": fit_kw,
        "src_len": task.src_len,
        "tgt_len": task.tgt_len,
        "train_seconds": round(hist.seconds, 2),
        "accuracy": acc,
        "goal_accuracy": goal,
        "status": "-" if goal is None else ("PASS" if ok else "MISS"),
        "best_head": {"layer": align.layer, "head": align.head, "share": round(align.score, 4)},
        "alignment_scores": [[round(x, 4) for x in row] for row in align.scores.tolist()],
        "history": {"step": hist.step, "loss": [round(x, 5) for x in hist.loss], "accuracy": hist.accuracy},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extra", action="store_true", help="also run sort and a decoder-only adder (no goals)")
    ap.add_argument("--only", nargs="*", help="run only these task names")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--progress", action="store_true", help="show tqdm bars")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's default, the goals' setting)")
    ap.add_argument("--out", default=str(common.results_path(NAME)), help="where to write the results")
    args = ap.parse_args(argv)
    torch = common.setup(args.threads)

    configs = dict(CONFIGS, **(EXTRA if args.extra else {}))
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only}
    load_before = os.getloadavg()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.2f}"
    )
    rows = []
    header = f"{'task':<24} {'model':<22} {'params':>7} {'steps':>5} {'time s':>7} {'accuracy':>8} {'goal':>5}  {'status':<6} best head (share)"
    print(header)
    print("-" * len(header))
    for name, (make_task, model_cls, model_kw, fit_kw, goal) in configs.items():
        r = run_one(name, make_task, model_cls, model_kw, fit_kw, goal, args.seed, args.progress)
        rows.append(r)
        b = r["best_head"]
        goal_s = "-" if goal is None else f"{goal:.2f}"
        print(
            f"{name:<24} {r['model']:<22} {r['params']:>7} {fit_kw['steps']:>5} {r['train_seconds']:>7.1f} "
            f"{r['accuracy']:>8.4f} {goal_s:>5}  {r['status']:<6} L{b['layer']} H{b['head']} ({b['share']:.3f})",
            flush=True,
        )
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f}; time limit {TIME_LIMIT_S:.0f} s per task")
    result = {
        **common.run_info(),  # torch, threads, python, machine, cpus, date, machine_summary
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "time_limit_s": TIME_LIMIT_S,
        "seed": args.seed,
        "results": rows,
    }
    out = common.save_results(NAME, result, Path(args.out))
    print(f"wrote {common.shown(out)}")
    return 0 if all(r["status"] != "MISS" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
