"""The rendered book in a real browser: headless Chromium (Debian's), driven by playwright.

Every chapter page loads, shows its figures and no error output; the explorers'
static scrubbers respond to the keyboard (the frame and its label change).
Screenshots go to _build/screenshots/ for review. Requests that leave 127.0.0.1
(CDN scripts) are blocked so that nothing here depends on the network.
Skips when Chromium or playwright is missing, except under CI=true, where it fails.
"""

import functools
import http.server
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

    def on_error(exc):
        # Jupyter Book 1.0.x writes sphinx-thebe's config script twice on every page; the second
        # `const THEBE_JS_URL` throws. Upstream, harmless here (no thebe), so it is the one we ignore.
        if "THEBE_JS_URL" not in str(exc):
            errors.append(str(exc))

    pg.on("pageerror", on_error)
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


@pytest.mark.parametrize("doc", _explorer_pages())
def test_scrubber_moves_frame_and_label(page, book, doc):
    _open(page, book, doc)
    explorers = page.locator(".attnbook-explorer")
    assert explorers.count() >= 1, f"{doc}: the stored explorer HTML is not rendered"
    ex = explorers.first
    ex.scroll_into_view_if_needed()
    slider = ex.locator("input.ab-range").first
    label = slider.locator("xpath=..").locator(".ab-value")

    def visible_frames():
        return ex.locator(".ab-frame").evaluate_all(
            "fs => fs.filter(f => getComputedStyle(f).display !== 'none').map(f => f.dataset.i)")

    before_frames, before_label = visible_frames(), label.inner_text()
    assert len(before_frames) == 1, f"{doc}: {len(before_frames)} frames visible at once"
    slider.focus()
    key = "ArrowLeft" if slider.input_value() == slider.get_attribute("max") else "ArrowRight"
    page.keyboard.press(key)
    after_frames, after_label = visible_frames(), label.inner_text()
    assert len(after_frames) == 1 and after_frames != before_frames, f"{doc}: the frame did not change"
    assert after_label != before_label, f"{doc}: the label stayed {before_label!r}"
    img = ex.locator(f'.ab-frame[data-i="{after_frames[0]}"] img')
    assert img.evaluate("i => i.complete && i.naturalWidth > 0"), f"{doc}: the new frame's image did not load"
    SHOTS.mkdir(parents=True, exist_ok=True)
    ex.screenshot(path=str(SHOTS / f"{doc.replace('/', '_')}_explorer.png"))
