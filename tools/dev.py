"""The README's two commands, and the developer's shortcuts.

    python3 tools/dev.py book                  # install what is needed, build the book in English and Chinese,
                                               # print where each is (_build/html/, _build/html/zh_CN/), and
                                               # put the live explorers' files in _build/html/_static/live/
    python3 tools/dev.py catalogs              # after English prose changed: update the Chinese message catalogs
    python3 tools/dev.py test                  # install what is needed, run every check (what CI runs)
    python3 tools/dev.py test --fast           # ruff, mypy and the unit tests, without the slow and browser ones
    python3 tools/dev.py test -- -k masks      # everything after -- goes to pytest
    python3 tools/dev.py transformers-legs     # chapters A2, 10, 12, 13, 14 under older transformers (4.57, 5.23)
    python3 tools/dev.py nbval [--perturb P] [chapters ...]
                                               # nbval strict over chapters, in the normal numerical environment
                                               # or a perturbed one (P: mkl, aten, threads, avx2, combined, all)

Both create (or reuse) a virtual environment in .venv and install requirements.txt into it; a stamp file
skips the install while requirements.txt and pyproject.toml are unchanged. Needs Python >= 3.10 with pip and
venv. Chromium (for the browser tests), the ipywidgets 7 target and the older transformers are best effort:
without them the commands go on and those tests skip with a message, except under CI=true, where they fail.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
W7 = ROOT / ".venv-ipywidgets7"  # ipywidgets 7.7.1 (Colab's version), shadowing 8 for one test run
# Older transformers that learners have (Colab ships its own), each in a side folder shadowing the pinned 5.24
# for one test run, installed without dependencies. 5.23 imports with the pinned tokenizers and huggingface_hub;
# no 4.x does (4.57 wants huggingface_hub < 1.0 and tokenizers <= 0.23.0), so its leg brings its contemporaries.
OLD_TRANSFORMERS = {
    "4.57.6": ["transformers==4.57.6", "tokenizers==0.22.2", "huggingface_hub==0.36.2"],
    "5.23.0": ["transformers==5.23.0"],
}
CHROMIUM = os.environ.get("ATTNBOOK_CHROMIUM", "/usr/bin/chromium")
IN_CI = os.environ.get("CI", "").lower() == "true"

# Other machines compute floats differently: another BLAS code path, PyTorch's kernels without vector
# instructions, another split of the reductions over threads. A stored output must read the same under each.
PERTURBATIONS = {
    "mkl": {"MKL_CBWR": "COMPATIBLE"},
    "aten": {"ATEN_CPU_CAPABILITY": "default"},
    # passive waiting: two workers of two threads each share two cores without OpenMP spinning against itself
    "threads": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    # a 4-thread laptop with AVX2 and no AVX-512: other vector kernels, other BLAS paths, another thread split
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"},
}
# The test command runs two perturbed legs: one with the first three at once (a machine that differs in every
# way), and the AVX2 laptop, whose settings conflict with the first; `nbval --perturb all` runs the four one by one.
COMBINED = {k: v for name in ("mkl", "aten", "threads") for k, v in PERTURBATIONS[name].items()}
PERTURBED_LEGS = ["combined", "avx2"]
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/sanitize.cfg", "--nbval-cell-timeout=600"]


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


def ensure_ipywidgets7() -> Path | None:
    """ipywidgets 7.7.1 in a side folder (best effort: None when it cannot be installed, e.g. offline)."""
    marker = W7 / "ipywidgets-7.7.1.marker"
    if not marker.exists():
        shutil.rmtree(W7, ignore_errors=True)
        rc = run(PY, "-m", "pip", "install", "-q", "--no-deps", "--target", W7, "ipywidgets==7.7.1",
                 "ipython_genutils==0.2.0", check=IN_CI)
        if rc != 0:
            print("! ipywidgets 7.7.1 could not be installed: the Colab-version widget leg is skipped")
            return None
        marker.write_text("ok")
    return W7


def ensure_old_transformers(version: str) -> Path | None:
    """transformers `version` (and what OLD_TRANSFORMERS lists with it) in a side folder, best effort."""
    folder = ROOT / f".venv-transformers-{version.rsplit('.', 1)[0]}"
    marker = folder / f"transformers-{version}.marker"
    if not marker.exists():
        shutil.rmtree(folder, ignore_errors=True)
        rc = run(PY, "-m", "pip", "install", "-q", "--no-deps", "--target", folder, *OLD_TRANSFORMERS[version],
                 check=IN_CI)
        if rc != 0:
            print(f"! transformers {version} could not be installed: its leg is skipped")
            return None
        marker.write_text("ok")
    return folder


COLAB_STUB = ROOT / ".venv-colab-stub"
# The chapters that call transformers, run top to bottom under each older version (tests/test_hf_versions.py).
LEG_CHAPTERS = "A2, 10, 12, 13 and 14"


def ensure_colab_stub() -> Path:
    """A folder that makes a kernel look like Colab's: an empty `google.colab` module, imported at start-up by a
    sitecustomize (Colab imports it before any cell runs; the explorers check `"google.colab" in sys.modules`)."""
    (COLAB_STUB / "google" / "colab").mkdir(parents=True, exist_ok=True)
    (COLAB_STUB / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s module (tests only)."""\n')
    (COLAB_STUB / "sitecustomize.py").write_text("import google.colab  # noqa: F401  (what Colab has imported)\n")
    return COLAB_STUB


def old_transformers_legs(env: dict) -> None:
    """Chapters A2, 10, 12, 13 and 14 executed top to bottom under each older transformers (tests/test_hf_versions.py).
    The 4.57 leg is Colab's versions: transformers 4.57, ipywidgets 7.7.1 and `google.colab` imported."""
    for version in OLD_TRANSFORMERS:
        folder = ensure_old_transformers(version)
        if folder is None:
            continue
        started = time.perf_counter()
        colab = version.startswith("4.")
        w7 = ensure_ipywidgets7() if colab else None
        shadows = [str(folder)] + ([str(w7), str(ensure_colab_stub())] if w7 is not None else [])
        print(f"\n== chapters {LEG_CHAPTERS} under transformers {version}"
              + (" (Colab's versions: ipywidgets 7.7.1, google.colab imported)" if w7 is not None else ""), flush=True)
        env_old = {**env, "ATTNBOOK_EXPECT_TRANSFORMERS": version,
                   **({"ATTNBOOK_EXPECT_COLAB": "1"} if w7 is not None else {}),
                   "PYTHONPATH": os.pathsep.join([*shadows, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        run(PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_hf_versions.py", "-k",
            "runs_under_this_transformers", "-rs", "-n", "2", env=env_old)
        print(f"transformers {version}: {time.perf_counter() - started:.0f} s")


def transformers_legs(_args) -> None:
    ensure_venv()
    old_transformers_legs(_env())


def ensure_chromium() -> None:
    """Debian's chromium for the browser tests, and a CJK font for the Chinese edition (readers' browsers have
    one; a bare server does not): tests/test_browser.py checks that Chinese pages are drawn with real glyphs.
    Best effort outside CI."""
    wanted = {"chromium": Path(CHROMIUM).exists() or bool(shutil.which("chromium")),
              "fonts-wqy-zenhei": Path("/usr/share/fonts/truetype/wqy").exists()}
    missing = [pkg for pkg, present in wanted.items() if not present]
    if not missing:
        return
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        ok = run("apt-get", "update", "-qq", env=env, check=IN_CI) == 0
        ok = ok and run("apt-get", "install", "-y", "-qq", *missing, env=env, check=IN_CI) == 0
        if ok:
            return
    print(f"! {', '.join(missing)} not installed (apt-get install as root, or set ATTNBOOK_CHROMIUM): "
          "the browser tests skip without Chromium" + (" and fail under CI=true." if not IN_CI else "."))


def build_book(strict: bool) -> None:
    """Both editions, side by side: English at _build/html/, Chinese at _build/html/zh_CN/ (tools/editions.py:
    each one what `jupyter-book build --all` builds from _config.yml, the Chinese one with language zh_CN)."""
    run(PY, "tools/editions.py", "html", "all", *(["--strict"] if strict else []))
    # the live explorers' runtime (npm ci in web/), script and graphs, into _build/html/_static/live/: one copy,
    # which the Chinese edition's pages link to as well
    run(PY, "tools/live_assets.py")


def book(_args) -> None:
    ensure_venv()
    build_book(strict=False)  # it prints where each edition is


def catalogs(_args) -> None:
    """After English prose changed: extract the messages and update every translation's catalogs."""
    ensure_venv()
    run(PY, "tools/editions.py", "catalogs")
    print("\nTranslate what is now empty or fuzzy in the catalogs listed as updated above "
          "(`.venv/bin/python -m pytest tests/test_translation.py` lists them).")


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONHASHSEED": "0",
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""), **extra}


def _chapters() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "chapters").glob("*.ipynb"))


def nbval_leg(name: str, chapters: list[str], workers: int = 2, check: bool = True) -> int:
    """nbval strict over `chapters` under perturbation `name` ("normal" for none)."""
    extra = {} if name == "normal" else COMBINED if name == "combined" else PERTURBATIONS[name]
    print(f"\n== nbval strict, {name} numerical environment {extra or ''}", flush=True)
    cmd = [PY, "-m", "pytest", "-q", *chapters, *NBVAL, "-rf"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "loadfile"]
    return run(*cmd, env=_env(**extra), check=check)


def nbval(args) -> None:
    ensure_venv()
    chapters = args.chapters or _chapters()
    legs = ["normal"] if args.perturb is None else (list(PERTURBATIONS) if args.perturb == "all" else [args.perturb])
    failed = [leg for leg in legs if nbval_leg(leg, chapters, check=False) != 0]
    if failed:
        sys.exit(f"nbval failed under: {', '.join(failed)}")


def test(args) -> None:
    ensure_venv()
    env = _env()
    passthrough = list(args.pytest_args)
    if passthrough[:1] == ["--"]:
        passthrough = passthrough[1:]
    # 1. lint the package, tests, benchmarks, tools and the notebooks; type-check the package
    run(BIN / "ruff", "check", "attnbook", "tests", "bench", "tools", "_ext", "chapters", env=env)
    run(BIN / "mypy", env=env)  # [tool.mypy] in pyproject.toml: the package, every function typed
    if args.fast:
        run(PY, "-m", "pytest", "-q", "tests", "-m", "not slow and not browser", "-n", "2", *passthrough, env=env)
        return
    started = time.perf_counter()
    ensure_chromium()
    w7 = ensure_ipywidgets7()
    # 2. the book, both editions, strictly: any warning (a broken reference, an unreadable notebook, a
    #    translation whose markup does not parse) fails
    build_book(strict=True)
    # 3. the widget tests again under ipywidgets 7.7.1 (what Colab ships)
    if w7 is not None:
        env7 = {**env, "PYTHONPATH": os.pathsep.join([str(w7), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "ATTNBOOK_EXPECT_IPYWIDGETS": "7"}
        run(PY, "-m", "pytest", "-q", "tests/test_explorers_base.py", "tests/test_explorers_saturation.py", "tests/test_explorers_heads.py",
            "tests/test_explorers_masks.py", "tests/test_explorers_positions.py",
            "tests/test_explorers_vit.py", "-m", "not slow", env=env7)
    # 3b. the chapters that call transformers, executed under older versions (what a learner may have)
    old_transformers_legs(env)
    # 4. everything: unit tests, notebook hygiene, browser tests, nbval strict over every chapter
    run(PY, "-m", "pytest", "tests", "chapters", *NBVAL, "-n", "2", "--dist", "loadfile", "-rs", *passthrough,
        env=env)
    # 5. nbval strict again under perturbed numerics (another BLAS path, no vector kernels, two threads):
    #    what another CPU would print. --each-perturbation runs the four one by one (slower).
    if not passthrough:
        for leg in (PERTURBATIONS if args.each_perturbation else PERTURBED_LEGS):
            nbval_leg(leg, _chapters())
    print(f"\nall checks passed in {time.perf_counter() - started:.0f} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("book", help="build the book, English and Chinese").set_defaults(func=book)
    sub.add_parser("catalogs", help="update the translations' message catalogs from the English pages").set_defaults(
        func=catalogs)
    t = sub.add_parser("test", help="every check (what CI runs)")
    t.add_argument("--fast", action="store_true", help="ruff, mypy and the unit tests without slow and browser tests")
    t.add_argument("--each-perturbation", action="store_true",
                   help="run the perturbed nbval legs once per perturbation instead of combined and avx2")
    t.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: passed to pytest")
    t.set_defaults(func=test)
    sub.add_parser("transformers-legs", help="chapters A2, 10, 12, 13 and 14 executed under older transformers").set_defaults(
        func=transformers_legs)
    n = sub.add_parser("nbval", help="nbval strict over chapters, optionally perturbed")
    n.add_argument("--perturb", choices=[*PERTURBATIONS, "combined", "all"],
                   help="which perturbed environment (all: each of the four in turn; combined: mkl, aten and threads at once)")
    n.add_argument("chapters", nargs="*", help="chapters/NN_topic.ipynb (default: all)")
    n.set_defaults(func=nbval)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
