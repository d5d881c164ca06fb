"""The rendered book's live explorers in headless Chromium (Debian's): from the switch to the first live frame,
with an empty browser cache (cold) and with the cache of a first visit (cached), and one update (the graph run
by onnxruntime-web plus the canvas drawing, timed by the page: ``lastOutput.ms``).

    .venv/bin/python bench/bench_live.py [--updates N] [--repeat R] [--no-save]

Needs the built book (``python3 tools/dev.py book``). Goals (issue 31): first frame at most 3 s cold and 1 s
cached, each update of an arithmetic explorer at most 50 ms; printed as ratios to the goal (< 1 meets it).
Served by Python's http.server on 127.0.0.1, every other request blocked. Writes bench/results/live.json.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import random
import statistics
import threading
import time

import common  # noqa: E402  puts the repository root on sys.path

from attnbook.explorers.live import MASKS_T_MAX  # noqa: E402
from attnbook.explorers.masks import MASK_KINDS  # noqa: E402

NAME = "live"
GOALS_MS = {"cold": 3000.0, "cached": 1000.0, "update": 50.0}
HTML = common.ROOT / "_build" / "html"
PAGE = "chapters/04_masking.html"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def first_frame(pg, url: str) -> float:
    """ms from clicking the switch to the first live frame drawn."""
    pg.goto(url, wait_until="networkidle")
    root = pg.locator('.ab-live[data-live="masks"]').evaluate("b => b.closest('.attnbook-explorer').id")
    started = time.perf_counter()
    pg.locator(f"#{root} .ab-live-switch").check()
    pg.wait_for_function(f"() => window.attnbookLive && attnbookLive['{root}'] && attnbookLive['{root}'].lastOutput",
                         polling=5, timeout=60000)
    return (time.perf_counter() - started) * 1000


def updates(pg, n: int, seed: int = 0) -> list[float]:
    root = pg.locator('.ab-live[data-live="masks"]').evaluate("b => b.closest('.attnbook-explorer').id")
    rng = random.Random(seed)
    got = []
    for _ in range(n):
        T = rng.randint(2, MASKS_T_MAX)
        frames = pg.evaluate(f"() => attnbookLive['{root}'].frames")
        pg.locator(f'#{root} select.ab-live-input[data-name="kind"]').select_option(rng.choice(MASK_KINDS))
        pg.locator(f'#{root} input.ab-live-input[data-name="T"]').evaluate(
            "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", T)
        pg.wait_for_function(f"() => attnbookLive['{root}'].frames >= {frames + 2} && !attnbookLive['{root}'].panel.busy",
                             polling=5, timeout=20000)
        got.append(pg.evaluate(f"() => attnbookLive['{root}'].lastOutput.ms"))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3, help="cold and cached first frames, each this many times")
    common.add_no_save_option(ap, NAME)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(HTML)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    url = f"{base}/{PAGE}"
    cold, cached, per_update = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        for _ in range(args.repeat):
            ctx = browser.new_context()  # an empty cache
            ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith((base, "data:", "blob:")) else r.abort())
            pg = ctx.new_page()
            cold.append(first_frame(pg, url))
            per_update += updates(pg, args.updates // args.repeat, seed=len(cold))
            pg2 = ctx.new_page()  # the same browser cache, a new page
            cached.append(first_frame(pg2, url))
            ctx.close()
        browser.close()
    server.shutdown()
    live = HTML / "_static" / "live"
    measured = {"cold": statistics.median(cold), "cached": statistics.median(cached),
                "update": statistics.median(per_update)}
    results = {k: {"median_ms": round(v, 1), "goal_ms": GOALS_MS[k], "ratio_to_goal": round(v / GOALS_MS[k], 2),
                   "meets_goal": v <= GOALS_MS[k]} for k, v in measured.items()}
    results["update"]["max_ms"] = round(max(per_update), 1)
    payload = {**common.run_info(), "page": PAGE, "chromium": "Debian's, headless", "repeat": args.repeat,
               "updates": len(per_update), "results": results,
               "live_layer_bytes": sum(f.stat().st_size for f in live.iterdir())}
    for k, r in results.items():
        print(f"{k:7s} median {r['median_ms']:7.1f} ms, goal {r['goal_ms']:.0f} ms: ratio {r['ratio_to_goal']:.2f} "
              f"({'PASS' if r['meets_goal'] else 'MISS'})")
    print(f"live layer on disk: {payload['live_layer_bytes'] / 1e6:.1f} MB")
    if not args.no_save:
        print("wrote", common.shown(common.save_results(NAME, payload)))


if __name__ == "__main__":
    main()
