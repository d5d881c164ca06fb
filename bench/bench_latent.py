"""Benchmark of multi-head latent attention's three decoding forms (attnbook.latent), measured in one run on the CPU.

    python bench/bench_latent.py            # S = 256, 1024, 4096 (about a minute)
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
each step. The three forms (:data:`attnbook.latent.MLA_FORMS`, counted by :func:`attnbook.latent.mla_step_cost`):

* naive (``absorb=False`` over the latent cache; Hugging Face's ``DeepseekV3Attention``): re-expand the whole
  cache through ``kv_b_proj`` into per-head keys and values every step, ``S * Dc * H * (Dn + Dv)``
  multiply-adds (S = 4096: 8.6e9), then attend;
* expanded (a :class:`attnbook.StaticKVCache` of per-head keys and values, preallocated the same way and
  filled with the expansion of the same random rows; DeepSeek-V3's ``attn_impl="naive"``): expand only the
  new token and attend over the cached ``H * (Dn + Dr + Dv)`` numbers per token, ``S * H * (D + Dv)``
  multiply-adds (S = 4096: 2.1e7), reading 5120 numbers per cached token;
* absorbed: fold W_UK into the query and W_UV into the output, then attend over the ``Dc + Dr`` rows:
  about ``S * H * (2 Dc + Dr)`` multiply-adds (S = 4096: 7.1e7, more than expanded), plus the projections,
  which do not grow with S, reading 576 numbers per cached token.

Times are medians of interleaved rounds (the three forms at every S once per round, so a load spike on this
shared machine hits all alike) after one warm-up call each, under ``torch.no_grad()``
(``attnbook.measure.time_calls``), reported as the ratios naive / absorbed, naive / expanded and
expanded / absorbed. Goals: the absorbed step is faster than the naive one at every S (naive / absorbed > 1)
and at least 10x faster at the largest S; the expanded step is faster than the naive one at every S (it
expands one token, not S). The three outputs are compared with the naive one (largest difference, float32).
Results are printed with PASS/MISS per goal and written to bench/results/latent.json with
``attnbook.measure.machine_summary()``; the exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import common  # first: puts the repository root on sys.path
import torch

from attnbook import StaticKVCache
from attnbook.latent import MLA_FORMS, LatentKVCache, MultiHeadLatentAttention, mla_cache_elements_per_token
from attnbook.measure import machine_summary, time_calls

NAME = "latent"  # bench/results/latent.json
RESULTS = common.results_path(NAME)
CONFIG: dict[str, Any] = {"d_model": 2048, "num_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
                          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}  # DeepSeek-V2-Lite's
S_VALUES = (256, 1024, 4096)
S_VALUES_QUICK = (64, 256, 1024)
GOAL_EVERY_S = 1.0  # naive / absorbed > this at every S
GOAL_LARGEST_S = 10.0  # ... and >= this at the largest S
GOAL_EXPANDED = 1.0  # naive / expanded > this at every S
PATHS = MLA_FORMS  # ("naive", "expanded", "absorbed")
RATIOS = (("naive", "absorbed"), ("naive", "expanded"), ("expanded", "absorbed"))  # time(a) / time(b)


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


def filled_expanded_cache(mla: MultiHeadLatentAttention, S: int) -> StaticKVCache:
    """A preallocated :class:`attnbook.StaticKVCache` for S + 1 tokens holding the same S tokens as
    :func:`filled_cache`, expanded: keys ``[W_UK c_kv | k_rope] (B, H, S, Dn + Dr)`` and values
    ``W_UV c_kv (B, H, S, Dv)``, what the expanded form caches."""
    latent = filled_cache(mla, S)
    assert latent.c_kv is not None and latent.k_rope is not None
    B, H = 1, mla.num_heads
    with torch.no_grad():
        k_nope, v = mla.expand(latent.c_kv)  # (B, H, S, Dn), (B, H, S, Dv)
        k = torch.cat([k_nope, latent.k_rope[:, None].expand(B, H, S, mla.qk_rope_head_dim)], dim=-1)  # (B, H, S, D)
    cache = StaticKVCache(S + 1)
    cache.append(k, v)
    return cache


def step_calls(mla: MultiHeadLatentAttention, s_values: Sequence[int]
               ) -> tuple[dict[tuple[str, int], Callable[[], torch.Tensor]], dict[int, float]]:
    """``(path, S) -> one decoding step`` (the cache rewound after it), and the largest difference between
    each path's output and the naive one at each S (``{path: {S: max |diff|}}``, naive left out)."""
    x = torch.randn(1, 1, mla.d_model, generator=torch.Generator().manual_seed(1))  # (B, T=1, E) the new token
    calls: dict[tuple[str, int], Callable[[], torch.Tensor]] = {}
    diffs: dict[str, dict[int, float]] = {path: {} for path in PATHS if path != "naive"}
    for S in s_values:
        outs = {}
        for path in PATHS:
            cache: LatentKVCache | StaticKVCache = (filled_expanded_cache(mla, S) if path == "expanded"
                                                    else filled_cache(mla, S))

            def step(cache: LatentKVCache | StaticKVCache = cache, absorb: bool = (path == "absorbed"),
                     S: int = S) -> torch.Tensor:
                out, _ = mla(x, cache=cache, absorb=absorb)  # (B, T=1, E)
                cache.truncate(S)
                return out

            with torch.no_grad():
                outs[path] = step()
            calls[(path, S)] = step
        for path in diffs:
            diffs[path][S] = float((outs[path] - outs["naive"]).abs().max())
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
    ratios = {f"{a}/{b}": {S: seconds[a][S] / seconds[b][S] for S in s_values} for a, b in RATIOS}

    print()
    print(f"{'S':>6}  " + "  ".join(f"{path + ' ms':>11}" for path in PATHS) + "  "
          + "  ".join(f"{name:>17}" for name in ratios) + "  max |diff| vs naive (expanded, absorbed)")
    for S in s_values:
        print(f"{S:>6}  " + "  ".join(f"{seconds[path][S] * 1e3:>11.2f}" for path in PATHS) + "  "
              + "  ".join(f"{r[S]:>17.1f}" for r in ratios.values()) + "  "
              + ", ".join(f"{diffs[path][S]:.1e}" for path in diffs))
    s_large = max(s_values)
    over_absorbed, over_expanded = ratios["naive/absorbed"], ratios["naive/expanded"]
    goals = [(f"time(naive) / time(absorbed) at every S = {list(s_values)}", min(over_absorbed.values()), ">",
              GOAL_EVERY_S),
             (f"time(naive) / time(absorbed) at S = {s_large}", over_absorbed[s_large], ">=", GOAL_LARGEST_S),
             (f"time(naive) / time(expanded) at every S = {list(s_values)}", min(over_expanded.values()), ">",
              GOAL_EXPANDED)]
    print()
    results: list[dict[str, Any]] = []
    for name, value, op, target in goals:
        ok = common.verdict(value, op, target)
        print(f"{name}: {value:.1f} (goal {op} {target:g}) {common.pass_miss(ok)}")
        results.append({"ratio": name, "measured": round(value, 2), "goal": f"{op} {target:g}", "pass": ok})
    elements = mla_cache_elements_per_token({**{k: v for k, v in CONFIG.items() if k != "d_model"},
                                             "num_attention_heads": CONFIG["num_heads"], "num_hidden_layers": 1})
    print(f"cache per token and layer: {elements['mla']} numbers (MLA, naive and absorbed) vs {elements['mha_expanded']} "
          f"for this layer's expanded keys and values ({elements['mha_expanded'] / elements['mla']:.1f}x)")
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
            "ratios": {name: {str(S): round(r, 3) for S, r in series.items()} for name, series in ratios.items()},
            "max_abs_diff_vs_naive": {path: {str(S): d for S, d in series.items()} for path, series in diffs.items()},
            "cache_elements_per_token": elements,
            "goals": results,
        }
        common.save_results(NAME, payload)
        print(f"wrote {common.shown(RESULTS)}")
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
