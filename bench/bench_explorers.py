"""Median time of one explorer update on the CPU, as the live widget does it:
move a control, recompute, redraw, encode the PNG the Image widget shows.

    .venv/bin/python bench/bench_explorers.py [--repeat N] [--no-save]

Goal: under 100 ms per update (printed as the ratio median / 100 ms; < 1 meets it).
Also prints how long the static scrubber (all frames) takes to render.
Writes bench/results/explorers.json.

Timing: ``attnbook.measure.time_samples`` (one warm-up pass over the values, then
``--repeat`` interleaved passes; the median of every update).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import common  # noqa: E402  puts the repository root on sys.path

from attnbook.explorers import heads_explorer, masks_explorer, positions_explorer, saturation_explorer  # noqa: E402
from attnbook.explorers.masks import MASK_KINDS  # noqa: E402
from attnbook.explorers.positions import POSITION_KINDS  # noqa: E402
from attnbook.explorers.saturation import DK_VALUES  # noqa: E402
from attnbook.measure import time_samples  # noqa: E402

NAME = "explorers"  # bench/results/explorers.json
GOAL_MS = 100.0

# the control each benchmark moves, and the values it cycles through (keys: the names in explorers.json)
CASES: dict[str, tuple[Callable[..., Any], str, Sequence[Any]]] = {
    "saturation_explorer": (saturation_explorer, "d_k", DK_VALUES),
    "heads_explorer": (heads_explorer, "num_heads", [1, 2, 4, 8, 16, 32]),
    "masks_explorer": (masks_explorer, "kind", MASK_KINDS),
    "positions_explorer": (positions_explorer, "kind", POSITION_KINDS),
}


def bench(factory: Callable[..., Any], control: str, values: Sequence[Any], repeat: int) -> tuple[float, float]:
    ex = factory()
    widget = ex.widget  # build the live UI: updates then refresh the Image widget too
    slider = ex.control_widgets[control]
    moves = {v: functools.partial(setattr, slider, "value", v) for v in values}  # one update each
    samples = time_samples(moves, repeat, slow_s=None)
    times = [t for ts in samples.values() for t in ts]
    t = time.perf_counter()
    ex.static_html()
    static_s = time.perf_counter() - t
    assert widget is ex.widget
    return statistics.median(times) * 1e3, static_s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="interleaved passes over the values (default 3)")
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args(argv)
    results = {}
    print(f"{'explorer':22s} {'median update':>14s} {'/ goal 100 ms':>14s} {'static frames':>14s}")
    for name, (factory, control, values) in CASES.items():
        median_ms, static_s = bench(factory, control, values, args.repeat)
        ratio = median_ms / GOAL_MS
        results[name] = {"median_update_ms": round(median_ms, 1), "ratio_to_goal": round(ratio, 2),
                         "static_html_s": round(static_s, 2), "meets_goal": ratio < 1}
        print(f"{name:22s} {median_ms:11.1f} ms {ratio:13.2f}x {static_s:12.1f} s  {common.pass_miss(ratio < 1)}")
    if not args.no_save:
        out = common.save_results(NAME, {"goal_ms": GOAL_MS, "cpu_count": os.cpu_count(), "results": results})
        print(f"wrote {common.shown(out)}")


if __name__ == "__main__":
    main()
