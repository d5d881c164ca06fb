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

__all__ = ["check_bool", "check_int", "check_module_inputs", "check_prob", "shape_str"]


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


def check_module_inputs(module: torch.nn.Module, **inputs: object) -> None:
    """Each floating-point tensor in ``inputs`` (name -> tensor; ``None`` and integer tensors such as token
    ids are skipped, and a tensor given under two names is named once) must have the dtype and the device of ``module``'s floating-point parameters.

    ``TypeError`` naming every input of another dtype, the module's dtype and the two ways to fix it (a
    float64 tensor into a float32 module would otherwise stop in torch's matmul with "mat1 and mat2 must
    have the same dtype", which names neither the argument nor the module); ``ValueError`` for another
    device. A module without floating-point parameters accepts anything.
    """
    param = next((p for p in module.parameters() if p.is_floating_point()), None)
    if param is None:
        return
    given: dict[str, torch.Tensor] = {}
    for name, t in inputs.items():  # one tensor passed twice (key defaulting to query) is named once
        if isinstance(t, torch.Tensor) and t.is_floating_point() and all(t is not u for u in given.values()):
            given[name] = t
    owner = type(module).__name__
    # (attribute, error, how it reads, verb, how a value is written in the fix): a dtype first, then a device
    for attr, error, reads, verb, shown in (("dtype", TypeError, "", "cast", "{}"),
                                            ("device", ValueError, "on ", "move", "'{}'")):
        want = getattr(param, attr)
        off = {name: t for name, t in given.items() if getattr(t, attr) != want}
        if off:
            got = ", ".join(f"{name} is {reads}{getattr(t, attr)}" for name, t in off.items())
            first = next(iter(off))
            raise error(
                f"{got}, but {owner}'s parameters are {reads}{want}: {verb} the input "
                f"({first}.to({shown.format(want)})) or the module (module.to({shown.format(getattr(off[first], attr))}))"
            )

def check_bool(name: str, value: object) -> bool:
    """``value`` as a bool: ``TypeError`` for anything else (``"yes"``, ``1``, ``None``), so that a flag passed
    as a string or a number is refused rather than read by its truth value."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")
    return value
