"""What the scripts of ``bench/`` share: the repository root on ``sys.path``, the thread count, the
command-line options they have in common, where a run was measured, and writing ``bench/results/<name>.json``.

    import common  # first, before attnbook: it puts the repository root on sys.path

    ap = argparse.ArgumentParser(description=...)
    common.add_threads_option(ap)                # --threads (default 1)
    common.add_no_save_option(ap, "flash")       # --no-save
    args = ap.parse_args(argv)
    torch = common.setup(args.threads)           # torch, with that many intra-op threads
    ...
    common.save_results("flash", payload)        # bench/results/flash.json

One thread by default: on a shared 2-core machine, two OpenMP threads per process are often descheduled in
turn, and then every multi-threaded kernel (PyTorch's included) runs several times slower, so that the ratios
measure the load rather than the code. The constants of attnbook itself (``attnbook.efficient.FLASH_BLOCK``, ...)
are imported from attnbook, never copied here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (attnbook's checkout)."""
RESULTS = ROOT / "bench" / "results"
"""Where every script writes its ``<name>.json``."""

if str(ROOT) not in sys.path:  # attnbook from this checkout, also when it is not installed
    sys.path.insert(0, str(ROOT))

THREADS_HELP = "torch threads (default 1: steadier timings on a shared machine; 0 = torch's default)"


def setup(threads: int = 1) -> ModuleType:
    """Import torch and set its intra-op thread count (``threads`` > 0; 0 keeps torch's default); returns torch."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    return torch


def add_threads_option(ap: argparse.ArgumentParser, default: int = 1) -> None:
    """``--threads N``: torch's intra-op threads for :func:`setup` (0 = torch's default)."""
    ap.add_argument("--threads", type=int, default=default, help=THREADS_HELP)


def add_no_save_option(ap: argparse.ArgumentParser, name: str) -> None:
    """``--no-save``: measure and print, but leave ``bench/results/<name>.json`` as it is."""
    ap.add_argument("--no-save", action="store_true", help=f"do not write bench/results/{name}.json")


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): above the CPU count, other programs compete."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def run_info() -> dict[str, Any]:
    """Where and when a run was measured, as the results files record it: torch's version and thread
    count, Python, the architecture, the CPU count, the date and ``attnbook.measure.machine_summary()``."""
    import torch

    from attnbook.measure import machine_summary

    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
            "machine_summary": machine_summary()}


def verdict(value: float, goal: str, target: float) -> bool:
    """Whether ``value`` meets the goal ``goal target`` (goal: ``"<"``, ``"<="``, ``">"`` or ``">="``)."""
    checks = {"<": value < target, "<=": value <= target, ">": value > target, ">=": value >= target}
    if goal not in checks:
        raise ValueError(f"goal must be one of {tuple(checks)}, got {goal!r}")
    return checks[goal]


def pass_miss(ok: bool) -> str:
    """``"PASS"`` or ``"MISS"``, as every script prints a goal's result."""
    return "PASS" if ok else "MISS"


def results_path(name: str) -> Path:
    """``bench/results/<name>.json``."""
    return RESULTS / f"{name}.json"


def save_results(name: str, payload: dict[str, Any], path: Path | None = None, indent: int = 2) -> Path:
    """Write ``payload`` as JSON to ``path`` (default ``bench/results/<name>.json``); returns the path."""
    path = results_path(name) if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=indent) + "\n")
    return path


def shown(path: Path) -> str:
    """``path`` relative to the repository root when it is inside it (as the scripts print it)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def run_child(script: str | Path, args: list[str]) -> dict[str, Any]:
    """Run ``script`` with ``args`` in a fresh Python process (a clean peak RSS) and return the JSON object
    that its last line of output prints."""
    res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, check=True)
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out
