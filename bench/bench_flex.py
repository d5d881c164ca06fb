"""Benchmark of FlexAttention on the CPU: eager and compiled, against attnbook's dense path and PyTorch's SDPA.

    python bench/bench_flex.py            # T = 1024, 2048: eager and torch.compile (a few minutes, mostly compiling)
    python bench/bench_flex.py --quick    # T = 256, 512: eager only, a smoke test (under a minute)
    python bench/bench_flex.py --threads 0  # torch's default thread count

Dimension legend: B batch (1), H heads (2), T sequence length (= S), D head dim (32).

Three mask programs (:data:`PROGRAMS`): every pair allowed (``full``: no block skipped, so compiled flex
against SDPA measures the kernel, not the skipping), and :mod:`attnbook.masks`' causal and causal sliding
window of :data:`WINDOW` keys back, each at every T of :data:`T_VALUES`, float32, one thread, under ``torch.no_grad()``.
The calls, timed together (medians of interleaved rounds after a warm-up call, ``attnbook.measure.time_calls``):

* ``dense``: ``attnbook.scaled_dot_product_attention`` with the program's dense bool mask (``dense_mask``);
* ``sdpa``: ``F.scaled_dot_product_attention``, no mask for full, ``is_causal=True`` for causal, the dense
  bool mask for the sliding window (SDPA has no sliding-window flag);
* ``flex eager``: ``flex_attention(q, k, v, block_mask=...)`` without ``torch.compile`` (the block mask made
  once, outside the timing): unfused, it materialises the (T, S) scores and skips no tile;
* ``flex compiled``: ``torch.compile(flex_attention, dynamic=False)`` on the same block mask (not with
  ``--quick``). Its first call per (program, T) compiles a kernel: that time is printed and stored
  separately (``compile_seconds``) and kept out of the medians, with the state of the compile cache it
  found (``compile_cache``: inductor's FX graph cache hits and misses in this run, "warm" or "cold").

Printed and stored: the medians, the ratios flex eager / dense, flex eager / SDPA and flex compiled / SDPA,
the share of 128 x 128 tiles the block mask skips (``attnbook.masks.block_mask_stats``), and two checks on
the compiled kernel: its output against the dense path (max |diff|) and a fully masked query row (a padding
length of 0) coming out as zeros, as eagerly and in attnbook. No goals: FlexAttention's compiled kernels
are written for GPUs, which this script does not measure. Results go to bench/results/flex.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import common  # first: puts the repository root on sys.path
import torch

NAME = "flex"  # bench/results/flex.json
RESULTS = common.results_path(NAME)
B, H, D = 1, 2, 32
WINDOW = 256
T_VALUES = (1024, 2048)
T_VALUES_QUICK = (256, 512)
PROGRAMS = ("full", "causal", "sliding window")


def program(name: str, T: int) -> Any:
    """The mask program ``name`` at length T (an ``attnbook.masks`` mask_mod)."""
    from attnbook.masks import causal_mask_mod, sliding_window_mask_mod

    if name == "full":
        return full_mask_mod
    if name == "causal":
        return causal_mask_mod(T)
    if name == "sliding window":
        return sliding_window_mask_mod(WINDOW, causal=True)
    raise ValueError(f"program must be one of {PROGRAMS}, got {name!r}")


def full_mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """Every pair allowed: a block mask with every block full, so the compiled kernel skips nothing and calls
    no mask program; against SDPA without a mask it measures the kernel itself, not the skipping."""
    return kv_idx >= 0


def inputs(T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``(B, H, T, D)``, float32 (``attnbook.efficient.make_inputs``, as bench_efficient.py)."""
    from attnbook.efficient import make_inputs

    q, k, v = make_inputs(T, batch_size=B, num_heads=H, head_dim=D, dtype=torch.float32)
    return q, k, v


def calls(name: str, T: int, compiled: Callable[..., Any] | None) -> dict[str, Callable[[], object]]:
    """The timed calls of one program at one T: ``"<path>"`` -> zero-argument callable."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    import attnbook
    from attnbook.masks import dense_mask, make_block_mask, silence_unfused_warning

    q, k, v = inputs(T)
    mod = program(name, T)
    mask = dense_mask(mod, 1, 1, T)[0, 0].contiguous()  # (T, S)
    block_mask = make_block_mask(mod, T)

    def eager() -> object:
        with silence_unfused_warning():
            return flex_attention(q, k, v, block_mask=block_mask)

    out: dict[str, Callable[[], object]] = {
        "dense": lambda: attnbook.scaled_dot_product_attention(q, k, v, mask)[0],
        "sdpa": ((lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)) if name == "causal"
                 else (lambda: F.scaled_dot_product_attention(q, k, v)) if name == "full"
                 else (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))),
        "flex eager": eager,
    }
    if compiled is not None:
        out["flex compiled"] = lambda: compiled(q, k, v, block_mask=block_mask)
    return out


def compile_first(name: str, T: int, compiled: Callable[..., Any]) -> tuple[float, float]:
    """Seconds of the compiled kernel's first call for one program and T (compiling it), and the max |diff|
    of its output from attnbook's dense path."""
    import attnbook
    from attnbook.masks import dense_mask, make_block_mask

    q, k, v = inputs(T)
    mod = program(name, T)
    block_mask = make_block_mask(mod, T)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = compiled(q, k, v, block_mask=block_mask)
        seconds = time.perf_counter() - t0
        dense, _ = attnbook.scaled_dot_product_attention(q, k, v, dense_mask(mod, 1, 1, T)[0, 0])
    return seconds, float((out - dense).abs().max())


def fully_masked_rows(compiled: Callable[..., Any] | None) -> dict[str, Any]:
    """A batch of two with padding lengths 0 and 100 of 256 keys: the first element's query rows have no key.
    Their output eagerly and compiled (max |value|, any NaN), and the rest against the dense path."""
    from torch.nn.attention.flex_attention import flex_attention

    import attnbook
    from attnbook.masks import dense_mask, make_block_mask, padding_mask_mod, silence_unfused_warning

    T = 256
    q, k, v = (torch.randn(2, H, T, D, generator=torch.Generator().manual_seed(s)) for s in range(3))
    mod = padding_mask_mod([0, 100], T)
    block_mask = make_block_mask(mod, T, B=2)
    dense, _ = attnbook.scaled_dot_product_attention(q, k, v, dense_mask(mod, 2, 1, T))
    result: dict[str, Any] = {}
    with torch.no_grad():
        with silence_unfused_warning():
            outs = {"eager": flex_attention(q, k, v, block_mask=block_mask)}
        if compiled is not None:
            t0 = time.perf_counter()
            outs["compiled"] = compiled(q, k, v, block_mask=block_mask)
            result["compile_seconds"] = round(time.perf_counter() - t0, 1)
    for path, out in outs.items():
        result[path] = {"masked_rows_max_abs": float(out[0].abs().max()), "any_nan": bool(out.isnan().any()),
                        "max_abs_diff_from_dense": float((out - dense).abs().max())}
    return result


def inductor_cache_state(before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state of torch's on-disk compile cache. Without ``before``: the files in inductor's cache folder
    now (call it before compiling). With it: adds the FX graph cache's hit and miss counts of this process
    (``torch._dynamo.utils.counters``) and ``state``: "warm" (every compiled graph came from the cache),
    "cold" (none did) or "partly warm"."""
    from pathlib import Path

    from torch._dynamo.utils import counters
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = Path(cache_dir())
    if before is None:
        return {"cache_dir_files_before": sum(1 for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0}
    hit, miss = int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])
    state = "warm" if hit and not miss else "cold" if not hit else "partly warm"
    return {"state": state, "fxgraph_cache_hit": hit, "fxgraph_cache_miss": miss,
            "files_before": before["cache_dir_files_before"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="T = 256, 512, eager only, 3 rounds (a smoke test)")
    common.add_threads_option(ap)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5, or 3 with --quick)")
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args(argv)

    common.setup(args.threads)
    from torch.nn.attention.flex_attention import flex_attention

    from attnbook.masks import block_mask_stats, flex_available
    from attnbook.measure import machine_summary, time_calls

    if not flex_available():
        print(f"FlexAttention is not available in torch {torch.__version__} (it needs torch >= 2.5)")
        return 1
    t_values = T_VALUES_QUICK if args.quick else T_VALUES
    repeats = args.repeats or (3 if args.quick else 5)
    compiled = None if args.quick else torch.compile(flex_attention, dynamic=False)
    load = common.load_average()
    print(f"{machine_summary()}; load average {load}", flush=True)
    print(f"B={B}, H={H}, D={D}, float32, T in {list(t_values)}, {repeats} interleaved rounds"
          f"{'' if compiled is not None else ', eager only (--quick)'}", flush=True)

    compile_seconds: dict[str, float] = {}
    compiled_diff: dict[str, float] = {}
    cache = inductor_cache_state() if compiled is not None else {}
    if compiled is not None:
        for name in PROGRAMS:
            for T in t_values:
                key = f"{name} T={T}"
                compile_seconds[key], compiled_diff[key] = compile_first(name, T, compiled)
                print(f"compiled {key}: first call (compiling) {compile_seconds[key]:.1f} s, max |diff| from "
                      f"the dense path {compiled_diff[key]:.1e}", flush=True)

    times: dict[str, dict[str, float]] = {}
    skipped: dict[str, float] = {}
    for name in PROGRAMS:
        for T in t_values:
            key = f"{name} T={T}"
            times[key] = time_calls(calls(name, T, compiled), repeats, slow_s=None, reduce="median")
            skipped[key] = block_mask_stats(program(name, T), T)["skipped_share"]
            print(f"{key}: timed", flush=True)

    rows: list[dict[str, Any]] = []
    for key, t in times.items():
        pairs = [("flex eager", "dense"), ("flex eager", "sdpa")]
        if "flex compiled" in t:
            pairs.append(("flex compiled", "sdpa"))
        for a, b in pairs:
            rows.append({"case": key, "ratio": f"time({a}) / time({b})", "measured": round(t[a] / t[b], 3),
                         "note": f"{t[a] * 1e3:.1f} vs {t[b] * 1e3:.1f} ms"})
    width = max(len(r["ratio"]) for r in rows)
    print()
    print(f"{'case':24s} {'skipped':>7}  {'ratio':<{width}}  {'measured':>8}  times")
    for r in rows:
        print(f"{r['case']:24s} {skipped[r['case']]:>7.1%}  {r['ratio']:<{width}}  {r['measured']:>8.3f}  "
              f"{r['note']}")
    masked = fully_masked_rows(compiled)
    print()
    for path in ("eager", "compiled"):
        if path in masked:
            m = masked[path]
            print(f"fully masked rows, flex {path}: max |output| {m['masked_rows_max_abs']:g}, NaN: {m['any_nan']}; "
                  f"max |diff| from the dense path {m['max_abs_diff_from_dense']:.1e}")
    if compile_seconds:
        cache = inductor_cache_state(cache)
        print(f"compile time (first calls, not in the medians): {sum(compile_seconds.values()):.0f} s in all; "
              f"compile cache {cache['state']} (inductor's FX graph cache: {cache['fxgraph_cache_hit']} hits, "
              f"{cache['fxgraph_cache_miss']} misses; the cache folder held {cache['files_before']} files before)")
    print(f"load average {load} at the start, {common.load_average()} at the end")

    if not args.no_save:
        payload = {
            "config": {"B": B, "H": H, "D": D, "window": WINDOW, "T": list(t_values), "programs": list(PROGRAMS),
                       "quick": args.quick, "rounds": repeats, "block_size": 128, "dtype": "float32",
                       **common.run_info(),  # torch, threads, python, machine, cpus, date, machine_summary
                       "load_average": load},
            "median_seconds": {k: {p: round(s, 6) for p, s in t.items()} for k, t in times.items()},
            "compile_seconds": {k: round(s, 1) for k, s in compile_seconds.items()},
            "compile_cache": cache,
            "compiled_max_abs_diff_from_dense": compiled_diff,
            "skipped_tile_share": {k: round(s, 4) for k, s in skipped.items()},
            "ratios": rows,
            "fully_masked_rows": masked,
        }
        common.save_results(NAME, payload)
        print(f"wrote {common.shown(RESULTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
