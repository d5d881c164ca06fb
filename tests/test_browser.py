"""The rendered book in a real browser: headless Chromium (Debian's), driven by playwright.

Both editions, English (_build/html/) and Chinese (_build/html/zh_CN/), page by page. Every page loads, shows
its figures and no error output, and logs no error at all (a page error or an error on the console fails
it); its math is typeset by the book's own MathJax (no raw \\( left, no MathJax error, MathJax's fonts
loaded); a Chinese page's text is drawn with real CJK glyphs, not empty boxes; each explorer's static
scrubber, dragged by the mouse from its first value to its last, shows every frame in order while the slider
stays put, and the arrow keys step through them. Every page's language link leads to the same page in the
other edition, over http and from file:// alike. Screenshots go to _build/screenshots/ for review.
Requests that leave 127.0.0.1 (CDN scripts) are blocked so that nothing here depends on the network.
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
import yaml

from tools.bookfiles import toc_files
from tools.editions import ROOT_LANGUAGE, editions, html_dir

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = os.environ.get("ATTNBOOK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT_DOC = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))["root"]
PAGES = [ROOT_DOC, *toc_files()]
EDITIONS = editions()  # "en" (the root of the HTML folder), then each translation in its own folder
EDITION_PAGES = [(language, doc) for language in EDITIONS for doc in PAGES]


def _prefix(language: str) -> str:
    """A page's path from the root of the HTML folder starts with this: "" for English, "zh_CN/" for Chinese."""
    return html_dir(language).relative_to(HTML).as_posix() + "/" if language != ROOT_LANGUAGE else ""


def _other(language: str) -> str:
    """The other edition (the book has two: a page links to the one it is not in)."""
    return next(other for other in EDITIONS if other != language)


def _ids(pairs):
    return [f"{language}:{doc}" for language, doc in pairs]

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
    unbuilt = [language for language in EDITIONS if not (html_dir(language) / f"{ROOT_DOC}.html").exists()]
    if unbuilt:
        # plain `pytest` on a fresh clone: the book is built by the test command (or `python3 tools/dev.py book`)
        _unavailable(f"the book is not built ({', '.join(unbuilt)}): run `python3 tools/dev.py book` first "
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

    pg.left_the_host = []  # every request that tried to leave the book (blocked)

    def only_local(route):
        if route.request.url.startswith((book, "data:", "blob:")):
            route.continue_()
        else:
            pg.left_the_host.append(route.request.url)
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


_MATH = r"""async () => {
    const maths = Array.from(document.querySelectorAll('article .math'));
    if (maths.length && window.MathJax && MathJax.startup) { await MathJax.startup.promise; }
    await document.fonts.ready;
    const script = document.querySelector('script[src*="tex-chtml"]');
    const prose = document.querySelector('article').cloneNode(true);  // the text, without code and outputs
    prose.querySelectorAll('pre, code, .cell_input, .cell_output').forEach(e => e.remove());
    return {count: maths.length, script: script ? script.src : null,
            typeset: maths.filter(m => m.querySelector('mjx-container')).length,
            errors: Array.from(document.querySelectorAll('article mjx-merror')).map(e => e.textContent).slice(0, 5),
            raw: (prose.textContent.match(/\\\(|\\\[/g) || []).length,
            fonts: Array.from(document.fonts).filter(f => f.family.startsWith('MJXTEX') && f.status === 'loaded')
                .map(f => f.family)};
}"""


def check_math(page, book, doc):
    """The page's math, typeset by the MathJax the book serves itself: every math element holds MathJax's
    output, none is an error (an unknown macro), no raw TeX delimiter is left, and MathJax's own fonts loaded."""
    math = page.evaluate(_MATH)
    if not math["count"]:
        return math
    assert math["script"] and math["script"].startswith(book), f"{doc}: MathJax is loaded from {math['script']}"
    assert math["typeset"] == math["count"], f"{doc}: {math['count'] - math['typeset']} of {math['count']} math " \
        "elements not typeset"
    assert not math["errors"], f"{doc}: MathJax errors {math['errors']}"
    assert math["raw"] == 0, f"{doc}: {math['raw']} raw \\( or \\[ left in the text"
    assert math["fonts"], f"{doc}: MathJax's fonts did not load"
    return math


# Each of a few characters of the page, drawn in the page's own font onto a canvas: a CJK character drawn
# with a font that has it leaves its own shape; without one, every character becomes the same empty box.
_GLYPHS = """(chars) => {
    const style = getComputedStyle(document.querySelector('article p') || document.body);
    const canvas = document.createElement('canvas'); canvas.width = canvas.height = 48;
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    ctx.font = `${style.fontStyle} ${style.fontWeight} 36px ${style.fontFamily}`;
    ctx.textBaseline = 'top';
    return chars.map(ch => { ctx.clearRect(0, 0, 48, 48); ctx.fillText(ch, 4, 4);
        const alpha = ctx.getImageData(0, 0, 48, 48).data.filter((_, i) => i % 4 === 3);
        return {ink: alpha.filter(a => a > 128).length, shape: Array.from(alpha, a => a > 128 ? 1 : 0).join('')}; });
}"""


def check_cjk_glyphs(page, doc):
    """The page's Chinese is drawn with CJK glyphs: eight distinct characters of the page (its text, or on a
    page not yet translated its navigation) each leave ink, each a different shape, none the shape of a
    character no font has (the "tofu" box)."""
    text = page.locator("article").inner_text() + page.locator("body").inner_text()
    chars = list(dict.fromkeys(c for c in text if "\u4e00" <= c <= "\u9fff"))[:8]
    assert len(chars) == 8, f"{doc}: fewer than 8 distinct Chinese characters on the page: {chars}"
    glyphs = page.evaluate(_GLYPHS, [*chars, "\U0010fffd"])  # the last: a private-use character no font draws
    tofu = glyphs.pop()["shape"]
    assert all(g["ink"] > 30 for g in glyphs), f"{doc}: characters drawn without ink: {chars}"
    assert len({g["shape"] for g in glyphs}) == len(chars) and tofu not in {g["shape"] for g in glyphs}, (
        f"{doc}: the Chinese characters {chars} are drawn as identical boxes: no CJK font (fonts-wqy-zenhei)")


@pytest.mark.parametrize(("language", "doc"), EDITION_PAGES, ids=_ids(EDITION_PAGES))
def test_page_loads_with_figures_and_no_errors(page, book, language, doc):
    doc = _prefix(language) + doc
    _open(page, book, doc)
    assert page.locator("article h1").count() >= 1, f"{doc}: no title"
    tracebacks = page.locator(".cell_output .traceback, .output.traceback, .output.error").count()
    assert tracebacks == 0, f"{doc}: {tracebacks} error output(s) on the page"
    stderr_text = " ".join(page.locator(".cell_output .output.stderr").all_inner_texts())
    assert "Error" not in stderr_text and "Traceback" not in stderr_text, f"{doc}: stderr shows {stderr_text[:300]}"
    check_math(page, book, doc)
    # the link to the same page in the other edition (which its own test opens); clicked in the tests below
    link = page.locator("a.attnbook-language")
    assert link.count() == 1 and link.first.is_visible(), f"{doc}: no visible language link in the page header"
    other = f"{book}/{_prefix(_other(language))}{doc[len(_prefix(language)):]}.html"
    assert link.first.evaluate("a => a.href") == other, f"{doc}: the language link goes to {link.first.get_attribute('href')}"
    if language != ROOT_LANGUAGE:
        assert page.evaluate("document.documentElement.lang") == language.replace("_", "-"), f"{doc}: not {language}"
        check_cjk_glyphs(page, doc)
    if doc.startswith(f"{_prefix(language)}chapters/"):
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


EXPLORER_PAGES = [(language, doc) for language in EDITIONS for doc in _explorer_pages()]


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


@pytest.mark.parametrize(("language", "doc"), EXPLORER_PAGES, ids=_ids(EXPLORER_PAGES))
def test_scrubber_drags_and_steps_through_every_frame(page, book, language, doc):
    doc = _prefix(language) + doc
    _open(page, book, doc)
    check_scrubbers(page, doc)


def _follow_language_link(page, doc_url: str, language: str) -> str:
    """Click the page's link to the other edition (one of two editions); returns where it led."""
    link = page.locator("a.attnbook-language")
    assert link.count() == 1 and link.first.is_visible(), f"{doc_url}: no visible language link"
    expected_lang = _other(language).replace("_", "-")
    assert link.first.get_attribute("hreflang") == expected_lang, f"{doc_url}: the link is not to {expected_lang}"
    with page.expect_navigation(wait_until="load"):
        link.first.click()
    assert page.evaluate("document.documentElement.lang") == expected_lang, f"{doc_url}: led to {page.url}"
    return page.url


# a few pages where the link is clicked (test_page_loads_with_figures_and_no_errors checks every page's link)
CLICKED = [ROOT_DOC, "chapters/01_soft_lookup", "glossary"]


@pytest.mark.parametrize("language", EDITIONS)
def test_language_link_leads_to_the_same_page_and_back(page, book, language):
    for doc in CLICKED:
        _open(page, book, _prefix(language) + doc)
        landed = _follow_language_link(page, page.url, language)
        assert landed == f"{book}/{_prefix(_other(language))}{doc}.html", f"{language}:{doc}: the link led to {landed}"
        assert page.locator("article h1").count() >= 1, f"{landed}: no title"
        back = _follow_language_link(page, landed, _other(language))
        assert back == f"{book}/{_prefix(language)}{doc}.html", f"{landed}: the link back led to {back}"
    assert not page.js_errors, f"JavaScript errors {page.js_errors}"


def test_language_links_work_from_files_too(browser):
    """Opened straight from the disk (file://), as a reader may open _build/html/index.html."""
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file://") else route.abort())
    try:
        for language in EDITIONS:
            for doc in CLICKED:
                start = (html_dir(language) / f"{doc}.html").as_uri()
                pg.goto(start, wait_until="load")
                landed = _follow_language_link(pg, start, language)
                assert landed == (html_dir(_other(language)) / f"{doc}.html").as_uri(), f"{start} led to {landed}"
    finally:
        ctx.close()


@pytest.mark.parametrize("language", EDITIONS)
def test_math_is_typeset_offline(page, book, language):
    """Every request that leaves the book is blocked (the page fixture); the math of chapter 6 (amsmath's
    aligned, \\text, \\operatorname) and chapter 5 (a pmatrix) is typeset all the same, by the book's MathJax."""
    for doc in ("chapters/06_transformer_block", "chapters/05_positional_encoding", "glossary"):
        _open(page, book, _prefix(language) + doc)
        math = check_math(page, book, _prefix(language) + doc)
        assert math["count"] >= 5, f"{doc}: only {math['count']} math elements: is it still the page with math?"
    assert not [url for url in page.left_the_host if "mathjax" in url.lower()], page.left_the_host
    assert not page.js_errors, f"JavaScript errors {page.js_errors}"


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
