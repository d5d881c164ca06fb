"""Execute chapters in place so their stored outputs are what nbval checks.

    .venv/bin/python tools/execute.py chapters/01_soft_lookup.ipynb [more.ipynb ...]

Runs with the current Python (the project's venv) as the kernel, on the CPU,
with PYTHONHASHSEED=0, and without timing metadata or widget state (neither is
needed by the book and both would churn the diffs).
"""

import os
import sys
import time

import nbformat
from nbclient import NotebookClient


def execute(path: str, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ["OMP_NUM_THREADS"] = "1"  # the same as tests/conftest.py: stable numbers and timings
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # stored outputs are CPU outputs
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}},
        record_timing=False,
        store_widget_state=False,
    )
    client.execute()
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        secs = execute(p)
        print(f"{p}: executed in {secs:.1f} s, {os.path.getsize(p) / 1e6:.2f} MB")
