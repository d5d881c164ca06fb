"""Measuring: where a number came from, and (in later steps) timing and memory probes.

Dimension legend: B batch, H heads, T query length, S key length, D head dim, E model dim.

Timings depend on the machine. Every chapter that stores timings prints :func:`machine_summary` once, next to
them, so that a reader can weigh a stored "12.3 ms" against their own CPU or GPU.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

__all__ = ["cpu_model", "machine_summary"]


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 7B13", "Apple M2"), or the architecture when it cannot be read."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                name = line.split(":", 1)[1].strip()
                if name:
                    return " ".join(name.split())
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_summary(device: str | torch.device | None = None) -> str:
    """One line: the CPU model, torch's intra-op thread count, the torch version, and the GPU when `device`
    is a CUDA device. Printed by every chapter that stores timings, in an output-ignored cell."""
    threads = torch.get_num_threads()
    parts = [f"CPU: {cpu_model()} ({os.cpu_count()} logical cores)",
             f"{threads} intra-op thread{'s' if threads != 1 else ''}",
             f"torch {torch.__version__}"]
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device} was asked for, but torch.cuda.is_available() is False")
        parts.insert(0, f"GPU: {torch.cuda.get_device_name(device)}")
    return "timings measured on " + ", ".join(parts)
