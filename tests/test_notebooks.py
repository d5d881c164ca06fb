"""Every chapter is committed executed, error-free, listed in the table of
contents, starts with the shared setup cell, and ends with self-checking exercises."""

import json
import re
from pathlib import Path

import nbformat
import pytest

from tools.bookfiles import toc_files
from tools.execute import differences, is_solution, pair
from tools.setup_cell import MARKER, repository_url, setup_source

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9A-Z][0-9]_*.ipynb"))  # chapters NN_, appendices A1_, A2_, ...
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def _code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/NN_topic.ipynb found"


def test_toc_lists_exactly_the_chapters():
    listed = {f for f in toc_files() if f.startswith("chapters/")}
    present = {f"chapters/{p.stem}" for p in CHAPTERS}
    assert listed == present, f"in _toc.yml but missing: {listed - present}; not in _toc.yml: {present - listed}"
    for f in toc_files():
        assert any((ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb")), f"_toc.yml lists missing {f}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_text_source_and_notebook_are_in_sync(path):
    """Each chapter is a jupytext pair: the .md source (MyST Markdown) and the executed .ipynb, cell for cell."""
    found = differences(*pair(path))
    assert not found, f"{path.name}: {'; '.join(found)} (run tools/execute.py {pair(path)[0].relative_to(ROOT)})"


def test_every_text_source_has_a_notebook():
    orphans = [p.name for p in (ROOT / "chapters").glob("*.md") if not p.with_suffix(".ipynb").exists()]
    assert not orphans, f"chapter sources without an executed notebook: {orphans} (run tools/execute.py)"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_every_code_cell_executed_without_errors(path):
    nb = _load(path)
    cells = _code_cells(nb)
    unrun = [i for i, c in enumerate(cells) if c.get("execution_count") is None]
    assert not unrun, f"{path.name}: code cells {unrun} were never executed (run tools/execute.py)"
    counts = [c["execution_count"] for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: not executed top to bottom in one run: {counts}"
    errors = [(i, o.get("ename")) for i, c in enumerate(cells) for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{path.name}: stored error outputs {errors}"
    size = path.stat().st_size / 1e6
    assert size < 3, f"{path.name} is {size:.1f} MB; keep chapters lean"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_setup_cell_comes_first_and_matches_the_repository(path):
    nb = _load(path)
    first = "".join(_code_cells(nb)[0]["source"])
    assert first.startswith(MARKER), f"{path.name}: the first code cell is not the setup cell"
    assert first == setup_source(), f"{path.name}: the setup cell differs from tools/setup_cell.py's"
    urls = set(re.findall(r"git\+(\S+?)\"", "".join("".join(c["source"]) for c in nb["cells"])))
    assert urls == {repository_url()}, f"{path.name}: install URLs {urls} != _config.yml's {repository_url()}"


def test_repository_url_is_declared_once_and_used_by_readme_and_intro():
    url = repository_url()
    assert url.startswith("https://")
    for doc in ("README.md", "intro.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        for found in re.findall(r"git\+(https://\S+?)[\"'`\s)]", text):
            assert found == url, f"{doc} installs from {found}, _config.yml says {url}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_exercises_have_hidden_self_checking_solutions(path):
    nb = _load(path)
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "## Exercises" in text, f"{path.name} has no '## Exercises' section"
    solutions = [c for c in _code_cells(nb) if "hide-input" in c.get("metadata", {}).get("tags", [])
                 and "assert" in "".join(c["source"]) and "check(" in "".join(c["source"])]
    assert len(solutions) >= 2, f"{path.name}: expected hidden solution cells that assert and check()"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_explorer_outputs_carry_a_static_fallback_and_the_ignore_tag(path):
    for c in _code_cells(_load(path)):
        for o in c["outputs"]:
            data = o.get("data", {})
            if WIDGET_VIEW in data:
                tags = c.get("metadata", {}).get("tags", [])
                assert "nbval-ignore-output" in tags, f"{path.name}: explorer cell without nbval-ignore-output"
                html = "".join(data.get("text/html", ""))
                assert 'class="attnbook-explorer"' in html, f"{path.name}: widget output without a static scrubber"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_seeded(path):
    src = "\n".join("".join(c["source"]) for c in _code_cells(_load(path)))
    if "import torch" in src:
        assert "_ = torch.manual_seed(0)" in src, f"{path.name} imports torch but does not seed it"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_solutions_are_folded_in_jupyter_and_colab_too(path):
    """The book folds `hide-input` cells; JupyterLab needs `jupyter.source_hidden`, Colab its form view."""
    nb = nbformat.read(path, as_version=4)
    solutions = [c for c in nb.cells if is_solution(c)]
    assert solutions, f"{path.name}: no exercise solutions found"
    for c in nb.cells:
        if "hide-input" in c.metadata.get("tags", []):
            assert c.metadata.get("jupyter", {}).get("source_hidden") is True, \
                f"{path.name}: a hide-input cell is not folded in Jupyter: {c.source[:60]!r} (run tools/execute.py)"
    for c in solutions:
        assert c.metadata.get("cellView") == "form" and c.source.startswith("# @title"), \
            f"{path.name}: a solution is not folded in Colab (cellView: form and a # @title line): {c.source[:60]!r}"
