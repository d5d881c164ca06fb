"""The rendered book in a real browser: headless Chromium (Debian's), driven by playwright.

Every chapter page loads, shows its figures and no error output, and logs no error at all (a page error or
an error on the console fails it); each explorer's static scrubber, dragged by the mouse from its first value
to its last, shows every frame in order while the slider stays put, and the arrow keys step through them.
Screenshots go to _build/screenshots/ for review. Requests that leave 127.0.0.1
(CDN scripts) are blocked so that nothing here depends on the network.
Skips when Chromium or playwright is missing, except under CI=true, where it fails.
"""

import functools
import http.server
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tools.bookfiles import toc_files

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = os.environ.get("ATTNBOOK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGES = toc_files()

pytestmark = pytest.mark.browser


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required under CI=true: .ci/run installs chromium with apt-get)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def book():
    if not Path(CHROMIUM).exists():
        _unavailable(f"Chromium not found at {CHROMIUM}: apt-get install -y chromium, or set ATTNBOOK_CHROMIUM")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("the playwright package is not installed")
    if not (HTML / "intro.html").exists():
        # plain `pytest` on a fresh clone: the book is built by the test command (or `python3 tools/dev.py book`)
        _unavailable("the book is not built: run `python3 tools/dev.py book` first "
                     "(`python3 tools/dev.py test` builds it before these tests)")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(HTML)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(book):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, book):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()

    def only_local(route):
        if route.request.url.startswith(book):
            route.continue_()
        else:
            route.abort()

    pg.route("**/*", only_local)
    errors = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))

    def on_console(msg):
        # any error the page logs fails the test (thebe's "THEBE_JS_URL has already been declared", the theme's
        # "Got invalid theme mode", ...), except a failed load of a request blocked above (a CDN script)
        if msg.type == "error":
            url = (msg.location or {}).get("url", "")
            if not ("Failed to load resource" in msg.text and not url.startswith(book)):
                errors.append(f"console: {msg.text}")

    pg.on("console", on_console)
    pg.js_errors = errors
    yield pg
    ctx.close()


def _open(page, book, doc):
    resp = page.goto(f"{book}/{doc}.html", wait_until="load")
    assert resp is not None and resp.ok, f"{doc}.html: HTTP {resp.status if resp else 'no response'}"
    return page


@pytest.mark.parametrize("doc", PAGES)
def test_page_loads_with_figures_and_no_errors(page, book, doc):
    _open(page, book, doc)
    assert page.locator("article h1").count() >= 1, f"{doc}: no title"
    tracebacks = page.locator(".cell_output .traceback, .output.traceback, .output.error").count()
    assert tracebacks == 0, f"{doc}: {tracebacks} error output(s) on the page"
    stderr_text = " ".join(page.locator(".cell_output .output.stderr").all_inner_texts())
    assert "Error" not in stderr_text and "Traceback" not in stderr_text, f"{doc}: stderr shows {stderr_text[:300]}"
    if doc.startswith("chapters/"):
        imgs = page.locator(".cell_output img")
        visible = [i for i in range(imgs.count()) if imgs.nth(i).is_visible()]
        assert visible, f"{doc}: no figure is shown"
        broken = page.evaluate(
            "() => Array.from(document.querySelectorAll('.cell_output img'))"
            ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80))")
        assert not broken, f"{doc}: images that did not load: {broken}"
        # figures and scrubber frames are shown at their own size or smaller, never blown up
        stretched = page.evaluate(
            "() => Array.from(document.querySelectorAll('.cell_output img')).filter(i => i.naturalWidth > 0"
            " && i.getBoundingClientRect().width > 1.25 * i.naturalWidth).map(i => i.alt || i.src.slice(0, 60))")
        assert not stretched, f"{doc}: images shown larger than 1.25x their size: {stretched}"
        # an explorer must show its scrubber, never an empty widget placeholder
        widgets_without_fallback = page.locator(".cell_output script[type='application/vnd.jupyter.widget-view+json']")
        assert widgets_without_fallback.count() == 0, f"{doc}: a dead widget view is rendered instead of the scrubber"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{doc.replace('/', '_')}.png"), full_page=True)
    assert not page.js_errors, f"{doc}: JavaScript errors {page.js_errors}"


def _explorer_pages():
    return [d for d in PAGES if d.startswith("chapters/")
            and 'class=\\"attnbook-explorer' in (ROOT / f"{d}.ipynb").read_text(encoding="utf-8")]


def test_chapter_2_has_an_explorer():
    ch2 = "chapters/02_scaled_dot_product"
    assert ch2 in PAGES, f"{ch2} is not in _toc.yml: the book lost the page of the saturation explorer"
    assert ch2 in _explorer_pages(), "chapter 2 must show the saturation explorer"


_STATE = """ex => Array.from(ex.querySelectorAll('.ab-frame'))
    .filter(f => getComputedStyle(f).display !== 'none').map(f => Number(f.dataset.i))"""

_RECORD = """(input) => { window.__ab_seen = [];
    input.addEventListener('input', () => { const ex = input.closest('.attnbook-explorer');
        window.__ab_seen.push({value: Number(input.value), left: Math.round(input.getBoundingClientRect().left),
            label: input.parentNode.querySelector('.ab-value').textContent,
            frames: Array.from(ex.querySelectorAll('.ab-frame')).filter(f => getComputedStyle(f).display !== 'none')
                .map(f => Number(f.dataset.i))}); }); }"""


def _expected_frames(ex, slider):
    """The frame each value of ``slider`` shows, with the other sliders where they are."""
    base = ex.locator("input.ab-range").evaluate_all(
        "rs => rs.reduce((s, r) => s + Number(r.value) * Number(r.dataset.stride), 0)")
    value, stride, top = (int(slider.get_attribute(a) if a != "value" else slider.input_value())
                          for a in ("value", "data-stride", "max"))
    base -= value * stride
    return [base + k * stride for k in range(top + 1)]


@pytest.mark.parametrize("doc", _explorer_pages())
def test_scrubber_drags_and_steps_through_every_frame(page, book, doc):
    _open(page, book, doc)
    check_scrubbers(page, doc)


def check_scrubbers(page, doc):
    """Every scrubber on ``page``: each slider stepped by the keyboard and dragged by the mouse."""
    explorers = page.locator(".attnbook-explorer")
    assert explorers.count() >= 1, f"{doc}: the stored explorer HTML is not rendered"
    for e in range(explorers.count()):
        ex = explorers.nth(e)
        ex.scroll_into_view_if_needed()
        assert len(ex.evaluate(_STATE)) == 1, f"{doc}: not exactly one frame visible"
        sliders = ex.locator("input.ab-range")
        for s in range(sliders.count()):
            slider = sliders.nth(s)
            name = slider.get_attribute("data-name")
            labels = json.loads(slider.get_attribute("data-labels"))
            expected = _expected_frames(ex, slider)
            # the keyboard: Home, then ArrowRight through every value, each showing its frame and label
            slider.focus()
            page.keyboard.press("Home")
            for k in range(len(expected)):
                if k:
                    page.keyboard.press("ArrowRight")
                assert ex.evaluate(_STATE) == [expected[k]], f"{doc} {name}: key step {k} shows the wrong frame"
                value = slider.locator("xpath=..").locator(".ab-value").inner_text()
                assert value == labels[k], f"{doc} {name}: label {value!r} at step {k}, not {labels[k]!r}"
                img = ex.locator(f'.ab-frame[data-i="{expected[k]}"] img')
                assert img.evaluate("i => i.complete && i.naturalWidth > 0"), f"{doc} {name}: frame {k} not loaded"
            page.keyboard.press("Home")
            # the mouse: a steady drag from the first value to the last sees every frame once, in order
            slider.evaluate(_RECORD)
            slider.scroll_into_view_if_needed()
            box = slider.bounding_box()
            y = box["y"] + box["height"] / 2
            page.mouse.move(box["x"] + 2, y)
            hit = page.evaluate("([x, y]) => { const e = document.elementFromPoint(x, y);"
                                " return e ? e.outerHTML.slice(0, 80) : 'nothing'; }", [box["x"] + 2, y])
            page.mouse.down()
            x, end = box["x"] + 2, box["x"] + box["width"] + 10
            while x < end:
                x += 4
                page.mouse.move(x, y)
            page.mouse.up()
            seen = page.evaluate("window.__ab_seen")
            values = [v["value"] for i, v in enumerate(seen) if i == 0 or v["value"] != seen[i - 1]["value"]]
            assert values == list(range(len(expected)))[-len(values):] and values[-1] == len(expected) - 1, (
                f"{doc} {name}: a drag from first to last went through values {values} (range at {box}, "
                f"the drag started on {hit})")
            assert all(v["frames"] == [expected[v["value"]]] for v in seen), f"{doc} {name}: wrong frames {seen}"
            assert all(v["label"] == labels[v["value"]] for v in seen), f"{doc} {name}: wrong labels"
            lefts = {v["left"] for v in seen} | {round(box["x"])}
            assert len(lefts) == 1, f"{doc} {name}: the slider moved sideways while dragged: left edge at {lefts}"
            slider.evaluate("r => { r.value = 0; r.dispatchEvent(new Event('input')); }")  # back to the start
        SHOTS.mkdir(parents=True, exist_ok=True)
        ex.screenshot(path=str(SHOTS / f"{doc.replace('/', '_')}_explorer{e}.png"))
