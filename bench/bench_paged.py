"""Benchmark of the paged KV cache (attnbook.kvcache's PagedKVCache, simulate_requests), measured in one run on the CPU.

    python bench/bench_paged.py              # the default stream's tables and the timings (well under a minute)
    python bench/bench_paged.py --no-save    # print only

Dimension legend: B batch (requests decoded together), H heads (8), Hkv key/value heads (2), S cached tokens
(the longest of the batch), D head dim (64).

1. Memory: :func:`attnbook.kvcache.simulate_requests` with its defaults (400 requests, prompts and outputs of
   16 .. 512 tokens, 32 decoded together, max_len 1024, a quarter of the requests on one 200-token prompt),
   one row per block size (8, 16, 32, 64, 128): positions held by the paged cache, peak and mean, against
   preallocating max_len per request; the waste in last blocks; the blocks saved by sharing the prompt. The
   numbers are counts (deterministic for the seed), not timings. Goal: each call takes < 1 s (median of 3).
2. One batched decoding step of B = 8 requests of 256 .. 1024 cached tokens (float32, GQA): the paged path
   (``gather_batch`` copies the blocks into padded tensors, then attention) against the same attention over
   preallocated, padded (B, Hkv, S, D) buffers (a static batch cache: a view, no copy). Medians of
   interleaved rounds (``attnbook.measure.time_calls``). Reported, no goal: on a CPU the gather is a copy
   of the whole cache every step, which vLLM's kernel avoids by reading the blocks in place.

Writes bench/results/paged.json with ``attnbook.measure.machine_summary()``; the exit status is 1 when a goal
is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common  # first: puts the repository root on sys.path
import torch

from attnbook import MultiHeadAttention, padding_mask
from attnbook.kvcache import BlockPool, PagedKVCache, simulate_requests
from attnbook.measure import machine_summary, time_calls

NAME = "paged"  # bench/results/paged.json
BLOCK_SIZES = (8, 16, 32, 64, 128)
GOAL_SIMULATE_S = 1.0  # seconds per simulate_requests call, at most
LENGTHS = (256, 384, 512, 640, 768, 896, 960, 1024)  # cached tokens of the 8 requests of the decoding step


def memory_table() -> tuple[list[dict[str, Any]], list[float]]:
    """simulate_requests' summary for each block size, and the median seconds of 3 calls of each."""
    rows, seconds = [], []
    for b in BLOCK_SIZES:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            row = simulate_requests(block_size=b)
            times.append(time.perf_counter() - start)
        rows.append(dict(row))
        seconds.append(sorted(times)[1])
    return rows, seconds


def print_tables(rows: list[dict[str, Any]], seconds: list[float]) -> None:
    r0 = rows[0]
    print(f"\n{r0['num_requests']} requests, {r0['batch_size']} decoded together, max_len {r0['max_len']}, "
          f"{r0['steps']} steps, {r0['mean_running']:.1f} running on average; positions (tokens)")
    print(f"{'block':>5} {'peak held':>10} {'mean held':>10} {'mean used':>10} {'prealloc mean':>14} "
          f"{'held/prealloc':>13} {'waste %':>8} {'waste/req':>10} {'s/call':>7}")
    for r, s in zip(rows, seconds):
        print(f"{r['block_size']:>5} {r['peak_held']:>10} {r['mean_held']:>10.0f} {r['mean_used']:>10.0f} "
              f"{r['mean_preallocated']:>14.0f} {r['mean_held'] / r['mean_preallocated']:>13.2f} "
              f"{100 * r['waste_fraction']:>8.1f} {r['waste_per_request']:>10.1f} {s:>7.3f}")
    print(f"\nprefix sharing: {r0['shared_requests']} requests found the common prompt cached")
    print(f"{'block':>5} {'peak held':>10} {'shared':>8} {'mean held':>10} {'shared':>8} {'blocks saved (mean)':>20} "
          f"{'hit tokens':>11} {'evictions':>10}")
    for r in rows:
        print(f"{r['block_size']:>5} {r['peak_held']:>10} {r['peak_held_shared']:>8} {r['mean_held']:>10.0f} "
              f"{r['mean_held_shared']:>8.0f} {r['saved_blocks_mean']:>20.1f} {r['hit_tokens']:>11} {r['evictions']:>10}")


def decode_step_calls() -> dict[str, Any]:
    """One batched decoding step, paged (gather_batch + attend) and over padded preallocated buffers."""
    g = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        mha = MultiHeadAttention(512, 8, num_kv_heads=2).eval()  # D = 64
    B, Hkv, D, S = len(LENGTHS), 2, 64, max(LENGTHS)
    pool = BlockPool(sum(-(-n // 16) for n in LENGTHS) + B, 16, Hkv, D)
    cache = PagedKVCache(pool)
    k_pad = torch.zeros(B, Hkv, S, D)  # (B, Hkv, S, D) the preallocated buffers, right-padded
    v_pad = torch.zeros(B, Hkv, S, D)
    for i, n in enumerate(LENGTHS):
        k, v = torch.randn(Hkv, n, D, generator=g), torch.randn(Hkv, n, D, generator=g)  # (Hkv, n, D)
        cache.add_sequence(i)
        cache.append(i, k, v)
        k_pad[i, :, :n], v_pad[i, :, :n] = k, v
    q = torch.randn(B, 8, 1, D, generator=g)  # (B, H, 1, D) one new query per request
    mask = padding_mask(list(LENGTHS))  # (B, 1, 1, S)
    ids = list(range(B))

    def paged() -> torch.Tensor:
        k_all, v_all, m = cache.gather_batch(ids)  # (B, Hkv, S, D): a copy out of the blocks
        return mha.attend(q, k_all, v_all, m, need_weights=False)[0]

    def static() -> torch.Tensor:
        return mha.attend(q, k_pad, v_pad, mask, need_weights=False)[0]

    with torch.no_grad():
        diff = float((paged() - static()).abs().max())
        times = time_calls({"paged": paged, "static": static}, rounds=15, slow_s=None, reduce="median")
    return {"diff": diff, "paged_s": times["paged"], "static_s": times["static"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    common.add_threads_option(ap)
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args(argv)
    common.setup(args.threads)
    load = common.load_average()
    print(f"{machine_summary()}; load average {load}", flush=True)
    rows, seconds = memory_table()
    print_tables(rows, seconds)
    step = decode_step_calls()
    print(f"\nbatched decoding step, B={len(LENGTHS)}, S <= {max(LENGTHS)}, H=8, Hkv=2, D=64, float32: paged "
          f"{step['paged_s'] * 1e6:.0f} us, preallocated {step['static_s'] * 1e6:.0f} us, ratio "
          f"{step['paged_s'] / step['static_s']:.2f} (outputs differ by {step['diff']:.1e})")
    worst = max(seconds)
    ok = common.verdict(worst, "<", GOAL_SIMULATE_S)
    print(f"{common.pass_miss(ok)}: simulate_requests takes {worst:.3f} s at most per call (goal < {GOAL_SIMULATE_S} s)")
    if not args.no_save:
        payload = {"run": common.run_info(), "load_average_end": common.load_average(), "rows": rows,
                   "simulate_seconds": dict(zip(map(str, BLOCK_SIZES), seconds)), "decode_step": step,
                   "goals": {"simulate_s_below": GOAL_SIMULATE_S, "pass": ok}}
        print(f"wrote {common.shown(common.save_results(NAME, payload))}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
