"""attnbook._checks (one rule: TypeError for a wrong type, ValueError for a wrong value, the argument named)
and attnbook._compat (flags from torch's version that match what the installed torch does; one device list)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from attnbook import _compat, default_device
from attnbook._checks import check_int, check_prob, shape_str
from attnbook.explorers.base import device_control


@pytest.mark.parametrize("value", [2.0, "3", None, True, False, torch.tensor(3)])
def test_check_int_refuses_other_types_with_a_type_error(value):
    with pytest.raises(TypeError, match=rf"n must be an int, got {type(value).__name__}"):
        check_int("n", value)


def test_check_int_ranges_are_value_errors():
    assert check_int("n", 1) == 1 and check_int("n", 0, 0) == 0 and check_int("k", -5, None) == -5
    with pytest.raises(ValueError, match=r"n must be an int >= 1, got 0"):
        check_int("n", 0)
    with pytest.raises(ValueError, match=r"window must be an int >= 0, got -1"):
        check_int("window", -1, 0)
    with pytest.raises(ValueError, match=r"num_digits must be an int in \[1, 9\], got 10"):
        check_int("num_digits", 10, 1, 9)
    with pytest.raises(ValueError, match=r"in \[1, 9\], got 0"):
        check_int("num_digits", 0, 1, 9)


def test_check_prob():
    assert check_prob("p", 0) == 0.0 and check_prob("p", 0.5) == 0.5
    for bad in (1.0, -0.1, 2):
        with pytest.raises(ValueError, match=r"p must be in \[0, 1\), got"):
            check_prob("p", bad)
    for bad in ("0.1", None, True):
        with pytest.raises(TypeError, match="p must be a float in"):
            check_prob("p", bad)


def test_shape_str():
    assert shape_str(torch.zeros(2, 5, 8)) == "(2, 5, 8)"
    assert shape_str(torch.zeros(())) == "()"


def test_the_package_applies_the_rule():
    """A few public functions: the wrong type of a size is a TypeError, a wrong size a ValueError."""
    from attnbook import MultiHeadAttention, causal_mask, sinusoidal_encoding, sliding_window_mask
    from attnbook.layers import FeedForward

    for call in (lambda: causal_mask(2.0), lambda: sliding_window_mask(4, 1.5), lambda: MultiHeadAttention(8.0, 2),
                 lambda: MultiHeadAttention(8, 2, num_kv_heads=1.0), lambda: FeedForward(8, 16, dropout="0.1"),
                 lambda: sinusoidal_encoding(4, 8, base="big")):
        with pytest.raises(TypeError):
            call()
    for call in (lambda: causal_mask(0), lambda: sliding_window_mask(4, -1), lambda: MultiHeadAttention(8, 0),
                 lambda: MultiHeadAttention(8, 2, num_kv_heads=3), lambda: FeedForward(8, 16, dropout=1.0),
                 lambda: sinusoidal_encoding(4, 8, base=1.0)):
        with pytest.raises(ValueError):
            call()


def test_version_flags_follow_the_torch_version():
    assert _compat.TORCH_VERSION == tuple(int(x) for x in torch.__version__.split(".")[:2])
    assert _compat._version("2.4.1+cu121") == (2, 4) and _compat._version("2.13.0.dev20260101") == (2, 13)
    assert _compat.SDPA_HAS_GQA == (_compat.TORCH_VERSION >= (2, 5))
    assert _compat.SDPA_SAFE_SOFTMAX == (_compat.TORCH_VERSION >= (2, 5))


def test_version_flags_hold_under_python_OO():
    """Docstrings are stripped under -OO: a flag read from a docstring would turn False there."""
    code = "import attnbook._compat as c; print(c.SDPA_HAS_GQA, c.SDPA_SAFE_SOFTMAX)"
    out = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(_compat.SDPA_HAS_GQA), str(_compat.SDPA_SAFE_SOFTMAX)]


@pytest.mark.skipif(not _compat.SDPA_HAS_GQA, reason="this torch has no enable_gqa")
def test_sdpa_has_gqa_means_enable_gqa_works():
    q, kv = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8)
    out = F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, kv.repeat_interleave(2, 1), kv.repeat_interleave(2, 1))
    torch.testing.assert_close(out, ref)


@pytest.mark.skipif(not _compat.SDPA_SAFE_SOFTMAX, reason="this torch's fused kernel gives NaN there")
def test_safe_softmax_means_a_blocked_float_row_gives_zeros():
    q = torch.randn(1, 1, 3, 4)
    mask = torch.zeros(3, 3)
    mask[1] = float("-inf")  # query 1 may attend no key
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert torch.isfinite(out).all() and (out[0, 0, 1] == 0).all()


def test_one_device_list():
    devices = _compat.available_devices()
    assert devices[0] == "cpu" and set(devices) <= set(_compat.DEVICE_PREFERENCE)
    assert ("cuda" in devices) == torch.cuda.is_available()
    best = next(d for d in _compat.DEVICE_PREFERENCE if d in devices)
    assert default_device() == torch.device(best)
    control = device_control()
    assert control.values == devices and control.default == "cpu" and control.static == ["cpu"]


def test_check_module_inputs():
    from attnbook._checks import check_module_inputs

    lin = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)
    check_module_inputs(lin, x=x, ids=torch.arange(3), nothing=None)  # integer tensors and None are skipped
    with pytest.raises(TypeError, match=r"^x is torch.float16, but Linear's parameters are torch.float32"):
        check_module_inputs(lin, x=x.half(), y=x)
    with pytest.raises(TypeError, match=r"^a is torch.float64, but"):  # one tensor under two names: named once
        xd = x.double()
        check_module_inputs(lin, a=xd, b=xd)
    check_module_inputs(torch.nn.ReLU(), x=x.half())  # no parameters: nothing to match
