"""Build one edition of the book (run with the virtual environment's Python; tools/dev.py calls it).

    .venv/bin/python tools/editions.py html all [--strict]     # every edition, side by side (tools/dev.py book)
    .venv/bin/python tools/editions.py html en [--strict]      # English only, _build/html/
    .venv/bin/python tools/editions.py html zh_CN [--strict]   # Chinese only, _build/html/zh_CN/
    .venv/bin/python tools/editions.py gettext en [--outdir DIR]   # the English messages, one .pot per page
    .venv/bin/python tools/editions.py catalogs                # gettext, then sphinx-intl update (tools/dev.py catalogs)

Every edition is built from the one `_config.yml` exactly as `jupyter-book build --all` builds it (Jupyter
Book's own `build_sphinx`, the same configuration), with two overrides for a translation: Sphinx's `language`
and its own output and doctree folders. So nothing is configured twice. The translations are the folders of
`locales/` (`locale_dirs` in `_config.yml`); a translation's HTML sits in the English HTML folder under its
language code, which is where each page's language link (`_ext/attnbook_book.py`) expects it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: tools/ is on the path, the repository root is not
    sys.path.insert(0, str(ROOT))

from tools.bookfiles import config  # noqa: E402

BUILD = ROOT / "_build"
ROOT_LANGUAGE = "en"


def locales() -> Path:
    """The catalogs' folder: the first of ``locale_dirs`` in ``_config.yml``."""
    return ROOT / config()["sphinx"]["config"]["locale_dirs"][0]


def translations() -> list[str]:
    """The language codes with message catalogs (folders of ``locales/`` holding ``LC_MESSAGES``)."""
    return sorted(d.name for d in locales().iterdir() if (d / "LC_MESSAGES").is_dir())


def editions() -> list[str]:
    """Every edition: English first, then each translation."""
    return [ROOT_LANGUAGE, *translations()]


def html_dir(language: str) -> Path:
    """Where an edition's HTML goes: ``_build/html`` for English, ``_build/html/<language>`` for the others."""
    return BUILD / "html" if language == ROOT_LANGUAGE else BUILD / "html" / language


def build(language: str, builder: str = "html", strict: bool = False, outdir: Path | None = None) -> int:
    """Sphinx through Jupyter Book, from scratch (like ``jupyter-book build --all``); returns the exit status."""
    from jupyter_book.sphinx import build_sphinx
    from sphinx.util.console import nocolor

    if not sys.stdout.isatty():
        nocolor()  # plain text in a log file

    # English html keeps jupyter-book's own doctree folder; any other build has its own, so that no two builds
    # (the editions run side by side) share one. A translation's doctree folder also holds the images myst-nb
    # writes before Sphinx copies them into _images (_ext/attnbook_book.py), which would otherwise land next to
    # its output folder, in the English HTML.
    scratch = BUILD if outdir is None else Path(outdir).parent
    if outdir is None:
        outdir = html_dir(language) if builder == "html" else BUILD / builder
    same_as_cli = language == ROOT_LANGUAGE and builder == "html"
    doctrees = BUILD / ".doctrees" if same_as_cli else scratch / f".doctrees-{builder}-{language}"
    overrides: dict = {"external_toc_path": (ROOT / "_toc.yml").as_posix(), "latex_individualpages": False}
    if language != ROOT_LANGUAGE:
        overrides["language"] = language
    result = build_sphinx(ROOT, Path(outdir), doctreedir=doctrees, noconfig=True, path_config=ROOT / "_config.yml",
                          confoverrides=overrides, builder=builder, freshenv=True, warningiserror=strict,
                          keep_going=strict)
    if isinstance(result, Exception):
        return 1
    return int(result or 0)


def build_all(strict: bool) -> int:
    """Every edition's HTML, side by side (one process each: a build uses one core), each logged to
    ``_build/logs/<language>.log``; prints each log's tail (all of it when that build failed) and the time."""
    logs = BUILD / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    running = {}
    for language in editions():
        log = (logs / f"{language}.log").open("w")
        cmd = [sys.executable, __file__, "html", language] + (["--strict"] if strict else [])
        running[language] = (subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT), log)
        print(f"building the {language} edition -> {html_dir(language).relative_to(ROOT)}/ "
              f"(log: {logs.relative_to(ROOT)}/{language}.log)", flush=True)
    failed = []
    for language, (proc, log) in running.items():
        rc = proc.wait()
        log.close()
        text = (logs / f"{language}.log").read_text(encoding="utf-8", errors="replace").splitlines()
        print(f"\n== {language} edition: exit {rc}, {time.perf_counter() - started:.0f} s", flush=True)
        print("\n".join(text if rc else text[-8:]), flush=True)
        if rc:
            failed.append(language)
    if failed:
        print(f"\nfailed: {', '.join(failed)} (warnings are errors with --strict)", flush=True)
        return 1
    print("\nThe book, in each language:")
    for language in editions():
        print(f"  {language:6s} {html_dir(language) / 'index.html'}")
    return 0


def update_catalogs() -> int:
    """After the English prose changed: extract its messages (``_build/gettext``, one .pot per page) and merge
    them into every translation's catalogs with ``sphinx-intl update``. A changed paragraph comes back fuzzy
    (with the old translation as a draft), a new one empty, a removed one obsolete (``#~``); only the
    catalogs whose messages changed are rewritten."""
    pot = BUILD / "gettext"
    shutil.rmtree(pot, ignore_errors=True)  # a page removed from the book must not leave its .pot behind
    rc = build(ROOT_LANGUAGE, "gettext", outdir=pot)
    if rc:
        return rc
    languages = [arg for language in translations() for arg in ("-l", language)]
    sphinx_intl = Path(sys.executable).parent / "sphinx-intl"
    return subprocess.call([str(sphinx_intl), "update", "-p", str(pot), "-d", str(locales()), *languages], cwd=ROOT)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builder", choices=["html", "gettext", "catalogs"])
    ap.add_argument("language", nargs="?", default="all", help=f"all, {ROOT_LANGUAGE} or one of {translations()}")
    ap.add_argument("--strict", action="store_true", help="any warning fails the build (-W --keep-going)")
    ap.add_argument("--outdir", type=Path, help="output folder (default: _build/html[/<language>], _build/gettext)")
    args = ap.parse_args(argv)
    if args.builder == "catalogs":
        sys.exit(update_catalogs())
    if args.language == "all" and args.builder == "html" and args.outdir is None:
        sys.exit(build_all(args.strict))
    if args.language not in editions():
        ap.error(f"no catalogs for {args.language!r} under locales/")
    sys.exit(build(args.language, args.builder, args.strict, args.outdir))


if __name__ == "__main__":
    main()
