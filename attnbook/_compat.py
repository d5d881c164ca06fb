"""What differs between torch versions and machines, decided in one place.

* Feature flags from the installed torch's version (never from searching a docstring: ``python -OO``
  strips docstrings):

  - :data:`SDPA_HAS_GQA`: ``F.scaled_dot_product_attention(..., enable_gqa=True)`` exists (torch 2.5),
    so grouped-query attention can read each key/value head once instead of repeating it;
  - :data:`SDPA_SAFE_SOFTMAX`: the fused kernel gives a query whose keys are all blocked a zero output
    (torch 2.5); before, a fully blocked row of a float mask came out NaN.

  attnbook requires torch >= 2.5 (``pyproject.toml``), so both are true on every supported install; the
  code that depends on them says so by testing the flag.

* One device list: :func:`available_devices` (what a reader can pick in an explorer) and
  :func:`default_device` (where training goes by default) read the same preference order,
  :data:`DEVICE_PREFERENCE`.
"""

from __future__ import annotations

import re

import torch

__all__ = [
    "TORCH_VERSION",
    "SDPA_HAS_GQA",
    "SDPA_SAFE_SOFTMAX",
    "DEVICE_PREFERENCE",
    "available_devices",
    "default_device",
]


def _version(text: str) -> tuple[int, int]:
    """``"2.13.0+cpu"`` -> ``(2, 13)``."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"cannot read a torch version from {text!r}")
    return int(match.group(1)), int(match.group(2))


TORCH_VERSION: tuple[int, int] = _version(torch.__version__)
SDPA_HAS_GQA: bool = TORCH_VERSION >= (2, 5)
SDPA_SAFE_SOFTMAX: bool = TORCH_VERSION >= (2, 5)

# best first: training goes to the first one present; the explorers offer them all, the CPU first
DEVICE_PREFERENCE: tuple[str, ...] = ("cuda", "mps", "cpu")


def _present(kind: str) -> bool:
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def available_devices() -> list[str]:
    """Devices a reader can pick: always ``"cpu"`` (first), plus ``"cuda"`` and ``"mps"`` where present."""
    return ["cpu"] + [kind for kind in DEVICE_PREFERENCE if kind != "cpu" and _present(kind)]


def default_device() -> torch.device:
    """The best device here: CUDA, else Apple's MPS, else the CPU."""
    return torch.device(next(kind for kind in DEVICE_PREFERENCE if _present(kind)))
