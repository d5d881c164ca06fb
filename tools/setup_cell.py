"""The setup cell every chapter starts with (tests/test_notebooks.py checks it).

In Colab, or anywhere ``attnbook`` is not importable, it installs the package
from the repository declared once in ``_config.yml`` (``repository: url``).
Where attnbook is already installed (this repository's venv) it does nothing.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# attnbook setup"


def repository_url() -> str:
    """The repository address from _config.yml (a plain line scan: no YAML dependency)."""
    in_repo = False
    for line in (ROOT / "_config.yml").read_text(encoding="utf-8").splitlines():
        if line.startswith("repository:"):
            in_repo = True
        elif in_repo and line.strip().startswith("url:"):
            return line.split("url:", 1)[1].strip()
        elif line and not line.startswith((" ", "#")):
            in_repo = False
    raise RuntimeError("no repository: url: in _config.yml")


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
