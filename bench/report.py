"""Regenerate the book's results page, ``benchmarks.md``, and its plots in one command.

    .venv/bin/python bench/report.py                # bench_flash/mha/latent.py, T = 512 .. 8192: several minutes
    .venv/bin/python bench/report.py --quick        # T = 256 .. 2048: a few minutes, a smoke test
    .venv/bin/python bench/report.py --reuse        # keep bench/results/{flash,mha,latent}.json, only sweep and write
    .venv/bin/python bench/report.py --render-only  # measure nothing: rewrite the page from bench/results/*.json

Dimension legend: B batch (1), H heads (2), T sequence length, D head dim (32); bench_mha.py's and
bench_latent.py's own sizes (E model dim, S cached tokens, ...) are in their docstrings and results.

What it does, in order:

1. runs the ``main`` of ``bench/bench_flash.py``, ``bench/bench_mha.py`` and ``bench/bench_latent.py``
   (``--quick`` and ``--threads`` are passed on), which write ``bench/results/flash.json``, ``mha.json`` and
   ``latent.json`` (``--reuse``, formerly ``--reuse-flash``, keeps the ones there): separate runs, each with
   its own shapes; a script whose goal is missed still writes its results, and the page lists the miss;
2. one sweep of every case of ``bench_efficient.CASES`` at every T (``bench_efficient.measure``: median of
   interleaved rounds after a warm-up; the peak memory of every case tracked with
   :func:`attnbook.measure.tracked_memory`, deterministic, and for the naive and flash paths also measured
   as the peak RSS growth of a fresh process); the efficient-attention goals are computed from this same
   sweep (``bench_efficient.evaluate``, slopes fitted over ``bench_efficient.T_VALUES``), so the goals, the
   time table and the slopes on the page are the same numbers; it rewrites ``bench/results/efficient.json``;
3. reads ``bench/results/explorers.json`` (written by ``bench/bench_explorers.py``)
   and, when present, ``bench/results/tasks.json`` (``bench/bench_tasks.py``);
4. writes ``benchmarks.md`` (top level, part of the book) and
   ``images/bench/time_vs_T.png`` and ``images/bench/memory_vs_T.png``.

The time table's slopes and steps are read against each case's own arithmetic: :func:`counted_multiply_adds`
counts one head's multiply-adds at every T, the table shows the slope of that count next to the fitted one,
and a step from one T to the next whose time grew more than :data:`STEP_TOLERANCE` times what the count
predicts for it (or fell) is listed under the table (:func:`step_anomalies`). ``--render-only`` redoes all of
this from the stored results without measuring anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:  # bench/'s scripts, also when this one is imported from elsewhere
    sys.path.insert(0, str(BENCH))

import bench_efficient as be  # noqa: E402
import bench_flash as bf  # noqa: E402
import bench_latent as bl  # noqa: E402
import bench_mha as bm  # noqa: E402
import common  # noqa: E402
from common import RESULTS, ROOT  # noqa: E402

from attnbook.efficient import (  # noqa: E402
    FLASH_BLOCK,
    FLASH_QUERY_BLOCK,
    NUM_FEATURES,
    bigbird_block_pattern,
    lsh_n_buckets,
)

PAGE = ROOT / "benchmarks.md"
IMAGES = ROOT / "images" / "bench"

STYLE = {  # case -> (label, color, line style)
    "naive": ("exact, explicit T×T (attnbook)", "tab:blue", "-"),
    "sdpa": ("PyTorch fused SDPA", "tab:green", "-"),
    "sdpa_causal": ("PyTorch fused SDPA, causal", "tab:green", ":"),
    "flash": (f"flash (Python, tiles {FLASH_QUERY_BLOCK}×{FLASH_BLOCK})", "tab:gray", "-."),
    "flash_causal": ("flash, causal", "tab:gray", ":"),
    "sliding_window": ("sliding window (64)", "tab:orange", "--"),
    "sliding_window_causal": ("sliding window, causal", "tab:orange", ":"),
    "linear": ("linear (elu + 1)", "tab:purple", "--"),
    "linear_causal": ("linear, causal", "tab:purple", ":"),
    "block_sparse": ("block sparse (BigBird, 64)", "tab:red", "--"),
    "performer": ("Performer (m = 64)", "tab:brown", "--"),
    "lsh": ("LSH (chunks of 64, T/64 buckets)", "tab:pink", "-."),
}
# the scripts report.py runs before its sweep, each a separate run: results name -> its main(argv)
SEPARATE: dict[str, Callable[[list[str] | None], int]] = {"flash": bf.main, "mha": bm.main, "latent": bl.main}
# a step from one T to the next is listed when its time grew more than this many times what the case's
# multiply-add count predicts for that step (or when the time fell)
STEP_TOLERANCE = 1.5
LINEAR_CAUSAL_CHUNK = 128  # linear_attention's chunk of positions when causal (its default)


def counted_multiply_adds(case: str, T: int) -> int:
    """Multiply-adds of one head of ``case`` (a key of ``bench_efficient.CASES``) at length T, with the sweep's
    settings (D = 32; window, block and chunk 64; flash tiles of FLASH_QUERY_BLOCK x FLASH_BLOCK; Performer with
    NUM_FEATURES features; LSH with T/64 buckets): what its time would grow like if arithmetic were all it
    cost. Elementwise work (softmax, feature maps) and LSH's sort are not counted."""
    variant, causal, window = be.CASES[case]
    D, W = be.D, window
    if variant in ("exact", "pytorch"):  # Q K^T and P V over all pairs, or the lower triangle when causal
        return T * (T + 1) * D if causal else 2 * T * T * D
    if variant == "flash":  # whole tiles: a causal query block skips the key blocks that start after it
        bk = W
        bq = max(bk, min(-(-FLASH_QUERY_BLOCK // bk) * bk, -(-T // bk) * bk))
        pairs = sum((min(a + bq, T) - a) * (min(T, -(-min(a + bq, T) // bk) * bk) if causal else T)
                    for a in range(0, T, bq))
        return 2 * pairs * D
    if variant == "sliding window":  # query blocks of b, each against a band of b + 2W keys (b + W when causal)
        b = min(max(W, 32), T)
        return 2 * (-(-T // b) * b) * (b + W + (0 if causal else W)) * D
    if variant == "linear":  # phi(K)^T [V | 1] and phi(Q) [S | z]; causal adds a (chunk, chunk) triangle per chunk
        chunks = [min(LINEAR_CAUSAL_CHUNK, T - a) for a in range(0, T, LINEAR_CAUSAL_CHUNK)] if causal else []
        return 2 * T * D * (D + 1) + sum(c * c * (2 * D + 1) for c in chunks)
    if variant == "performer":  # the features of q and k, then linear attention over NUM_FEATURES of them
        return 2 * T * D * NUM_FEATURES + 2 * T * NUM_FEATURES * (D + 1)
    if variant == "block sparse":  # one global query block over all keys, every other block over its key blocks
        nb = -(-T // W)
        kb = int(bigbird_block_pattern(nb, 1, 1, 1, 0)[1:].sum(dim=-1).max()) if nb > 1 else 0
        return 2 * W * T * D + 2 * (nb - 1) * W * kb * W * D
    if variant == "LSH":  # hashing (a (D, n_buckets / 2) rotation), then chunks of W against 2W keys
        return T * D * (lsh_n_buckets(T, W) // 2) + 4 * T * W * D
    raise ValueError(f"no count for case {case!r} (variant {variant!r})")


def counted_slopes(names: Sequence[str], t_values: Sequence[int]) -> dict[str, float]:
    """The log-log slope of each case's multiply-add count over ``t_values``: the slope its time would have."""
    return {n: be.loglog_slope(t_values, [counted_multiply_adds(n, T) for T in t_values]) for n in names}


def step_anomalies(times: dict[str, dict[int, float]]) -> list[str]:
    """Steps a reader should not take at face value: from one measured T to the next, the time grew more than
    STEP_TOLERANCE times what the case's own multiply-add count predicts for that step, or it fell."""
    notes = []
    for name, series in times.items():
        ts = sorted(series)
        for a, b in zip(ts, ts[1:]):
            measured = series[b] / series[a]
            counted = counted_multiply_adds(name, b) / counted_multiply_adds(name, a)
            if measured > STEP_TOLERANCE * counted or measured < 1:
                notes.append(f"{STYLE[name][0]}: T = {a} -> {b} took {measured:.1f}x the time, its count "
                             f"{counted:.2f}x")
    return notes


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


def _when(t_values: Sequence[int], cost: Sequence[float], ref: Sequence[float]) -> str:
    from attnbook.measure import crossover

    x = crossover(t_values, cost, ref)
    if x is None:
        return f"not by T = {t_values[-1]}"
    return f"already at T = {t_values[0]}" if x == t_values[0] else f"T ≈ {x:.0f}"


def _pass(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _load_note(run: dict, start: str) -> str:
    """``load average 1.23 at its start and 1.45 at its end`` (as far as ``run`` recorded them), and a warning
    when it exceeded the CPU count."""
    a, b = run.get(start), run.get("load_average_end")
    if a is None:
        return "load average not recorded"
    note = f"load average {a:.2f} at its start" + ("" if b is None else f" and {b:.2f} at its end")
    cpus = run.get("cpus")
    if cpus and max(a, b or 0) > cpus:
        note += f", above its {cpus} CPU(s): other programs competed for them, so compare the ratios, not the times"
    return note


def latent_section(latent: dict) -> list[str]:
    """Multi-head latent attention's three decoding forms (``bench/results/latent.json``, written by
    ``bench/bench_latent.py``): the paragraph, the times and ratios per S, the goals."""
    lc = latent["config"]
    layer = lc["layer"]
    el = latent["cache_elements_per_token"]
    L = ["## Multi-head latent attention: naive, expanded and absorbed decoding", ""]
    L.append(
        f"From `bench/results/latent.json`, **a separate run** of `bench/bench_latent.py`"
        f"{' --quick' if lc.get('quick') else ''} (on {lc.get('date', '?')}, {_load_note(lc, 'load_average')}; "
        f"{lc.get('machine_summary', 'machine not recorded')}): one decoding step "
        "(`attnbook.latent.MultiHeadLatentAttention`, one new token, B=1) over a cache holding S tokens, "
        "preallocated, in a layer with DeepSeek-V2-Lite's attention sizes "
        f"(E={layer['d_model']}, {layer['num_heads']} heads, latent Dc={layer['kv_lora_rank']}, per head "
        f"Dn={layer['qk_nope_head_dim']}, Dr={layer['qk_rope_head_dim']}, Dv={layer['v_head_dim']}), CPU, "
        f"{lc['dtype']}, {lc['threads']} thread(s), median of {lc['rounds']} interleaved rounds, the three forms "
        "timed in the same rounds. \"naive\" (a `LatentKVCache`, `absorb=False`, as Hugging Face's "
        "`DeepseekV3Attention`) re-expands the whole cache through `kv_b_proj` into per-head keys and values "
        "at every step (S · Dc · H · (Dn + Dv) multiply-adds); \"expanded\" (a `StaticKVCache` of those "
        "per-head keys and values, DeepSeek-V3's `attn_impl=\"naive\"`) expands only the new token and attends "
        "over what it caches (S · H · (Dn + Dr + Dv)); \"absorbed\" (a `LatentKVCache`, `absorb=True`) folds "
        "W_UK into the query and W_UV into the output and attends over the cached rows themselves (about "
        f"S · H · (2 Dc + Dr), more arithmetic than expanded). The latent cache holds {el['mla']} numbers per "
        f"token and layer, the expanded one {el['mha_expanded']}."
    )
    L.append("")
    s_values = [str(S) for S in lc["S"]]
    ms, ratios, diffs = latent["median_seconds"], latent["ratios"], latent["max_abs_diff_vs_naive"]
    L += _table(
        ["S", "naive (ms)", "expanded (ms)", "absorbed (ms)", "naive / absorbed", "naive / expanded",
         "expanded / absorbed", "largest difference from naive (expanded, absorbed)"],
        [[S, _fmt_ms(ms["naive"][S]), _fmt_ms(ms["expanded"][S]), _fmt_ms(ms["absorbed"][S]),
          f"{ratios['naive/absorbed'][S]:.1f}", f"{ratios['naive/expanded'][S]:.1f}",
          f"{ratios['expanded/absorbed'][S]:.1f}", f"{diffs['expanded'][S]:.1e}, {diffs['absorbed'][S]:.1e}"]
         for S in s_values],
    )
    L += ["The goals, from the same run:", ""]
    L += _table(
        ["goal", "measured", "target", "result"],
        [[r["ratio"], f"{r['measured']:.2f}", r["goal"], _pass(r["pass"])] for r in latent["goals"]],
    )
    return L


def live_section(live: dict | None) -> list[str]:
    """The rendered book's live explorers (``bench/results/live.json``, written by ``bench/bench_live.py``)."""
    L = ["## Live explorers in the rendered book", ""]
    if not live:
        return L + ["No `bench/results/live.json` yet: build the book, then run `.venv/bin/python bench/bench_live.py`.", ""]
    L.append(
        f"`bench/bench_live.py` (read from `bench/results/live.json`, headless Chromium on {live.get('cpus', '?')} "
        f"CPU(s), {live['page']}, the masks explorer): from the live switch to the first live frame with an empty "
        f"browser cache (cold) and with the cache of a first visit (cached), median of {live['repeat']}; one update "
        f"(the graph run by onnxruntime-web and the canvas drawn, timed by the page), median of {live['updates']}. "
        f"The live layer (`_build/html/_static/live/`, shared by both editions) is "
        f"{live['live_layer_bytes'] / 1e6:.1f} MB on disk.")
    L.append("")
    return L + _table(
        ["what", "median (ms)", "goal (ms)", "/ goal", "result"],
        [[name, f"{r['median_ms']:.1f}", f"{r['goal_ms']:.0f}", f"{r['ratio_to_goal']:.2f}",
          "PASS" if r["meets_goal"] else "MISS"] for name, r in live["results"].items()],
    )


def render(eff: dict, data: dict, t_values: list[int], images: list[str], explorers: dict | None,
           tasks: dict | None, meta: dict, flash: dict | None = None, mha: dict | None = None,
           latent: dict | None = None) -> str:
    L = ["# Benchmarks", ""]
    L.append(
        f"Measured on {meta['date']} on a machine with {meta['cpus']} CPU(s) ({meta['cpu']}), torch "
        f"{meta['torch']}, Python {meta['python']}, {meta['threads']} torch thread(s); load average "
        f"{meta['load']:.2f} at the start of the sweep (the machine is shared: timings vary from run to run, "
        "compare ratios measured in one run). Every time on this page is the **median of interleaved rounds** "
        "(every case once per round, after a warm-up call), as in chapter 8. Regenerate this page, its plots and "
        "`bench/results/efficient.json`, `flash.json`, `mha.json` and `latent.json` with one command, "
        "`.venv/bin/python bench/report.py` (add `--quick` for smaller sizes)."
    )
    L.append("")
    if max(meta["load"] or 0, meta["load_end"] or 0) > meta["cpus"]:
        L.append(
            f"**Caution: this machine was overloaded during the sweep** (load average {meta['load']:.2f} at its start "
            f"and {meta['load_end']:.2f} at its end, on {meta['cpus']} CPU(s)): other programs competed for the CPU "
            "and stretched some rounds more than others, more than a median of interleaved rounds can absorb. "
            "The memory numbers are unaffected (tracked memory is deterministic); the times, slopes and "
            "crossovers carry this noise, and the steps listed under the time table are its visible part."
        )
        L.append("")
    ratios = list(eff["ratios"])  # every goal stated as a ratio: {"ratio", "measured", "goal", "pass"}
    if flash:
        ratios += [{**r, "ratio": f"{r['shape']}: {r['ratio']}"} for r in flash["ratios"]]
    if mha:
        ratios += mha["ratios"]
    if latent:
        ratios += latent["goals"]
    goals = [r["pass"] for r in ratios]
    missed = [f"{r['ratio']} ({r['measured']:.3f}, goal {r['goal']})" for r in ratios if not r["pass"]]
    if explorers:
        goals += [r["meets_goal"] for r in explorers["results"].values()]
        missed += [f"{name}: median update {r['median_update_ms']:.1f} ms (goal < {explorers['goal_ms']:.0f} ms)"
                   for name, r in explorers["results"].items() if not r["meets_goal"]]
    if tasks:
        graded = [r for r in tasks["results"] if r.get("status") in ("PASS", "MISS")]
        goals += [r["status"] == "PASS" for r in graded]
        missed += [f"{r.get('task', '?')}: accuracy {r.get('accuracy', 0):.4f} (goal {r.get('goal_accuracy')})"
                   for r in graded if r["status"] == "MISS"]
    L.append(f"**{sum(goals)} of {len(goals)} goals met.**")
    L.append("")
    if missed:
        L.append("Missed: " + "; ".join(missed) + ". See the notes under the tables.")
        L.append("")

    c = eff["config"]
    slope_t = eff["slope_T"]
    span = f"T = {min(slope_t)}..{max(slope_t)}"
    L += ["## Efficient attention: the goals", ""]
    L.append(
        f"From the sweep below (the same run and the same medians as the time table): CPU, B={c['B']}, H={c['H']}, "
        f"D={c['D']}, float32, window/block/chunk {c['window']}, median of {c['rounds']} interleaved rounds "
        f"({c['rounds_slow_above_2048']} for the naive and flash paths above T = 2048), {c['threads']} thread(s). "
        "\"naive\" is `attnbook.scaled_dot_product_attention`, which builds the (T, T) weights; \"sdpa\" is "
        f"PyTorch's `F.scaled_dot_product_attention`. A slope is the least-squares slope of log(time) against "
        f"log(T) over {span}: 1 for a cost linear in T, 2 for a quadratic one. The linear-cost variants must "
        f"stay at or below {be.SLOPE_GOAL} (the goal used to be time(8192) / time(2048) < 10, which a "
        "T^1.66 method passes)."
    )
    L.append("")
    L += _table(
        ["goal", "measured", "target", "result", "note"],
        [[r["ratio"], f"{r['measured']:.3f}", r["goal"], "PASS" if r["pass"] else "MISS", r.get("note", "")]
         for r in eff["ratios"]],
    )

    if flash:
        f = flash["config"]
        L += ["## Flash attention: training, against PyTorch's kernel", ""]
        L.append(
            f"From `bench/results/flash.json`, **a separate run** of `bench/bench_flash.py`"
            f"{' --quick' if f.get('quick') else ''} (its own shapes, load average {f['load_average']:.2f} at its "
            f"start; its times are not those of the tables below): CPU, T = {f['T']}, float32, "
            f"{f['threads']} thread(s), tiles of {f['query_block_size']} queries × {f['block_size']} keys, median of "
            f"{f['rounds']} interleaved rounds. \"forward+backward\" "
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
    fitted = be.slopes(data["times"], slope_t)
    counted = counted_slopes(names, slope_t)
    L += [f"Median time (ms), the fitted slope over {span}, and the slope the case's multiply-add count has over "
          f"the same lengths (\"counted\", `counted_multiply_adds` in `bench/report.py`; goal: a fitted slope of at "
          f"most {be.SLOPE_GOAL} for the linear-cost variants; the others have none):", ""]
    rows = []
    for n in names:
        goal = "-" if n not in be.LINEAR_COST else ("PASS" if fitted[n] <= be.SLOPE_GOAL else "MISS")
        rows.append([STYLE[n][0]] + [_fmt_ms(data["times"][n][T]) for T in t_values]
                    + [f"{fitted[n]:.2f}", f"{counted[n]:.2f}", goal])
    L += _table(["case"] + [f"T={T}" for T in t_values] + ["slope", "counted", "goal"], rows)
    notes = step_anomalies({n: data["times"][n] for n in names})
    L += ["**Steps against the count.** Each step of the time table, from one T to the next, is compared with "
          "what the case's own multiply-add count predicts for that step (4x per doubling for the quadratic "
          "cases, about 2x for the linear ones); a step is listed when its time grew more than "
          f"{STEP_TOLERANCE:g} times that, or fell: "
          + ("; ".join(notes) + ". These are measurements of this machine at that moment (a working set "
             "outgrowing the CPU's caches, a kernel switching code path at some size, other programs taking the "
             "CPU), not properties of the algorithms; the fitted slopes above use every point anyway."
             if notes else "none in this run.")
          + " Steps that grew less than the count are common at small T, where a fixed cost per call weighs more, "
            "and are not listed.", ""]
    over = [STYLE[n][0] for n in be.LINEAR_COST if n in fitted and fitted[n] > be.SLOPE_GOAL]
    L += ["Why slopes differ from the arithmetic: LSH with T/64 buckets is not linear as configured: hashing "
          "multiplies every vector by a (D, T/128) rotation, T² D / 128 multiply-adds, and it sorts the positions, "
          "O(T log T), besides its 4 · T · 64 · D multiply-adds of chunk scores and values, so its arithmetic grows "
          "a little faster than T (the hashing is 1/32 of the chunk work at T = 1024 and 1/4 at T = 8192), and it "
          "has no slope goal. The linear-cost "
          "variants do O(T) arithmetic (block sparse: a fixed number of 64-key blocks per query block, plus one "
          "global block row of T keys). "
          + (f"Above the goal in this run: {', '.join(over)}. Their arithmetic does not explain it; what does "
             "(memory traffic as the tensors outgrow the CPU's caches, Python overhead, or other programs on this "
             f"shared machine, load average {meta['load']:.2f} at the start of the sweep and "
             f"{meta['load_end']:.2f} at its end) is not separated by this page, so the goal is reported as missed "
             "rather than loosened."
             if over else "All of them met the goal in this run."), ""]
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

    if mha:
        m = mha["config"]
        L += ["## Multi-head attention against PyTorch", ""]
        L.append(
            f"From `bench/results/mha.json`, **a separate run** of `bench/bench_mha.py`{' --quick' if m.get('quick') else ''} "
            f"(on {m.get('date', '?')}, {_load_note(m, 'load_average_start')}): `attnbook.MultiHeadAttention` "
            "against `torch.nn.MultiheadAttention` holding the same weights (`MultiHeadAttention.from_torch`), "
            f"CPU, B={m['B']}, T = S = {m['T']}, E={m['E']}, {m['H']} heads, {m['dtype']}, {m['mask']} mask, eval "
            f"mode, `torch.no_grad()`, {m['threads']} thread(s), median of {m['rounds']} interleaved rounds; the two "
            f"modules' outputs and weights agree to {mha['max_abs_difference']:.1e}. The weights path "
            "(`need_weights=True`) returns the per-head weights (B, H, T, S) (PyTorch: `average_attn_weights=False`); "
            "on the fast path (`need_weights=False`) attnbook calls `F.scaled_dot_product_attention`."
        )
        L.append("")
        L += _table(
            ["path", "ratio", "measured", "goal", "result", "times (PyTorch vs attnbook)"],
            [[*r["ratio"].split(": ", 1), f"{r['measured']:.3f}", r["goal"], _pass(r["pass"]), r["note"]]
             for r in mha["ratios"]],
        )

    if latent:
        L += latent_section(latent)

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
    L += live_section(_load("live"))

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


def _from_json(eff: dict) -> dict:
    """The sweep as :func:`bench_efficient.measure` returned it, read back from efficient.json."""
    def ints(d: dict) -> dict:
        return {n: {int(T): x for T, x in series.items()} for n, series in d.items()}

    return {"times": ints(eff["median_seconds"]), "tracked": ints(eff["tracked_peak_bytes"]),
            "rss": ints(eff["peak_memory_growth_bytes"])}


def _load(name: str) -> dict | None:
    """``bench/results/<name>.json``, or None when that script has not been run."""
    path = common.results_path(name)
    return json.loads(path.read_text()) if path.exists() else None


def _run_separate(name: str, run: Callable[[list[str] | None], int], argv: list[str]) -> int:
    """Run ``bench_<name>.py``'s ``main``; 0 when it wrote ``bench/results/<name>.json``. Some scripts exit
    with 1 when a goal is missed, after writing their results: the page lists the miss, the report goes on.
    Any other failure (no results written) stops the report with that exit status."""
    path = common.results_path(name)
    before = path.stat().st_mtime_ns if path.exists() else None
    rc = run(argv)
    if rc and (not path.exists() or path.stat().st_mtime_ns == before):
        print(f"bench_{name}.py failed (exit status {rc}) without writing {common.shown(path)}")
        return rc
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="T = 256 .. 2048 and fewer rounds (a smoke test)")
    common.add_threads_option(ap)
    ap.add_argument("--reuse", "--reuse-flash", dest="reuse", action="store_true",
                    help="keep bench/results/flash.json, mha.json and latent.json instead of rerunning "
                         "bench_flash.py, bench_mha.py and bench_latent.py")
    ap.add_argument("--render-only", action="store_true",
                    help="measure nothing: rewrite the page and plots from bench/results/*.json")
    args = ap.parse_args(argv)

    steps = len(SEPARATE) + 2
    if not (args.reuse or args.render_only):
        for i, (name, script_main) in enumerate(SEPARATE.items(), 1):
            print(f"{i}/{steps} bench_{name}.py goals", flush=True)
            rc = _run_separate(name, script_main, (["--quick"] if args.quick else []) + ["--threads", str(args.threads)])
            if rc:
                return rc
    flash, mha, latent = (_load(name) for name in SEPARATE)

    torch = common.setup(args.threads)
    from attnbook.measure import cpu_model

    if args.render_only:
        eff = json.loads((RESULTS / "efficient.json").read_text())
        data = _from_json(eff)
    else:
        t_values = [256, 512, 1024, 2048] if args.quick else [512, 1024, 2048, 4096, 8192]
        slope_t = be.T_VALUES_QUICK if args.quick else be.T_VALUES
        repeats = 5 if args.quick else 15
        print(f"{steps - 1}/{steps} sweep over T = {t_values}, {repeats} rounds", flush=True)
        load_start = common.load_average()
        data = be.measure(t_values, repeats, args.threads)
        run = be.config(torch, t_values, repeats, args.quick, args.threads, load_start)
        results = be.evaluate(data, slope_t)
        be.print_results(data, slope_t, results)
        be.save(data, slope_t, results, run)
        eff = json.loads((RESULTS / "efficient.json").read_text())
    t_values = eff["config"]["T_values"]
    images = plot(data, t_values)

    print(f"{steps}/{steps} page", flush=True)
    explorers, tasks = _load("explorers"), _load("tasks")
    c = eff["config"]
    meta = {
        "date": c["date"], "cpus": c["cpus"], "cpu": cpu_model(), "torch": c["torch"], "python": c["python"],
        "threads": c["threads"], "load": c["load_average_start"], "load_end": c["load_average_end"],
    }
    PAGE.write_text(render(eff, data, t_values, images, explorers, tasks, meta, flash, mha, latent), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} and {', '.join(images)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
