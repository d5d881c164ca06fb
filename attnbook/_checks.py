"""Argument checks shared by every module, with one rule for the exception raised.

* ``TypeError``: the argument has the wrong *type* (a float where an int is needed, a bool, a list where a
  tensor is needed);
* ``ValueError``: the type is right but the *value* is not (an int below its minimum, a probability of 1).

Every message names the argument and what it got, so that a reader can fix the call without opening the
source. Each check returns the value it accepted, so it can be used inline: ``n = check_int("n", n)``.
"""

from __future__ import annotations

from numbers import Real

import torch

__all__ = ["check_bool", "check_int", "check_prob", "shape_str"]


def check_int(name: str, value: object, minimum: int | None = 1, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (either bound ``None``: unbounded).

    ``TypeError`` unless ``value`` is an int (``bool`` is refused: ``True`` is not a length);
    ``ValueError`` when it is out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if maximum is not None and (value > maximum or (minimum is not None and value < minimum)):
        raise ValueError(f"{name} must be an int in [{minimum}, {maximum}], got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_prob(name: str, value: object) -> float:
    """``value`` as a float in ``[0, 1)``: a dropout probability.

    ``TypeError`` unless ``value`` is a real number (not a bool); ``ValueError`` outside ``[0, 1)``.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(value).__name__} {value!r}")
    p = float(value)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return p


def shape_str(t: torch.Tensor) -> str:
    """A tensor's shape as messages write it: ``"(2, 5, 8)"`` (``"()"`` for a scalar)."""
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def check_bool(name: str, value: object) -> bool:
    """``value`` as a bool: ``TypeError`` for anything else (``"yes"``, ``1``, ``None``), so that a flag passed
    as a string or a number is refused rather than read by its truth value."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")
    return value
