"""Execute chapters in place. A chapter is a pair: ``chapters/NN_topic.md``, the MyST Markdown source you
edit (jupytext), and ``chapters/NN_topic.ipynb``, its executed twin that the book shows and nbval checks.

    .venv/bin/python tools/execute.py chapters/02_scaled_dot_product.md [more ...]
    .venv/bin/python tools/execute.py --inputs-only chapters/02_scaled_dot_product.md
    .venv/bin/python tools/execute.py --check chapters/*.md

Either file of a pair may be named. By default the cells are read from the ``.md``, executed top to bottom
with the current Python (the project's venv) on the CPU, and written to the ``.ipynb``; the ``.md`` is then
rewritten in jupytext's normal form so that the pair stays byte-for-byte reproducible.

``--inputs-only`` copies the ``.md``'s cells into the ``.ipynb`` without executing, keeping the stored outputs;
it refuses when a code cell changed (that needs a run). Use it for prose edits.
``--check`` only reports pairs whose cells differ (tests/test_notebooks.py runs the same comparison).

Kernels run with PYTHONHASHSEED=0 and one intra-op thread unless OMP_NUM_THREADS is set, and without
timing metadata or widget state (neither is needed by the book and both would churn the diffs), and with
ATTNBOOK_STATIC_SCRUBBER=1: only then does an explorer store the book's static scrubber next to its live view
(a reader's kernel renders no frame of it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

TEXT_FORMAT = "md:myst"
PAIR_FORMATS = "ipynb,md:myst"
# cell metadata that belongs to an execution, not to the source
_RUNTIME_KEYS = {"execution", "collapsed", "scrolled", "ExecuteTime"}


def pair(path: str | Path) -> tuple[Path, Path]:
    """(source .md, executed .ipynb) for either file of a chapter."""
    p = Path(path)
    if p.suffix not in (".md", ".ipynb"):
        raise ValueError(f"{p}: a chapter is a .md source or its .ipynb twin")
    return p.with_suffix(".md"), p.with_suffix(".ipynb")


def _cell_key(cell) -> tuple:
    meta = {k: v for k, v in cell.metadata.items() if k not in _RUNTIME_KEYS}
    return cell.cell_type, cell.source, meta


def differences(md: Path, ipynb: Path) -> list[str]:
    """Where the two files of a pair disagree (cell type, source or tags/metadata); [] when in sync."""
    if not md.exists():
        return [f"{md.name} is missing (run: jupytext --set-formats {PAIR_FORMATS} {ipynb})"]
    if not ipynb.exists():
        return [f"{ipynb.name} is missing (run: tools/execute.py {md})"]
    src = jupytext.read(md, fmt=TEXT_FORMAT)
    out = nbformat.read(ipynb, as_version=4)
    a, b = [_cell_key(c) for c in src.cells], [_cell_key(c) for c in out.cells]
    found = []
    if len(a) != len(b):
        found.append(f"{md.name} has {len(a)} cells, {ipynb.name} has {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            what = "type" if x[0] != y[0] else "source" if x[1] != y[1] else "metadata"
            found.append(f"cell {i} differs ({what}): {x[1][:60]!r}")
            break
    if out.metadata.get("jupytext", {}).get("formats") != PAIR_FORMATS:
        found.append(f"{ipynb.name} is not paired (metadata jupytext.formats != {PAIR_FORMATS!r})")
    return found


def _stable_ids(nb) -> None:
    """Cell ids from the cells' content, so that executing twice gives the same file (nbformat's are random)."""
    seen: dict[str, int] = {}
    for cell in nb.cells:
        base = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:8]
        seen[base] = seen.get(base, 0) + 1
        cell.id = base if seen[base] == 1 else f"{base}-{seen[base]}"


SOLUTION_TITLE = "# @title Solution (run it to check; double-click to read)"


def is_solution(cell) -> bool:
    """An exercise's solution: a code cell tagged hide-input that calls check()."""
    return (cell.cell_type == "code" and "hide-input" in cell.metadata.get("tags", [])
            and "check(" in cell.source)


def fold_hidden_cells(nb) -> None:
    """Fold what the book folds in Jupyter and Colab too: every `hide-input` cell gets
    `jupyter.source_hidden` (JupyterLab and Notebook 7 collapse its code), and every exercise solution
    Colab's form view (`cellView: form` with a `# @title` line: Colab shows the title, not the code)."""
    for cell in nb.cells:
        if cell.cell_type != "code" or "hide-input" not in cell.metadata.get("tags", []):
            continue
        cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        if is_solution(cell):
            cell.metadata["cellView"] = "form"
            if not cell.source.startswith("# @title"):
                cell.source = f"{SOLUTION_TITLE}\n{cell.source}"


def _merge_streams(nb) -> None:
    """One stream output per run of consecutive writes (the kernel splits them by timing, which churns diffs)."""
    for cell in nb.cells:
        merged: list = []
        for out in cell.get("outputs", []):
            if (out.output_type == "stream" and merged and merged[-1].output_type == "stream"
                    and merged[-1].name == out.name):
                merged[-1].text += out.text
            else:
                merged.append(out)
        if cell.cell_type == "code":
            cell.outputs = merged


def _write_pair(nb, md: Path, ipynb: Path) -> None:
    _merge_streams(nb)
    fold_hidden_cells(nb)
    _stable_ids(nb)
    nb.metadata.setdefault("jupytext", {})["formats"] = PAIR_FORMATS
    nb.metadata.pop("widgets", None)
    jupytext.write(nb, ipynb, fmt="ipynb")
    jupytext.write(nb, md, fmt=TEXT_FORMAT)


def execute(path: str | Path, timeout: int = 600) -> float:
    md, ipynb = pair(path)
    nb = jupytext.read(md, fmt=TEXT_FORMAT)
    fold_hidden_cells(nb)
    nb.metadata["language_info"] = {"name": "python"}
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as conftest.py: one intra-op thread unless told otherwise
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # stored outputs are CPU outputs
    os.environ["ATTNBOOK_STATIC_SCRUBBER"] = "1"  # explorers store the book's scrubber (attnbook.explorers.base)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(md.parent.resolve())}},
        record_timing=False,
        store_widget_state=False,
    )
    client.execute()
    _write_pair(nb, md, ipynb)
    return time.perf_counter() - start


def copy_inputs(path: str | Path) -> None:
    """The .md's cells into the .ipynb, keeping outputs; only when no code cell changed."""
    md, ipynb = pair(path)
    src = jupytext.read(md, fmt=TEXT_FORMAT)
    fold_hidden_cells(src)
    out = nbformat.read(ipynb, as_version=4)
    def code(cells):  # a title comment added by fold_hidden_cells does not change what a cell prints
        return [c.source.removeprefix(SOLUTION_TITLE + "\n") for c in cells if c.cell_type == "code"]

    old_code, new_code = code(out.cells), code(src.cells)
    if old_code != new_code:
        changed = next((i for i, (a, b) in enumerate(zip(old_code, new_code)) if a != b), min(len(old_code), len(new_code)))
        sys.exit(f"{md}: code cell {changed} changed (or cells were added/removed): execute it instead")
    outputs = iter([c for c in out.cells if c.cell_type == "code"])
    for cell in src.cells:
        if cell.cell_type == "code":
            old = next(outputs)
            cell.outputs, cell.execution_count = old.outputs, old.execution_count
    src.metadata = out.metadata
    _write_pair(src, md, ipynb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="+", help="chapters/NN_topic.md or .ipynb")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--inputs-only", action="store_true", help="copy the .md's cells, keep the outputs")
    mode.add_argument("--check", action="store_true", help="only report pairs that are out of sync")
    args = ap.parse_args(argv)
    bad = 0
    for p in dict.fromkeys(pair(c)[0] for c in args.chapters):  # each pair once, in order
        if args.check:
            diffs = differences(*pair(p))
            bad += bool(diffs)
            print(f"{p}: {'; '.join(diffs) if diffs else 'in sync'}")
        elif args.inputs_only:
            copy_inputs(p)
            print(f"{p}: inputs copied to {pair(p)[1].name}")
        else:
            secs = execute(p)
            print(f"{p}: executed in {secs:.1f} s, {pair(p)[1].stat().st_size / 1e6:.2f} MB")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
