"""The setup cell's failure path, as a learner meets it: run in a real kernel where attnbook is missing and the
install cannot succeed, it must print one readable line (what failed, the URL it tried, the command to run) and
stop the notebook there, before the next cell's ``import attnbook`` fails with a ModuleNotFoundError."""

from __future__ import annotations

import sys

import pytest

from tools.setup_cell import setup_source

BAD_URL = "file:///nonexistent/attnbook.git"  # fails at once, offline, like a moved repository


def _missing_attnbook(source: str) -> str:
    """The setup cell as it runs where attnbook is not installed (this venv has it, so its check is forced)."""
    check = 'importlib.util.find_spec("attnbook") is None'
    assert source.count(check) == 1
    return source.replace(check, "True")


def test_setup_cell_does_nothing_where_attnbook_is_installed():
    namespace: dict = {}
    exec(compile(setup_source(BAD_URL), "<setup>", "exec"), namespace)  # would raise if it tried to install
    assert "_pip" not in namespace


def test_failed_install_stops_the_notebook_with_one_readable_line():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(_missing_attnbook(setup_source(BAD_URL))),
                nbformat.v4.new_code_cell("print('the next cell ran')")]
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=False)
    with pytest.raises(nbclient.exceptions.CellExecutionError):
        client.execute()  # a "Run all" stops at the setup cell
    first, second = nb.cells
    assert second.get("outputs", []) == []  # the next cell never ran
    errors = [out for out in first.outputs if out.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "SetupFailed"
    shown = "\n".join(errors[0].traceback)
    assert len(errors[0].traceback) == 1 and "\n" not in shown, shown  # one line, no traceback
    assert BAD_URL in shown  # the URL it tried
    assert f"!pip install 'attnbook @ git+{BAD_URL}'" in shown  # the command to run
    assert "pip: " in shown and "Traceback" not in shown
    # nothing else: no pip progress, no warnings on stderr
    assert [out for out in first.outputs if out.output_type == "stream"] == []


@pytest.mark.skipif(sys.platform == "win32", reason="the kernel test covers the notebook path")
def test_failed_install_outside_ipython_is_an_ordinary_exception():
    namespace: dict = {}
    with pytest.raises(RuntimeError, match="could not be installed from file:///nonexistent"):
        exec(compile(_missing_attnbook(setup_source(BAD_URL)), "<setup>", "exec"), namespace)
