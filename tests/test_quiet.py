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
