"""Self-checking exercises.

Each exercise in a chapter has a cell where the reader writes an answer (left
as ``None`` in the committed notebook) and a folded solution cell that computes
the expected value, asserts it is right, and then calls :func:`check` on the
reader's answer.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check"]


def check(name: str, answer: Any, expected: Any, *, atol: float = 1e-5, hint: str = "") -> None:
    """Compare the reader's ``answer`` with ``expected``.

    Prints that no answer was given yet (``answer is None``) or that it is
    correct; raises ``AssertionError`` with the hint when it is wrong.
    """
    if answer is None:
        print(f"{name}: no answer yet. Write yours above, or unfold the solution.")
        return
    if isinstance(expected, torch.Tensor) or isinstance(answer, torch.Tensor):
        a = torch.as_tensor(answer, dtype=torch.float64)
        e = torch.as_tensor(expected, dtype=torch.float64)
        ok = a.shape == e.shape and torch.allclose(a, e, atol=atol, rtol=0)
        detail = f"expected shape {tuple(e.shape)}, got {tuple(a.shape)}" if a.shape != e.shape else ""
    elif isinstance(expected, float):
        ok = abs(float(answer) - expected) <= atol
        detail = ""
    else:
        ok = answer == expected
        detail = ""
    if not ok:
        raise AssertionError(f"{name}: not yet. {detail} {hint}".strip())
    print(f"{name}: correct")
