"""attnbook's own calls print nothing a reader did not ask for: the profiler's note that it "clears events
at the end of each cycle" (newer torch warns it once per process) is silenced in
``attnbook.measure.dispatched_ops``, narrowly: that message and category only."""

import warnings

import pytest
import torch

from attnbook.measure import dispatched_ops

PROFILER_NOTE = ("Warning: Profiler clears events at the end of each cycle. Only events from the current cycle "
                 "will be reported. To keep events across cycles, set acc_events=True.")


def test_dispatched_ops_silences_the_profiler_note_only():
    x = torch.ones(4)

    def noisy():
        warnings.warn(PROFILER_NOTE, UserWarning, stacklevel=1)  # what torch 2.11's profiler says
        return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "aten::add" in dispatched_ops(noisy)

    def other():
        warnings.warn("something else", UserWarning, stacklevel=1)
        return x + 1

    with pytest.warns(UserWarning, match="something else"):
        dispatched_ops(other)


QUIET_IMPORT = r"""
import os, sys, tempfile
import torch
torch.cuda._is_compiled = lambda: True  # a CUDA build of torch (Colab's), on a machine without a GPU
torch.cuda.is_available = lambda: False
torch.version.cuda = torch.version.cuda or "12.4"
os.environ["CUDA_HOME"] = tempfile.mkdtemp()  # a CUDA toolkit
if sys.argv[1] == "attnbook":
    from attnbook.measure import torch_benchmark
    benchmark = torch_benchmark()
else:
    from torch.utils import benchmark
assert benchmark.Timer is not None
"""


@pytest.mark.parametrize("how", ["torch", "attnbook"])
def test_torch_benchmark_imports_without_the_cuda_runtime_line(how):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", QUIET_IMPORT, how], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    said = out.stdout + out.stderr
    if how == "torch":  # the line is there without attnbook: the test would see it
        assert "No CUDA runtime is found" in said, said[-2000:]
    else:
        assert "No CUDA runtime is found" not in said and not said.strip(), said[-2000:]
