"""The setup cell every chapter starts with (tests/test_notebooks.py checks it).

In Colab, or anywhere ``attnbook`` is not importable, it installs the package
from the repository declared once in ``_config.yml`` (``repository: url``).
Where attnbook is already installed (this repository's venv) it does nothing.

When the install fails (no network, a moved repository, a pip error) the cell prints nothing of pip's output
but its last error line, then stops the notebook with one line saying what failed, the URL it tried and the
command to run by hand: IPython shows that line alone (the exception's ``_render_traceback_``), and a
"Run all" stops at this cell, before the first ``import attnbook``.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: python tools/setup_cell.py
    sys.path.insert(0, str(ROOT))

from tools.bookfiles import repository_url  # noqa: E402

MARKER = "# attnbook setup"
__all__ = ["MARKER", "repository_url", "setup_source"]


def setup_source(url: str | None = None) -> str:
    url = url or repository_url()
    return (
        f"{MARKER}: in Colab (or wherever attnbook is missing) install it from the course repository.\n"
        "import importlib.util\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if importlib.util.find_spec("attnbook") is None:\n'
        f'    _spec = "attnbook @ git+{url}"\n'
        '    _pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", _spec],\n'
        "                          capture_output=True, text=True)\n"
        "    if _pip.returncode != 0:\n"
        "        class SetupFailed(RuntimeError):\n"
        "            def _render_traceback_(self):  # IPython shows this one line, not a traceback\n"
        '                return [f"SetupFailed: {self}"]\n'
        '        _why = ([line for line in _pip.stderr.splitlines() if line.strip()] or ["no message"])[-1]\n'
        "        raise SetupFailed(\n"
        f'            f"attnbook could not be installed from {url} (pip: {{_why.strip()[:300]}}). "\n'
        "            f\"Check the network and the address, then run this cell again, or in a cell: !pip install '{_spec}'\")"
    )


if __name__ == "__main__":
    print(setup_source())
