"""The live explorers as a learner uses them: JupyterLab 4 with ipywidgets 8, in headless Chromium.

The test starts its own JupyterLab server on 127.0.0.1 (a free port, a token, a temporary folder holding
one notebook), opens the notebook, runs its explorer cells and checks what the reader sees:

* every control shows its whole description, beside its control (not cut to "sequence ...", not above);
* each figure is shown at its own size (at most the output's width), never stretched: the displayed width
  is at most 1.25 times the figure's size in CSS pixels, and the image has at least 1.9 device pixels per
  CSS pixel (sharp on a high-density screen);
* in a narrow output column (332 px, what a 700 px window with the file browser open leaves) each figure
  keeps at least 90% of its size (text of 9 px or more) in a box that scrolls sideways inside the output,
  and the ViT explorer's drawing grid shows all its 64 pixels, with its buttons, inside the output;
* moving a control (a slider by the keyboard, a toggle button by a click, a dropdown) changes the image;
* clicking a pixel of the ViT explorer's drawing grid shows the drawing ("your drawing" in the image choice),
  and so does loading a stored drawing;
* in a narrow window (700 px) every control's description still shows whole (beside its control, or above
  toggle buttons that wrap), and the device dropdown's hint is shown.

Screenshots go to _build/screenshots/. Skips when JupyterLab, Chromium or playwright is missing, except
under CI=true, where it fails.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, ROOT, SHOTS, _unavailable

pytestmark = pytest.mark.browser

TOKEN = "attnbook-test-token"
CELLS = [
    "from attnbook.explorers import heads_explorer, masks_explorer, saturation_explorer\n"
    "saturation = saturation_explorer()\nsaturation",
    "heads = heads_explorer()\nheads.update(num_heads=1)\nheads",
    "masks = masks_explorer()\nmasks",
    "import torch\nfrom attnbook.vision import VisionTransformer, load_digits_split\n"
    "from attnbook.explorers import vit_explorer\n_ = torch.manual_seed(0)\n"
    "*_, x_test, y_test = load_digits_split()\n"
    "vit = vit_explorer(VisionTransformer(), x_test[:8], y_test[:8], static_digits=1)\nvit",
    "from attnbook.explorers import kv_heads_explorer\nfrom attnbook.explorers.kv_heads import HEADS, SEQ_LENS\n"
    "from tests.helpers import fake_decode_timings\n"
    "kv = kv_heads_explorer(fake_decode_timings(HEADS, SEQ_LENS), static_num_heads=(32,), static_seq_len=(4096,))\nkv",
]


def _notebook(path: Path) -> None:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": src} for i, src in enumerate(CELLS)]
    nb = {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                      "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb), encoding="utf-8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        _unavailable(f"Chromium not found at {CHROMIUM}: apt-get install -y chromium, or set ATTNBOOK_CHROMIUM")
    try:
        import jupyterlab  # noqa: F401
        import playwright.sync_api  # noqa: F401
    except ImportError as err:
        _unavailable(f"{err.name} is not installed (requirements.txt pins it)")
    home = tmp_path_factory.mktemp("lab")
    _notebook(home / "explorers.ipynb")
    settings = home / ".settings"
    for plugin, values in {"notebook-extension/tracker": {"autoStartDefaultKernel": True},
                           "apputils-extension/notification": {"fetchNews": "false"}}.items():
        folder, name = plugin.split("/")
        (settings / "@jupyterlab" / folder).mkdir(parents=True, exist_ok=True)
        (settings / "@jupyterlab" / folder / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / ".config"), "JUPYTER_RUNTIME_DIR": str(home / ".run"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={home}",
           f"--LabApp.workspaces_dir={home / '.workspaces'}", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "server.log", "wb")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(cmd, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start: {(home / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def notebook(lab):
    """The notebook open in JupyterLab with every explorer cell run (one browser page for all checks)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
        page = ctx.new_page()
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(lab) else route.abort())
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{lab}/lab/tree/explorers.ipynb?token={TOKEN}", wait_until="load")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
        select = page.locator(".jp-Dialog button", has_text="Select")
        if select.count():  # the kernel dialog, should the setting above not take
            select.first.click()
        images = page.locator(".jp-OutputArea-output .widget-image")
        deadline = time.monotonic() + 90
        for i in range(len(CELLS)):  # one cell at a time: Shift+Enter again while a cell has not started
            cell = page.locator(".jp-Notebook .jp-Cell").nth(i)
            cell.locator(".jp-InputPrompt").click()
            page.keyboard.press("Escape")
            page.keyboard.press("Shift+Enter")
            started = time.monotonic()
            while images.count() <= i or not _loaded(images.nth(i)):
                if time.monotonic() > deadline:
                    break
                if "[ ]" in cell.locator(".jp-InputPrompt").inner_text() and time.monotonic() - started > 5:
                    cell.locator(".jp-InputPrompt").click()
                    page.keyboard.press("Shift+Enter")
                    started = time.monotonic()
                page.wait_for_timeout(250)
        while images.count() < len(CELLS) or not all(_loaded(images.nth(i)) for i in range(len(CELLS))):
            if time.monotonic() > deadline:
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS / "jupyterlab_failed.png"))
                outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
                pytest.fail(f"{images.count()} of {len(CELLS)} explorers appeared; outputs: {outputs}; "
                            f"page errors: {errors}")
            page.wait_for_timeout(250)
        page.page_errors = errors
        yield page
        ctx.close()
        browser.close()


def _loaded(img) -> bool:
    return bool(img.evaluate("i => i.complete && i.naturalWidth > 0"))


def _explorer(page, i):
    return page.locator(".jp-Cell").nth(i).locator(".jp-OutputArea-output .widget-vbox").first


def _shot(page, i, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    _explorer(page, i).screenshot(path=str(SHOTS / f"jupyterlab_{name}.png"))


@pytest.mark.parametrize("i, name", list(enumerate(["saturation", "heads_1", "masks", "vit", "kv_heads"])))
def test_figure_is_shown_at_its_own_size_and_sharp(notebook, i, name):
    box = _explorer(notebook, i)
    box.scroll_into_view_if_needed()
    img = box.locator(".widget-image")
    size = img.evaluate("i => ({natural: i.naturalWidth, shown: i.getBoundingClientRect().width,"
                        " room: i.closest('.jp-OutputArea-output').getBoundingClientRect().width})")
    _shot(notebook, i, name)
    assert size["shown"] <= size["room"] + 1, f"{name}: {size}: wider than the output"
    assert size["natural"] >= 1.9 * size["shown"], f"{name}: {size}: fewer than 2 image pixels per CSS pixel"
    assert size["shown"] <= 1.25 * size["natural"] / 2, f"{name}: {size}: stretched beyond its own size"
    assert size["shown"] < 0.95 * size["room"] or name == "saturation", f"{name}: {size}: fills the output"
    assert not notebook.page_errors, notebook.page_errors


def _labels(box):
    return box.locator(".widget-label, .widget-label-basic").evaluate_all(
        "ls => ls.filter(l => l.textContent.trim()).map(l => {const r = l.getBoundingClientRect();"
        " const c = l.nextElementSibling && l.nextElementSibling.getBoundingClientRect();"
        " return {text: l.textContent, cut: l.scrollWidth > l.clientWidth + 1,"
        " beside: !c || (c.left >= r.right - 1 && c.top < r.bottom && r.top < c.bottom)}})")


def test_every_control_description_shows_whole_beside_its_control(notebook):
    for i in range(len(CELLS)):
        labels = _labels(_explorer(notebook, i))
        assert labels, f"explorer {i}: no control descriptions found"
        for label in labels:
            assert not label["cut"], f"explorer {i}: {label['text']!r} is cut off"
            assert label["beside"], f"explorer {i}: {label['text']!r} is not beside its control"


def _src(page, i):
    return _explorer(page, i).locator(".widget-image").get_attribute("src")


def _wait_change(page, i, before, what):
    deadline = time.monotonic() + 15
    while _src(page, i) == before:
        assert time.monotonic() < deadline, f"explorer {i}: the image did not change after {what}"
        page.wait_for_timeout(100)


def test_moving_a_control_changes_the_image(notebook):
    page = notebook
    # the saturation explorer: the d_k slider by the keyboard, then the scaling toggle by a click
    before = _src(page, 0)
    handle = _explorer(page, 0).locator(".widget-slider .noUi-handle, .widget-slider .ui-slider-handle").first
    handle.focus()
    page.keyboard.press("ArrowRight")
    _wait_change(page, 0, before, "a slider step")
    before = _src(page, 0)
    _explorer(page, 0).locator(".widget-toggle-button").filter(has_text="off").click()
    _wait_change(page, 0, before, "a toggle click")
    # the masks explorer: the mask dropdown
    before = _src(page, 2)
    _explorer(page, 2).locator("select").first.select_option(label="padding")
    _wait_change(page, 2, before, "a dropdown choice")
    _shot(page, 0, "saturation_moved")
    assert not page.page_errors, page.page_errors


def test_drawing_a_pixel_shows_the_drawing(notebook):
    page = notebook
    box = _explorer(page, 3)
    pixels = box.locator(".widget-gridbox button")
    assert pixels.count() == 64, f"{pixels.count()} pixel buttons in the ViT explorer's drawing grid"
    before = _src(page, 3)
    pixels.nth(0).scroll_into_view_if_needed()
    pixels.nth(0).click()
    _wait_change(page, 3, before, "a click on a pixel of the drawing grid")
    choice = box.locator("select").first.evaluate("s => s.options[s.selectedIndex].text")
    assert choice.replace("\xa0", " ").startswith("your drawing"), choice
    before = _src(page, 3)
    box.locator("button", has_text="clear").click()
    _wait_change(page, 3, before, "clear")
    before = _src(page, 3)
    box.locator("select").nth(1).select_option(index=4)  # the menu of stored drawings: a 1
    _wait_change(page, 3, before, "loading a stored drawing")
    inked = pixels.evaluate_all("bs => bs.filter(b => getComputedStyle(b).backgroundColor !== 'rgb(255, 255, 255)').length")
    assert inked > 8, f"{inked} pixels of the stored drawing are inked on the grid"
    _shot(page, 3, "vit_drawn")
    assert not page.page_errors, page.page_errors


def test_a_narrow_window_cuts_no_description(notebook):
    """At 700 px (the window the "KV heads" description was cut in): each description whole, the toggle
    buttons wrapping instead; the device dropdown's hint says what the choice means."""
    page = notebook
    page.set_viewport_size({"width": 700, "height": 900})
    try:
        page.wait_for_timeout(1000)
        for i in range(len(CELLS)):
            for label in _labels(_explorer(page, i)):
                assert not label["cut"], f"explorer {i} at 700 px: {label['text']!r} is cut off"
        box = _explorer(page, 4)
        box.scroll_into_view_if_needed()
        box.screenshot(path=str(SHOTS / "jupyterlab_kv_heads_700px.png"))
        hint = box.locator(".widget-html-content", has_text=re.compile("only the CPU here|where the tensors are computed"))
        assert hint.count() == 1 and hint.first.is_visible()
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})


NARROW = 332  # px: the output column of a 700 px window with JupyterLab's file browser open


def test_a_narrow_output_column_keeps_figures_readable_and_the_pad_whole(notebook):
    page = notebook
    style = page.add_style_tag(content=f".jp-OutputArea-output {{ max-width: {NARROW}px !important; }}")
    try:
        page.wait_for_timeout(1000)
        for i, name in enumerate(["saturation", "heads_1", "masks", "vit", "kv_heads"]):
            box = _explorer(page, i)
            box.scroll_into_view_if_needed()
            size = box.locator(".widget-image").evaluate(
                "i => { const o = i.closest('.jp-OutputArea-output').getBoundingClientRect();"
                " const b = i.parentElement; const r = b.getBoundingClientRect();"
                " return {natural: i.naturalWidth, shown: i.getBoundingClientRect().width, room: o.width,"
                " box_right: r.right, out_right: o.right, scrolls: b.scrollWidth > b.clientWidth + 1}; }")
            own = size["natural"] / 2  # the figure's size in CSS pixels (2 image pixels per CSS pixel)
            assert size["shown"] >= 0.9 * own - 1, f"{name} in {NARROW} px: {size}: shrunk below 90%"
            assert size["box_right"] <= size["out_right"] + 1, f"{name} in {NARROW} px: {size}: box overflows"
            assert size["scrolls"] == (0.9 * own > size["room"] + 1), f"{name} in {NARROW} px: {size}"
            for label in _labels(box):
                assert not label["cut"], f"{name} in {NARROW} px: {label['text']!r} is cut off"
            box.screenshot(path=str(SHOTS / f"jupyterlab_{name}_{NARROW}px.png"))
        box = _explorer(page, 3)
        inside = box.locator(".widget-gridbox button, button:has-text('clear'), button:has-text('copy')")
        bounds = inside.evaluate_all(
            "bs => bs.map(b => { const o = b.closest('.jp-OutputArea-output').getBoundingClientRect();"
            " const r = b.getBoundingClientRect();"
            " return r.width > 0 && r.left >= o.left - 1 && r.right <= o.right + 1; })")
        assert len(bounds) == 66 and all(bounds), f"{bounds.count(False)} of the pad's buttons outside the output"
        assert not page.page_errors, page.page_errors
    finally:
        style.evaluate("s => s.remove()")
        page.wait_for_timeout(500)
