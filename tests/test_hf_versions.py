"""The chapters that call ``transformers`` run on a learner's version too, not only on the pinned 5.24.

``transformers`` renames arguments between releases (``create_causal_mask``'s ``input_embeds``/``cache_position``
in 4.x, ``past_key_values`` in 5.5 to 5.23, ``cache`` in 5.24) and moves settings (``rope_theta`` became
``rope_parameters["rope_theta"]`` in 5.0). A chapter checks each feature before it calls it and, where the
installed version lacks it, says so in one line and skips that comparison.

Two kinds of test:

* static (always run): every version-dependent call in appendix A2 sits under its feature check, and the
  feature check accepts the pinned version (so the stored outputs hold every comparison);
* live (``python3 tools/dev.py transformers-legs``, or the full ``test`` command): with an older
  ``transformers`` shadowing the pinned one (``ATTNBOOK_EXPECT_TRANSFORMERS`` names it), chapters A2, 10, 12
  and 13 are executed top to bottom and must finish without an error and without a line on stderr. The 4.57
  leg is Colab's versions (``ATTNBOOK_EXPECT_COLAB``): ipywidgets 7.7.1 and ``google.colab`` imported as well.
  Their outputs are not compared: where a comparison is skipped they differ by design; a skipped comparison
  says in one line which feature the installed version lacks.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
A2 = ROOT / "chapters" / "A2_conventions.ipynb"
CHAPTERS = [A2, *(ROOT / "chapters" / f"{name}.ipynb" for name in
                   ("10_real_model", "12_todays_models", "13_serving_and_memory", "14_models_2026"))]
EXPECT_COLAB = os.environ.get("ATTNBOOK_EXPECT_COLAB") == "1"
# printed by a cell the test puts first: what the kernel really imported
PROBE = ("import sys, ipywidgets, transformers\n"
         "print('versions:', transformers.__version__, ipywidgets.__version__, 'google.colab' in sys.modules)")
EXPECTED = os.environ.get("ATTNBOOK_EXPECT_TRANSFORMERS", "")
SKIP_LINE = "create_causal_mask lacks 5.24's arguments"

# name called or attribute read -> the name that must appear in an enclosing `if` test (the feature check)
GUARDED_CALLS = {"create_causal_mask": "hf_masks", "DynamicCache": "hf_masks"}
GUARDED_ATTRIBUTES = {"rope_parameters": "hasattr"}


def _code(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _unguarded(tree: ast.AST) -> list[str]:
    """Uses of a guarded name that no enclosing `if` (or conditional expression) checks first."""
    found: list[str] = []

    def visit(node: ast.AST, guards: tuple[str, ...]) -> None:
        if isinstance(node, (ast.If, ast.IfExp)):
            test = ast.unparse(node.test)
            visit(node.test, guards)
            for child in (node.body if isinstance(node.body, list) else [node.body]):
                visit(child, (*guards, test))
            for child in (node.orelse if isinstance(node.orelse, list) else [node.orelse]):
                visit(child, guards)
            return
        name = None
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            needed = GUARDED_CALLS.get(name or "")
        elif isinstance(node, ast.Attribute):
            name, needed = node.attr, GUARDED_ATTRIBUTES.get(node.attr)
        else:
            needed = None
        if needed and not any(needed in guard for guard in guards):
            found.append(f"line {node.lineno}: {name} without `{needed}` in an enclosing if")
        for child in ast.iter_child_nodes(node):
            visit(child, guards)

    visit(tree, ())
    return found


def test_a2_checks_each_version_dependent_feature_before_using_it():
    tree = ast.parse(_code(A2))
    assert _unguarded(tree) == []
    # the checker itself: an unguarded call and an unguarded attribute are found
    bad = ast.parse("m = create_causal_mask(config=c)\nif hf_masks:\n    ok = create_causal_mask()\nt = c.rope_parameters\n")
    assert [line.split(":")[0] for line in _unguarded(bad)] == ["line 1", "line 4"]


def test_a2_feature_check_accepts_the_pinned_transformers():
    """The set of arguments A2 asks create_causal_mask for is what the installed version offers (pinned: 5.24),
    so the stored outputs hold the comparisons and not the skip line."""
    masking_utils = pytest.importorskip("transformers.masking_utils", reason="transformers is not installed")
    if EXPECTED:
        pytest.skip(f"an older transformers ({EXPECTED}) is on the path: this test is for the pinned version")
    tree = ast.parse(_code(A2))
    wanted = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "wanted" for t in node.targets))
    assert wanted <= set(inspect.signature(masking_utils.create_causal_mask).parameters)
    outputs = json.dumps([cell.get("outputs", []) for cell in json.loads(A2.read_text())["cells"]])
    version = pytest.importorskip("transformers").__version__
    assert f"transformers {version}" in outputs and SKIP_LINE not in outputs  # stored by the pinned version


@pytest.mark.parametrize("notebook", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_under_this_transformers(notebook: Path):
    if not EXPECTED:
        pytest.skip("run by `python3 tools/dev.py transformers-legs` with an older transformers on the path "
                    "(ATTNBOOK_EXPECT_TRANSFORMERS names it)")
    transformers = pytest.importorskip("transformers")
    assert transformers.__version__ == EXPECTED, f"{transformers.__file__} is not the side folder's {EXPECTED}"
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    nb = nbformat.read(notebook, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                                     resources={"metadata": {"path": str(notebook.parent)}})
    client.execute()  # raises CellExecutionError on the first cell that fails
    probe = "".join(out.get("text", "") for out in nb.cells[0].outputs)
    colab = f"{'7.7.1' if EXPECT_COLAB else ''}"
    assert probe.startswith(f"versions: {EXPECTED} {colab}"), probe
    assert probe.strip().endswith(str(EXPECT_COLAB)), probe
    stderr = ["".join(out.get("text", "")) for cell in nb.cells if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.get("output_type") == "stream" and out.get("name") == "stderr"]
    assert stderr == [], stderr  # not a warning, not a library's note: a learner sees every line of it
    text = json.dumps([cell.get("outputs", []) for cell in nb.cells])
    assert "(TypeError)" not in text and "(AttributeError)" not in text, "a comparison skipped on an exception"
    if notebook == A2:
        assert f"transformers {EXPECTED}" in text  # the kernel imported the side folder's version
        assert text.count(SKIP_LINE) <= 1  # at most ONE line says what is skipped
