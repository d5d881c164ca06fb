"""The live explorers in the rendered book (attnbook.explorers.live, attnbook_live.js), in headless Chromium.

Both editions. Every request that leaves 127.0.0.1 is blocked (the page fixture of tests/test_browser.py).
For each live explorer: random settings set through the live panel's own controls give the numbers (read from
the page's data hook, ``window.attnbookLive[<explorer id>].lastOutput``) that the Python computes for the same
setting; at the scrubber's grid points the live frame's caption is the scrubber frame's; before the switch the
page requests exactly what it requests without the switch (nothing of the live layer); from file://, at
phone width and with a graph missing from the site the scrubber stays and one line says why.
Screenshots go to _build/screenshots/live-*.png.
"""
# ruff: noqa: F811  (the fixtures imported below are the test functions' arguments)

import itertools
import random
import re

import pytest

from attnbook.explorers import masks_explorer
from attnbook.explorers.live import LIVE, MASKS_T_MAX, masks_frame
from attnbook.explorers.masks import MASK_KINDS, PADDED, WINDOWED

# test_browser's fixtures (the local server, Chromium, a page whose requests that leave the host are blocked and
# whose errors are collected), used here by their names
from tests.test_browser import EDITIONS, HTML, SHOTS, _prefix, book, browser, page  # noqa: F401

pytestmark = pytest.mark.browser

MASKS_PAGE = "chapters/04_masking"
SWITCH_BLOCK = re.compile(r'<div class="ab-live" .*?</span></div>')


def _explorer(pg, name):
    """The id of the explorer whose switch is for live explorer `name`."""
    box = pg.locator(f'.ab-live[data-live="{name}"]')
    assert box.count() == 1, f"one live switch for {name}, found {box.count()}"
    return box.evaluate("b => b.closest('.attnbook-explorer').id")


def _switch_on(pg, root):
    pg.locator(f"#{root} .ab-live-switch").check()
    pg.wait_for_function(f"() => window.attnbookLive && attnbookLive['{root}'] && attnbookLive['{root}'].lastOutput",
                         timeout=30000)


def _set(pg, root, kind, T, window, length):
    """The setting, through the live panel's controls: the kind in its select, the ranges as a reader's input
    event leaves them (T first: it bounds the window and the real length)."""
    pg.locator(f'#{root} select.ab-live-input[data-name="kind"]').select_option(kind)
    for name, value in (("T", T), ("window", window), ("length", length)):
        rng = pg.locator(f'#{root} input.ab-live-input[data-name="{name}"]')
        if rng.is_disabled():
            continue
        rng.evaluate("(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }", value)
    want = {"kind": kind, "T": T}
    pg.wait_for_function(
        """([root, want, w, n]) => { const o = attnbookLive[root].lastOutput, s = o && o.setting;
             return s && s.kind === want.kind && s.T === want.T && (w === null || s.window === w)
               && (n === null || s.length === n) && !attnbookLive[root].panel.busy; }""",
        arg=[root, want, window if kind in WINDOWED else None, length if kind in PADDED else None], timeout=20000)
    return pg.evaluate(f"() => attnbookLive['{root}'].lastOutput")


def _check_masks(out, kind, T, window, length):
    d = masks_frame(kind, T, window, length)
    assert out["mask"] == d["mask"].flatten().int().tolist(), (kind, T, window, length)
    diff = max(abs(a - b) for a, b in zip(out["weights"], d["weights"].flatten().tolist()))
    assert diff < 1e-6, f"{kind}, T={T}, window={window}, length={length}: max |diff| {diff:.2e}"
    assert out["caption"] == d["caption"]
    return diff


@pytest.mark.parametrize("language", EDITIONS)
def test_live_masks_equal_the_python(page, book, language):
    page.goto(f"{book}/{_prefix(language)}{MASKS_PAGE}.html", wait_until="load")
    root = _explorer(page, "masks")
    _switch_on(page, root)
    first = page.evaluate(f"() => attnbookLive['{root}'].lastOutput")
    _check_masks(first, "causal", 8, 2, 5)  # the spec's defaults
    rng = random.Random(f"masks-{language}")
    settings = [("sliding window", MASKS_T_MAX, MASKS_T_MAX - 1, 1), ("causal + padding", 2, 0, 1)]
    for _ in range(6):
        T = rng.randint(2, MASKS_T_MAX)
        settings.append((rng.choice(MASK_KINDS), T, rng.randrange(T), rng.randint(1, T)))
    worst = 0.0
    for kind, T, window, length in settings:
        out = _set(page, root, kind, T, window, length)
        worst = max(worst, _check_masks(out, kind, T, window, length))
    print(f"{language}: {len(settings)} settings, max |weights - torch| {worst:.1e}")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator(f"#{root}").screenshot(path=str(SHOTS / f"live-masks-{language}.png"))
    # switched off, the scrubber is back, showing a frame
    page.locator(f"#{root} .ab-live-switch").uncheck()
    assert page.locator(f"#{root} .ab-frame:visible").count() == 1
    assert page.locator(f"#{root} .ab-live-panel").is_hidden()
    assert not page.js_errors, page.js_errors
    assert not page.left_the_host or all("_static/live" not in u for u in page.left_the_host)


def test_live_masks_equal_the_scrubber_at_its_grid_points(page, book):
    page.goto(f"{book}/{MASKS_PAGE}.html", wait_until="load")
    root = _explorer(page, "masks")
    captions = page.locator(f"#{root} .ab-frame .ab-caption").all_text_contents()
    ex = masks_explorer()
    combos = list(itertools.product(*(c.static_values for c in ex.controls)))
    names = [c.name for c in ex.controls]
    assert len(captions) == len(combos)
    _switch_on(page, root)
    for caption, combo in zip(captions, combos):
        v = dict(zip(names, combo))
        out = _set(page, root, v["kind"], v["T"], v["window"], v["length"])
        assert out["caption"] == caption, v
        _check_masks(out, v["kind"], v["T"], v["window"], v["length"])
    assert not page.js_errors, page.js_errors


def _requests(pg, url):
    got = []
    pg.on("requestfinished", lambda r: got.append((r.url, r.sizes()["responseBodySize"])))
    pg.goto(url, wait_until="networkidle")
    return got


def test_nothing_of_the_live_layer_loads_before_the_switch(browser, book):
    """The page, and the same page with the switch's markup cut out of its HTML (what it was before the live
    layer): the same requests, the same bytes except the HTML's, which grows by the switch's markup alone."""
    url = f"{book}/{MASKS_PAGE}.html"
    cut = {}

    def strip(route):
        resp = route.fetch()
        body = resp.text()
        cut["with"], stripped = len(body.encode()), SWITCH_BLOCK.sub("", body)
        cut["without"] = len(stripped.encode())
        route.fulfill(response=resp, body=stripped)

    seen = {}
    for variant in ("live", "before"):
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        pg = ctx.new_page()
        pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith((book, "data:")) else r.abort())
        if variant == "before":
            pg.route(url, strip)
        seen[variant] = _requests(pg, url)
        ctx.close()
    live, before = dict(seen["live"]), dict(seen["before"])
    assert sorted(live) == sorted(before), set(live) ^ set(before)
    assert not [u for u in live if "_static/live/" in u]
    assert {u: n for u, n in live.items() if u != url} == {u: n for u, n in before.items() if u != url}
    grown = cut["with"] - cut["without"]
    assert 0 < grown < 4000, grown
    print(f"before the switch: {len(live)} requests, {sum(live.values())} bytes; the switch's markup "
          f"adds {grown} bytes to the page's HTML")


def test_from_a_file_the_scrubber_stays_with_one_line(browser):
    pg = browser.new_page()
    errors = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" and "file://" in (m.location or {}).get("url", "file://") and "Failed to load resource" not in m.text else None)
    pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file://", "data:")) else r.abort())
    pg.goto((HTML / f"{MASKS_PAGE}.html").as_uri(), wait_until="load")
    root = _explorer(pg, "masks")
    switch = pg.locator(f"#{root} .ab-live-switch")
    switch.click()  # (the switch unchecks itself: check() would insist)
    note = pg.locator(f"#{root} .ab-live-note")
    assert "http.server" in note.text_content() and "\n" not in note.text_content()
    assert not switch.is_checked()
    assert pg.locator(f"#{root} .ab-frame:visible").count() == 1
    assert pg.evaluate("() => !window.attnbookLive")  # nothing was loaded
    assert not errors, errors
    pg.close()


def test_a_missing_graph_leaves_the_scrubber_and_says_why(page, book):
    page.route("**/_static/live/masks.onnx", lambda r: r.fulfill(status=404, body="not found"))
    page.goto(f"{book}/{MASKS_PAGE}.html", wait_until="load")
    root = _explorer(page, "masks")
    page.locator(f"#{root} .ab-live-switch").check()
    page.wait_for_function(f"() => document.querySelector('#{root} .ab-live').dataset.state === 'failed'", timeout=30000)
    note = page.locator(f"#{root} .ab-live-note").text_content()
    assert "missing" in note and "masks.onnx" in note, note
    assert not page.locator(f"#{root} .ab-live-switch").is_checked()
    assert page.locator(f"#{root} .ab-frame:visible").count() == 1
    # the browser's own line for the 404 is the only console error: nothing from the page's code
    rest = [e for e in page.js_errors if "404" not in e]
    assert not rest, rest


@pytest.mark.parametrize("language", EDITIONS)
def test_live_masks_at_phone_width(browser, book, language):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    pg = ctx.new_page()
    pg.route("**/*", lambda r: r.continue_() if r.request.url.startswith((book, "data:", "blob:")) else r.abort())
    pg.goto(f"{book}/{_prefix(language)}{MASKS_PAGE}.html", wait_until="load")
    root = _explorer(pg, "masks")
    pg.locator(f"#{root} .ab-live-switch").tap()
    pg.wait_for_function(f"() => window.attnbookLive && attnbookLive['{root}'] && attnbookLive['{root}'].lastOutput",
                         timeout=30000)
    width = pg.evaluate("() => document.documentElement.clientWidth")
    for el in pg.locator(f"#{root} .ab-live-input, #{root} .ab-live-switch, #{root} canvas").all():
        el.scroll_into_view_if_needed()
        box = el.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 1, box
    out = _set(pg, root, "causal + window", 20, 5, 3)
    _check_masks(out, "causal + window", 20, 5, 3)
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.locator(f"#{root}").screenshot(path=str(SHOTS / f"live-masks-phone-{language}.png"))
    ctx.close()


def test_every_live_explorer_has_a_switch_in_both_editions():
    for language in EDITIONS:
        body = (HTML / f"{_prefix(language)}{MASKS_PAGE}.html").read_text(encoding="utf-8")
        found = re.findall(r'class="ab-live" data-live="([a-z_]+)" data-base="([^"]+)"', body)
        assert [name for name, _ in found] == list(LIVE.values()), found
        # both editions point at the one copy, at the root of the HTML folder
        assert found[0][1] == ("../" if language == "en" else "../../") + "_static/live/"
    assert (HTML / "_static" / "live" / "masks.onnx").exists()
    assert not (HTML / "zh_CN" / "_static" / "live").exists()
