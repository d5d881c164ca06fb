"""Chapter 11's Vision Transformer: accuracy and training time on scikit-learn's digits, three seeds.

Goal (issue 15): a 2-layer, 4-head ViT with 2x2 patches trained on a CPU (one thread) to >= 97% test
accuracy on the held-out quarter of the 1,797 digits in under 30 s of training wall time. The baseline is
chapter 11's perceptron with the same parameter count, trained with the same recipe. Also times the three
forms of ``attnbook.efficient.decayed_linear_attention`` against T (chunkwise should grow linearly).

    .venv/bin/python bench/bench_vit.py            # three seeds, about a minute and a half
    .venv/bin/python bench/bench_vit.py --seeds 1  # one seed
    .venv/bin/python bench/bench_vit.py --seeds 1 --no-save  # a smoke test: bench/results/vit.json stays

Prints a table with PASS/MISS and writes bench/results/vit.json. Needs scikit-learn. Other processes on the
machine inflate the times (the load average is recorded alongside).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import common  # first: puts the repository root on sys.path

from attnbook.efficient import decayed_linear_attention, make_inputs
from attnbook.measure import machine_summary, time_calls
from attnbook.vision import (
    MLPClassifier,
    VisionTransformer,
    accuracy,
    fit_images,
    load_digits_split,
    mlp_hidden_for,
    n_params,
)

# the recipe and model of chapter 11 (keep in sync with chapters/11_beyond_text.md)
RECIPE: dict[str, Any] = dict(epochs=60, batch_size=32, lr=2e-3, weight_decay=0.1)
VIT: dict[str, Any] = dict(image_size=8, patch=2, d_model=32, num_heads=4, num_layers=2, dim_feedforward=96)
ACCURACY_GOAL, TIME_GOAL_S = 0.97, 30.0
NAME = "vit"  # bench/results/vit.json


def train_one(seed: int) -> dict[str, Any]:
    import torch

    x_tr, y_tr, x_te, y_te = load_digits_split()
    torch.manual_seed(seed)
    vit = VisionTransformer(**VIT)
    start = time.perf_counter()
    fit_images(vit, x_tr, y_tr, seed=seed, **RECIPE)
    seconds = time.perf_counter() - start
    torch.manual_seed(seed)
    mlp = MLPClassifier(hidden=mlp_hidden_for(n_params(vit)))
    start = time.perf_counter()
    fit_images(mlp, x_tr, y_tr, seed=seed, **RECIPE)
    mlp_seconds = time.perf_counter() - start
    return {"seed": seed, "vit_accuracy": accuracy(vit, x_te, y_te), "vit_seconds": seconds,
            "mlp_accuracy": accuracy(mlp, x_te, y_te), "mlp_seconds": mlp_seconds,
            "vit_params": n_params(vit), "mlp_params": n_params(mlp)}


def decayed_costs(Ts: tuple[int, ...] = (512, 1024, 2048, 4096)) -> dict[str, list[float]]:
    costs: dict[str, list[float]] = {m: [] for m in ("parallel", "recurrent", "chunkwise")}
    for T in Ts:
        q, k, v = make_inputs(T, batch_size=1, num_heads=4, head_dim=32)
        calls = {m: (lambda m=m, q=q, k=k, v=v: decayed_linear_attention(q, k, v, 0.9, method=m)) for m in costs}
        for m, s in time_calls(calls, rounds=3).items():
            costs[m].append(s)
    return costs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    common.add_no_save_option(parser, NAME)
    args = parser.parse_args(argv)
    common.setup(1)
    runs = [train_one(seed) for seed in range(args.seeds)]
    print(machine_summary(), "(one thread), load average", os.getloadavg())
    print(f"{'seed':>4} | {'ViT acc':>7} {'time s':>7} | {'MLP acc':>7} {'time s':>7}")
    for r in runs:
        print(f"{r['seed']:>4} | {r['vit_accuracy']:7.3f} {r['vit_seconds']:7.1f} | "
              f"{r['mlp_accuracy']:7.3f} {r['mlp_seconds']:7.1f}")
    accs = [r["vit_accuracy"] for r in runs]
    times = [r["vit_seconds"] for r in runs]
    ok_acc, ok_time = min(accs) >= ACCURACY_GOAL, max(times) < TIME_GOAL_S
    print(f"ViT accuracy min {min(accs):.3f}, max {max(accs):.3f} (goal >= {ACCURACY_GOAL}): "
          f"{common.pass_miss(ok_acc)}")
    print(f"ViT training time median {statistics.median(times):.1f} s (goal < {TIME_GOAL_S:.0f} s): "
          f"{common.pass_miss(ok_time)}")
    Ts = (512, 1024, 2048, 4096)
    costs = decayed_costs(Ts)
    growth = {m: c[-1] / c[0] for m, c in costs.items()}
    print(f"decayed linear attention, time(T={Ts[-1]}) / time(T={Ts[0]}) (linear: {Ts[-1] // Ts[0]}, "
          f"quadratic: {(Ts[-1] // Ts[0]) ** 2}): " + ", ".join(f"{m} {g:.1f}" for m, g in growth.items()))
    print(f"chunkwise grows at most linearly-ish (< {2 * Ts[-1] // Ts[0]}x): "
          f"{common.pass_miss(growth['chunkwise'] < 2 * Ts[-1] // Ts[0])}")
    if not args.no_save:
        out = common.save_results(NAME, {"machine": machine_summary(), "load_average": os.getloadavg(), "runs": runs,
                                         "decayed_T": list(Ts), "decayed_seconds": costs}, indent=1)
        print("wrote", common.shown(out))


if __name__ == "__main__":
    main()
