"""The static scrubber in a real browser, without building the book: a tiny explorer's ``static_html()`` is
loaded into headless Chromium (Debian's, driven by playwright) with ``page.set_content``, and its sliders are
stepped with the keyboard, set to a value and dragged with the mouse. After every step the one frame shown,
its picture and caption and each slider's label are the ones ``Explorer.frames()`` made for those values,
and the page logs no error and requests nothing. A script that breaks only in the browser (a ``}`` that
needed its ``;`` once the lines are joined) is caught here.
Skips when Chromium or playwright is missing, except under CI=true, where it fails.
"""

from __future__ import annotations

import base64
import os
import shutil

import pytest

from attnbook.explorers.base import ScrubberTemplate
from tests.test_scrubber import HTML, tiny_explorer

# as tests/test_browser.py (Debian's chromium; never `playwright install`)
CHROMIUM = os.environ.get("ATTNBOOK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.browser

# what the scrubber shows: the visible frames' numbers, the shown image's src and caption, the sliders' labels
_SHOWN = """ex => { const shown = Array.from(ex.querySelectorAll('.ab-frame'))
        .filter(f => getComputedStyle(f).display !== 'none');
    return {frames: shown.map(f => Number(f.dataset.i)),
            src: shown.length ? shown[0].querySelector('img').getAttribute('src') : null,
            loaded: shown.length ? shown[0].querySelector('img').naturalWidth > 0 : false,
            caption: shown.length ? shown[0].querySelector('.ab-caption').textContent : null,
            labels: Array.from(ex.querySelectorAll('.ab-value')).map(o => o.textContent),
            values: Array.from(ex.querySelectorAll('input.ab-range')).map(r => Number(r.value))}; }"""

# records what every input event left on the page (the drag)
_RECORD = """input => { window.__seen = [];
    input.addEventListener('input', () => window.__seen.push((""" + _SHOWN + """)(input.closest('.attnbook-explorer')))); }"""


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (required under CI=true: .ci/run installs chromium with apt-get)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        _unavailable(f"Chromium not found at {CHROMIUM}: apt-get install -y chromium, or set ATTNBOOK_CHROMIUM")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def tiny():
    """The tiny explorer, its scrubber and its frames ``(values, png, caption)`` in the scrubber's order."""
    ex = tiny_explorer()
    return ex, ex.static_html(), list(ex.frames())


@pytest.fixture
def open_page(browser):
    """``open_page(html)``: a page showing ``html``; ``page.errors`` collects page and console errors and
    ``page.requests`` every request (a self-contained scrubber makes none)."""
    ctx = browser.new_context(viewport={"width": 900, "height": 700})

    def open_(html: str):
        pg = ctx.new_page()
        pg.errors, pg.requests = [], []
        pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
        pg.on("console", lambda msg: pg.errors.append(f"console: {msg.text}") if msg.type == "error" else None)
        pg.on("request", lambda req: None if req.url.startswith("data:") else pg.requests.append(req.url))
        pg.route("**/*", lambda route: route.abort())
        pg.set_content(f"<!doctype html><html><body>{html}</body></html>", wait_until="load")
        return pg

    yield open_
    ctx.close()


def _expected(ex, frames, n: int, mode: int) -> dict:
    """What the scrubber must show with slider n at position ``n`` and slider mode at ``mode``."""
    i = n * 2 + mode  # n varies slowest; colour is fixed
    values, png, caption = frames[i]
    assert values["n"] == ex.control("n").static_values[n] and values["mode"] == ex.control("mode").static_values[mode]
    return {"frames": [i], "src": "data:image/png;base64," + base64.b64encode(png).decode("ascii"), "loaded": True,
            "caption": caption, "values": [n, mode],
            "labels": [ex.control("n").fmt(values["n"]), ex.control("mode").fmt(values["mode"])]}


def test_scrubber_steps_through_every_frame(open_page, tiny):
    ex, html, frames = tiny
    assert len(frames) == 6 and len({png for _, png, _ in frames}) == 6  # each frame is a different picture
    page = open_page(html)
    root = page.locator(".attnbook-explorer")
    n_slider, mode_slider = root.locator('input.ab-range[data-name="n"]'), root.locator('input.ab-range[data-name="mode"]')

    def shows(n: int, mode: int, how: str) -> None:
        assert root.evaluate(_SHOWN) == _expected(ex, frames, n, mode), f"{how}: not frame n={n}, mode={mode}"

    shows(1, 0, "at first")  # the explorer's values: n=2 (position 1), mode=up
    assert root.get_by_text("colour = red (run the notebook to change these)").count() == 1

    # the keyboard
    n_slider.focus()
    page.keyboard.press("Home")
    shows(0, 0, "Home")
    for n in (1, 2):
        page.keyboard.press("ArrowRight")
        shows(n, 0, f"ArrowRight to {n}")
    page.keyboard.press("ArrowRight")  # already at the end
    shows(2, 0, "ArrowRight at the end")
    mode_slider.focus()
    page.keyboard.press("ArrowRight")
    shows(2, 1, "mode ArrowRight")
    n_slider.focus()
    page.keyboard.press("ArrowLeft")
    shows(1, 1, "ArrowLeft")
    page.keyboard.press("Home")
    shows(0, 1, "Home with mode down")
    page.keyboard.press("End")
    shows(2, 1, "End")

    # setting the value (fill sets it and fires input, as the browser does for a user)
    for n in (0, 2, 1):
        n_slider.fill(str(n))
        shows(n, 1, f"value set to {n}")
    mode_slider.fill("0")
    shows(1, 0, "mode set to 0")

    assert not page.errors, page.errors
    assert not page.requests, f"the scrubber requested {page.requests}"


def test_scrubber_follows_a_drag(open_page, tiny):
    ex, html, frames = tiny
    page = open_page(html)
    root = page.locator(".attnbook-explorer")
    slider = root.locator('input.ab-range[data-name="n"]')
    slider.fill("0")
    slider.evaluate(_RECORD)
    box = slider.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 2, y)
    page.mouse.down()
    x = box["x"] + 2
    while x < box["x"] + box["width"] + 10:
        x += 8
        page.mouse.move(x, y)
    page.mouse.up()
    seen = page.evaluate("window.__seen")
    positions = [s["values"][0] for k, s in enumerate(seen) if k == 0 or s["values"] != seen[k - 1]["values"]]
    assert positions == [1, 2], f"a drag from the first value to the last went through {positions}"
    for s in seen:
        brief = {k: v for k, v in s.items() if k != "src"}
        assert s == _expected(ex, frames, s["values"][0], 0), f"during the drag: {brief} (or another picture)"
    assert root.evaluate(_SHOWN) == _expected(ex, frames, 2, 0)
    assert not page.errors, page.errors


def test_a_script_that_breaks_in_the_browser_is_caught(open_page):
    # passes ScrubberTemplate.parse (each line ends with } or ;), but joined into one line the function
    # expression's } is followed by more code without the ; that a line break used to insert: a SyntaxError
    # that only the browser sees, when the slider first moves
    template = ScrubberTemplate.parse(HTML, "var f=function(){}\nf();\n")
    assert template.script == "var f=function(){}f();"
    page = open_page(tiny_explorer().static_html(template))
    page.locator('input.ab-range[data-name="n"]').fill("0")
    assert page.errors and all("Unexpected identifier 'f'" in e for e in page.errors), page.errors
    assert page.locator(".ab-value").first.text_content() == "2 x"  # and the label did not move
