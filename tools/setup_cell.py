"""The setup cell every chapter starts with (tests/test_notebooks.py checks it).

In Colab, or anywhere ``attnbook`` is not importable, it installs the package
from the repository declared once in ``_config.yml`` (``repository: url``).
Where attnbook is already installed (this repository's venv) it does nothing.
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
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",\n'
        f'                    "attnbook @ git+{url}"], check=True)'
    )


if __name__ == "__main__":
    print(setup_source())
