"""Benchmark of multi-head latent attention's two decoding paths (attnbook.latent), measured in one run on the CPU.

    python bench/bench_latent.py            # S = 256, 1024, 4096 (well under a minute)
    python bench/bench_latent.py --quick    # S = 64, 256, 1024, a smoke test
    python bench/bench_latent.py --threads 0  # torch's default thread count

Dimension legend: B batch (1), H heads (16), S cached tokens, E model dim (2048), Dn / Dr / Dv the per-head
no-position, RoPE and value widths (128, 64, 128), Dc the latent width (512).

The layer (:data:`CONFIG`) has DeepSeek-V2-Lite's attention sizes (deepseek-ai/DeepSeek-V2-Lite's
config.json: hidden_size 2048, 16 heads, no query compression, kv_lora_rank 512, qk_nope_head_dim 128,
qk_rope_head_dim 64, v_head_dim 128), float32, random weights. One decoding step is
``mla(x_new (1, 1, E), cache=cache, absorb=...)`` over a :class:`attnbook.latent.LatentKVCache` holding S
tokens, preallocated (``max_len``), so that a step writes one row and copies nothing else; the cache is
filled with random rows (the content does not change the arithmetic) and rewound with ``truncate(S)`` after
each step. The two paths:

* naive: re-expand the whole cache through ``kv_b_proj`` into per-head keys and values every step,
  ``S * Dc * H * (Dn + Dv)`` multiply-adds (S = 4096: 8.6e9), then attend;
* absorbed: fold W_UK into the query and W_UV into the output, then attend over the ``Dc + Dr`` rows:
  about ``S * H * (2 Dc + Dr)`` multiply-adds (S = 4096: 7.5e7), plus the projections, which do not grow with S.

Times are medians of interleaved rounds (both paths at every S once per round, so a load spike on this
shared machine hits all alike) after one warm-up call each, under ``torch.no_grad()``
(``attnbook.measure.time_calls``). Goal: the absorbed step is faster than the naive one at every S (ratio
naive / absorbed > 1) and at least 10x faster at the largest S. The two paths' outputs are compared too
(largest difference, float32). Results are printed with PASS/MISS per goal and written to
bench/results/latent.json with ``attnbook.measure.machine_summary()``; the exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import common  # first: puts the repository root on sys.path
import torch

from attnbook.latent import LatentKVCache, MultiHeadLatentAttention, mla_cache_elements_per_token
from attnbook.measure import machine_summary, time_calls

NAME = "latent"  # bench/results/latent.json
RESULTS = common.results_path(NAME)
CONFIG: dict[str, Any] = {"d_model": 2048, "num_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
                          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}  # DeepSeek-V2-Lite's
S_VALUES = (256, 1024, 4096)
S_VALUES_QUICK = (64, 256, 1024)
GOAL_EVERY_S = 1.0  # naive / absorbed > this at every S
GOAL_LARGEST_S = 10.0  # ... and >= this at the largest S
PATHS = ("naive", "absorbed")


def build_layer() -> MultiHeadLatentAttention:
    """The benchmarked layer (:data:`CONFIG`), float32, eval mode, weights drawn from a fixed seed."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return MultiHeadLatentAttention(**CONFIG).eval()


def filled_cache(mla: MultiHeadLatentAttention, S: int) -> LatentKVCache:
    """A preallocated :class:`attnbook.latent.LatentKVCache` for S + 1 tokens, holding S random rows
    ``[c_kv | k_rope]`` (unit-scale, as after the RMSNorm)."""
    g = torch.Generator().manual_seed(S)
    cache = LatentKVCache(max_len=S + 1)
    cache.append(torch.randn(1, S, mla.kv_lora_rank, generator=g),  # (B, S, Dc)
                 torch.randn(1, S, mla.qk_rope_head_dim, generator=g))  # (B, S, Dr)
    return cache


def step_calls(mla: MultiHeadLatentAttention, s_values: Sequence[int]
               ) -> tuple[dict[tuple[str, int], Callable[[], torch.Tensor]], dict[int, float]]:
    """``(path, S) -> one decoding step`` (the cache rewound after it), and the largest difference between
    the two paths' outputs at each S."""
    x = torch.randn(1, 1, mla.d_model, generator=torch.Generator().manual_seed(1))  # (B, T=1, E) the new token
    calls: dict[tuple[str, int], Callable[[], torch.Tensor]] = {}
    diffs: dict[int, float] = {}
    for S in s_values:
        outs = []
        for path in PATHS:
            cache = filled_cache(mla, S)

            def step(cache: LatentKVCache = cache, absorb: bool = (path == "absorbed"), S: int = S) -> torch.Tensor:
                out, _ = mla(x, cache=cache, absorb=absorb)  # (B, T=1, E)
                cache.truncate(S)
                return out

            with torch.no_grad():
                outs.append(step())
            calls[(path, S)] = step
        diffs[S] = float((outs[0] - outs[1]).abs().max())
    return calls, diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="S = 64, 256, 1024 (a smoke test)")
    common.add_threads_option(ap)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7, or 3 with --quick)")
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args(argv)

    common.setup(args.threads)
    s_values = S_VALUES_QUICK if args.quick else S_VALUES
    repeats = args.repeats or (3 if args.quick else 7)
    load = common.load_average()
    summary = machine_summary()
    print(f"{summary}; load average {load}", flush=True)
    print(f"MLA decoding step, DeepSeek-V2-Lite's attention sizes {CONFIG}, B=1, float32, S = {list(s_values)}, "
          f"{repeats} interleaved rounds", flush=True)
    start = time.perf_counter()
    mla = build_layer()
    calls, diffs = step_calls(mla, s_values)
    times = time_calls(calls, repeats, slow_s=None, reduce="median")
    seconds = {path: {S: times[(path, S)] for S in s_values} for path in PATHS}
    ratios = {S: seconds["naive"][S] / seconds["absorbed"][S] for S in s_values}

    print()
    print(f"{'S':>6}  {'naive ms':>9}  {'absorbed ms':>11}  {'naive / absorbed':>16}  max |diff|")
    for S in s_values:
        print(f"{S:>6}  {seconds['naive'][S] * 1e3:>9.2f}  {seconds['absorbed'][S] * 1e3:>11.2f}  {ratios[S]:>16.1f}  "
              f"{diffs[S]:.1e}")
    s_large = max(s_values)
    goals = [(f"time(naive) / time(absorbed) at every S = {list(s_values)}", min(ratios.values()), ">", GOAL_EVERY_S),
             (f"time(naive) / time(absorbed) at S = {s_large}", ratios[s_large], ">=", GOAL_LARGEST_S)]
    print()
    results: list[dict[str, Any]] = []
    for name, value, op, target in goals:
        ok = common.verdict(value, op, target)
        print(f"{name}: {value:.1f} (goal {op} {target:g}) {common.pass_miss(ok)}")
        results.append({"ratio": name, "measured": round(value, 2), "goal": f"{op} {target:g}", "pass": ok})
    elements = mla_cache_elements_per_token({**{k: v for k, v in CONFIG.items() if k != "d_model"},
                                             "num_attention_heads": CONFIG["num_heads"], "num_hidden_layers": 1})
    print(f"cache per token and layer: {elements['mla']} numbers (MLA) vs {elements['mha_expanded']} for this layer's "
          f"expanded keys and values ({elements['mha_expanded'] / elements['mla']:.1f}x)")
    end_load = common.load_average()
    print(f"{sum(r['pass'] for r in results)} of {len(results)} goals met in {time.perf_counter() - start:.0f} s; "
          f"load average {load} at the start, {end_load} at the end")
    if args.quick:
        print("(--quick is a smoke test: the goals are set for S up to 4096)")

    if not args.no_save:
        payload = {
            "config": {
                "layer": CONFIG, "batch": 1, "dtype": "float32", "S": list(s_values), "quick": args.quick,
                "rounds": repeats, "statistic": "median of interleaved rounds",
                **common.run_info(),  # torch, threads, python, machine, cpus, date, machine_summary
                "load_average": load, "load_average_end": end_load,
            },
            "median_seconds": {path: {str(S): round(t, 6) for S, t in series.items()} for path, series in seconds.items()},
            "ratio_naive_over_absorbed": {str(S): round(r, 3) for S, r in ratios.items()},
            "max_abs_diff": {str(S): d for S, d in diffs.items()},
            "cache_elements_per_token": elements,
            "goals": results,
        }
        common.save_results(NAME, payload)
        print(f"wrote {common.shown(RESULTS)}")
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
