"""Benchmark of attnbook.MultiHeadAttention against torch.nn.MultiheadAttention, both paths, in one run.

    python bench/bench_mha.py            # B=4, T=512, E=256, 8 heads, causal mask, 30 rounds (about 10 s)
    python bench/bench_mha.py --quick    # 7 rounds, a smoke test
    python bench/bench_mha.py --threads 0  # torch's default thread count

Dimension legend: B batch (4), T sequence length (512, = S), E model dim (256), H heads (8), S key length.

Both modules hold the same weights (``MultiHeadAttention.from_torch``), in eval mode, float32, on the CPU,
with a causal mask (attnbook's bool ``causal_mask(T)``, True = may attend; torch's ``attn_mask`` is its
negation, True = blocked). Four calls are timed together:

* the **weights path**: ``mha(x, mask=causal, need_weights=True)``, the explicit attention that returns the
  per-head weights ``(B, H, T, S)``, against ``nn.MultiheadAttention(x, x, x, attn_mask=~causal,
  need_weights=True, average_attn_weights=False)``; goal: time(torch) / time(attnbook) >= 1;
* the **fast path**: ``need_weights=False`` on both (attnbook calls ``F.scaled_dot_product_attention``);
  goal: time(torch) / time(attnbook) >= 2, i.e. the fused kernel's lead is kept (2.8x to 3.8x measured).

Before timing, the outputs and weights of the two modules are compared (max |difference| < 1e-4), so the
calls timed compute the same thing. Times are medians of interleaved rounds (every call once per round, so a
load spike on this shared machine hits all alike) after one warm-up call each, under ``torch.no_grad()``
(``attnbook.measure.time_calls``). Results are printed with PASS/MISS per goal and written to
bench/results/mha.json with ``attnbook.measure.machine_summary()``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import common  # first: puts the repository root on sys.path
import torch
import torch.nn as nn

from attnbook import MultiHeadAttention, causal_mask
from attnbook.measure import machine_summary, time_calls

NAME = "mha"  # bench/results/mha.json
B, T, E, H = 4, 512, 256, 8
CALLS = ("attnbook weights", "torch weights", "attnbook fast", "torch fast")
# ratio name -> (torch's call, attnbook's call, goal): time(torch) / time(attnbook) >= goal
GOALS = {
    "weights path (need_weights=True)": ("torch weights", "attnbook weights", 1.0),
    "fast path (need_weights=False)": ("torch fast", "attnbook fast", 2.0),
}
TOLERANCE = 1e-4  # max |difference| between the two modules' outputs and weights (float32)


def modules(seed: int = 0) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    """attnbook's module and torch's, in eval mode, with the same (random) weights."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(E, H, batch_first=True).eval()
    return MultiHeadAttention.from_torch(ref).eval(), ref


def calls(seed: int = 0) -> tuple[dict[str, Callable[[], object]], float]:
    """The four timed calls (:data:`CALLS`, name -> zero-argument callable) on one input ``(B, T, E)``, and
    the largest |difference| between the two modules' outputs and weights."""
    ours, ref = modules(seed)
    x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(seed + 1))  # (B, T, E)
    mask = causal_mask(T)  # (T, S) True = may attend
    blocked = ~mask  # (T, S) torch's attn_mask: True = blocked
    plan: dict[str, Callable[[], object]] = {
        "attnbook weights": lambda: ours(x, mask=mask, need_weights=True),
        "torch weights": lambda: ref(x, x, x, attn_mask=blocked, need_weights=True, average_attn_weights=False),
        "attnbook fast": lambda: ours(x, mask=mask, need_weights=False),
        "torch fast": lambda: ref(x, x, x, attn_mask=blocked, need_weights=False),
    }
    with torch.no_grad():
        out_w, w = ours(x, mask=mask, need_weights=True)  # (B, T, E), (B, H, T, S)
        ref_w, ref_weights = ref(x, x, x, attn_mask=blocked, need_weights=True, average_attn_weights=False)
        out_f, _ = ours(x, mask=mask, need_weights=False)  # (B, T, E)
        ref_f, _ = ref(x, x, x, attn_mask=blocked, need_weights=False)  # (B, T, E)
    assert w is not None and ref_weights is not None
    diff = max(float((a - b).abs().max()) for a, b in ((out_w, ref_w), (w, ref_weights), (out_f, ref_f)))
    return plan, diff


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke test)")
    common.add_threads_option(ap)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30, or 7 with --quick)")
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args(argv)

    common.setup(args.threads)
    repeats = args.repeats or (7 if args.quick else 30)
    load_start = common.load_average()
    print(f"{machine_summary()}; load average {load_start}", flush=True)
    print(f"B={B}, T={T}, E={E}, H={H}, float32, causal mask, eval, {repeats} interleaved rounds", flush=True)

    plan, diff = calls()
    if not diff < TOLERANCE:
        print(f"the two modules disagree: max |difference| {diff:.2e} >= {TOLERANCE:g}")
        return 1
    print(f"outputs and weights agree: max |difference| < {TOLERANCE:g}")
    t = time_calls(plan, repeats, slow_s=None, reduce="median")

    print()
    width = max(len(n) for n in GOALS)
    print(f"{'time(torch) / time(attnbook)':<{width}}  {'measured':>8}  {'goal':>6}  result")
    results: list[dict[str, Any]] = []
    for name, (theirs, ours, target) in GOALS.items():
        ratio = t[theirs] / t[ours]
        ok = common.verdict(ratio, ">=", target)
        note = f"{t[theirs] * 1e3:.1f} vs {t[ours] * 1e3:.1f} ms"
        print(f"{name:<{width}}  {ratio:>8.3f}  {'>= ' + format(target, 'g'):>6}  {common.pass_miss(ok)}  {note}")
        results.append({"ratio": f"{name}: time({theirs}) / time({ours})", "measured": round(ratio, 4),
                        "goal": f">= {target:g}", "pass": ok, "note": note})
    load_end = common.load_average()
    print(f"{sum(r['pass'] for r in results)} of {len(results)} goals met; load average {load_start} at the start, "
          f"{load_end} at the end")
    if args.quick:
        print("(--quick is a smoke test: fewer rounds, a noisier median)")

    if not args.no_save:
        payload = {
            "config": {
                "B": B, "T": T, "E": E, "H": H, "dtype": "float32", "mask": "causal", "quick": args.quick,
                "rounds": repeats, "statistic": "median of interleaved rounds",
                **common.run_info(),  # torch, threads, python, machine, cpus, date, machine_summary
                "load_average_start": load_start, "load_average_end": load_end,
            },
            "max_abs_difference": diff,
            "median_seconds": {name: round(t[name], 6) for name in CALLS},
            "ratios": results,
            "all_pass": all(r["pass"] for r in results),
        }
        out = common.save_results(NAME, payload)
        print(f"wrote {common.shown(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
