"""The README's two commands.

    python3 tools/dev.py book   # install what is needed, build the book, print where the HTML is
    python3 tools/dev.py test   # install what is needed, run every check (what CI runs)

Both create (or reuse) a virtual environment in .venv and install
requirements.txt into it; a stamp file skips the install while requirements.txt
and pyproject.toml are unchanged. Needs Python >= 3.10 with pip and venv.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
W7 = ROOT / ".venv-ipywidgets7"  # ipywidgets 7.7.1 (Colab's version), shadowing 8 for one test run
CHROMIUM = "/usr/bin/chromium"


def run(*cmd, env=None, check=True) -> int:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    rc = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)
    if check and rc != 0:
        sys.exit(f"failed (exit {rc}): {' '.join(str(c) for c in cmd)}")
    return rc


def ensure_venv() -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 (the point: a clear message on an old Python)
        sys.exit(f"Python >= 3.10 is needed, this is {sys.version.split()[0]}")
    if not PY.exists():
        run(sys.executable, "-m", "venv", VENV)
    stamp = VENV / ".attnbook-requirements"
    nodeps = ROOT / "requirements-nodeps.txt"
    digest = hashlib.sha256(
        (ROOT / "requirements.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
        + (nodeps.read_bytes() if nodeps.exists() else b"")
    ).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    run(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
    run(PY, "-m", "pip", "install", "-r", "requirements.txt")
    if nodeps.exists():  # third-party wrappers and test-only references, installed without their dependencies
        run(PY, "-m", "pip", "install", "--no-deps", "-r", nodeps.name)
    stamp.write_text(digest)


def ensure_ipywidgets7() -> Path:
    marker = W7 / "ipywidgets-7.7.1.marker"
    if not marker.exists():
        shutil.rmtree(W7, ignore_errors=True)
        run(PY, "-m", "pip", "install", "-q", "--no-deps", "--target", W7, "ipywidgets==7.7.1", "ipython_genutils==0.2.0")
        marker.write_text("ok")
    return W7


def ensure_chromium() -> None:
    """Debian's chromium for the browser tests, and a CJK font so that screenshots of the
    glossary show its Chinese terms (readers' browsers have one; a bare server does not)."""
    wanted = {"chromium": Path(CHROMIUM).exists(), "fonts-wqy-zenhei": Path("/usr/share/fonts/truetype/wqy").exists()}
    missing = [pkg for pkg, present in wanted.items() if not present]
    if not missing:
        return
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run("apt-get", "update", "-qq", env=env)
        run("apt-get", "install", "-y", "-qq", *missing, env=env)
    else:
        print(f"! {', '.join(missing)} not installed (apt-get install as root): "
              "the browser tests skip without Chromium.")


def build_book(strict: bool) -> None:
    cmd = [BIN / "jupyter-book", "build", "--all"]
    if strict:
        cmd += ["-W", "--keep-going"]
    run(*cmd, ".")


def book() -> None:
    ensure_venv()
    build_book(strict=False)
    print(f"\nThe book is at {ROOT / '_build' / 'html' / 'index.html'}")


def test() -> None:
    ensure_venv()
    ensure_chromium()
    w7 = ensure_ipywidgets7()
    env = {**os.environ, "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    # 1. lint the package, tests, benchmarks, tools and the notebooks
    run(BIN / "ruff", "check", "attnbook", "tests", "bench", "tools", "chapters", env=env)
    # 2. the book, strictly: any warning (a broken reference, an unreadable notebook) fails
    build_book(strict=True)
    # 3. the widget tests again under ipywidgets 7.7.1 (what Colab ships)
    env7 = {**env, "PYTHONPATH": os.pathsep.join([str(w7), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "ATTNBOOK_EXPECT_IPYWIDGETS": "7"}
    run(PY, "-m", "pytest", "-q", "tests/test_widgets.py", "tests/test_explorer.py", env=env7)
    # 4. everything: unit tests, notebook hygiene, browser tests, nbval strict over every chapter
    run(PY, "-m", "pytest", "tests", "chapters",
        "--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/sanitize.cfg",
        "--nbval-cell-timeout=600", "-n", "2", "--dist", "loadfile", "-rs", env=env)


if __name__ == "__main__":
    commands = {"book": book, "test": test}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]]()
