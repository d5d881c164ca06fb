"""attnbook.measure: the timing harness, the tensor-memory tracker, the peak-memory probes, cost curves,
crossovers and kernel dispatch, and the one line that says where timings were measured.

Dimension legend: T sequence length.
"""

from __future__ import annotations

import math
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from attnbook import measure
from attnbook.efficient import attention_call, make_inputs
from attnbook.measure import (
    TensorMemoryTracker,
    cost_curves,
    crossover,
    dispatched_ops,
    peak_rss_growth,
    time_calls,
    time_samples,
    tracked_memory,
)


def test_tracker_counts_allocations_not_views_and_frees():
    x = torch.zeros(1000)
    with torch.no_grad(), TensorMemoryTracker() as m:
        y = x.view(10, 100).transpose(0, 1)  # views of an input: nothing allocated
        assert m.current == 0
        z = torch.ones(2000)  # 8000 bytes
        w = z * 2  # 8000 more
        assert m.current == 16000
        del w
        assert m.current == 8000
        z.mul_(3)  # in place: nothing new
        assert m.current == 8000
    assert m.peak == 16000 and m.largest == 8000
    assert "aten::mul" in m.ops
    del y, z


def test_tracked_memory_is_deterministic_and_sees_the_table():
    T = 1024
    q, k, v = make_inputs(T)
    exact = [tracked_memory(attention_call("exact", q, k, v))["peak_bytes"] for _ in range(2)]
    assert exact[0] == exact[1]
    assert exact[0] >= 2 * T * T * 4  # at least one (B=1, H=2, T, T) float32 table
    for name in ("sliding window", "flash", "linear", "performer", "pytorch"):
        peak = tracked_memory(attention_call(name, q, k, v, 32))["peak_bytes"]
        assert 0 < peak < exact[0] / 4, name


def test_time_calls_returns_positive_seconds():
    t = time_calls({"a": lambda: torch.ones(100).sum(), "b": lambda: None}, rounds=2)
    assert set(t) == {"a", "b"} and all(x >= 0 for x in t.values()) and t["a"] > 0
    with pytest.raises(ValueError, match="rounds must be an int >= 1, got 0"):
        time_calls({"a": lambda: None}, rounds=0)


@pytest.mark.parametrize("rounds, kind", [(2.0, "float"), (True, "bool"), ("3", "str")])
def test_rounds_of_the_wrong_type_is_a_type_error(rounds, kind):
    calls = []
    with pytest.raises(TypeError, match=f"rounds must be an int, got {kind}"):
        time_samples({"a": lambda: calls.append(1)}, rounds=rounds)
    with pytest.raises(TypeError, match=f"rounds must be an int, got {kind}"):
        time_calls({"a": lambda: calls.append(1)}, rounds=rounds)
    assert not calls  # refused before anything ran


def test_crossover():
    Ts = [256, 512, 1024, 2048]
    assert crossover(Ts, [1, 1, 1, 1], [2, 2, 2, 2]) == 256.0  # cheaper from the start
    assert crossover(Ts, [3, 3, 3, 3], [1, 1, 1, 1]) is None  # never
    assert crossover(Ts, [1, 3, 1, 3], [2, 2, 2, 2]) is None  # not cheaper at the end
    # ratio 2 at 512 and 1/2 at 1024: the log-ratio crosses 0 half way, at sqrt(512 * 1024)
    x = crossover(Ts, [4, 4, 1, 1], [1, 2, 2, 4])
    assert math.isclose(x, math.sqrt(512 * 1024))
    # cheaper at 256, dearer at 512, cheaper after: the last crossing counts
    assert 512 < crossover(Ts, [1, 3, 1, 1], [2, 2, 2, 2]) < 1024
    with pytest.raises(ValueError, match="same nonzero length"):
        crossover(Ts, [1], [1])


def test_dispatched_ops_names_the_kernel():
    q = torch.randn(1, 2, 16, 8)
    fused = dispatched_ops(lambda: F.scaled_dot_product_attention(q, q, q), "aten::_scaled_dot_product")
    assert fused and all(name.startswith("aten::_scaled_dot_product") for name in fused)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        math = dispatched_ops(lambda: F.scaled_dot_product_attention(q, q, q), "aten::_scaled_dot_product")
    assert math == ["aten::_scaled_dot_product_attention_math"]
    assert "aten::mm" in dispatched_ops(lambda: q[0, 0] @ q[0, 0].T)




def test_time_samples_interleave_after_one_warm_up_and_skip_slow_calls_after_two_rounds():
    log = []

    def call(name, seconds=0.0):
        def run():
            log.append(name)
            time.sleep(seconds)
        return run

    samples = time_samples({"fast": call("fast"), "slow": call("slow", 0.03)}, rounds=4, slow_s=0.02)
    assert log == ["fast", "slow"] + ["fast", "slow"] * 2 + ["fast", "fast"]  # warm-up, then rounds
    assert len(samples["fast"]) == 4 and len(samples["slow"]) == 2
    assert min(samples["slow"]) >= 0.03 > max(samples["fast"])
    log.clear()
    samples = time_samples({"fast": call("fast"), "slow": call("slow", 0.03)}, rounds=3, slow_s=None)
    assert len(samples["slow"]) == 3 and log.count("slow") == 4  # slow_s=None: every round counts


def test_time_calls_reduces_by_min_or_median(monkeypatch):
    monkeypatch.setattr(measure, "time_samples", lambda calls, rounds, slow_s, device=None: {"a": [3.0, 1.0, 2.0]})
    assert time_calls({"a": lambda: None}) == {"a": 1.0}
    assert time_calls({"a": lambda: None}, reduce="median") == {"a": 2.0}
    with pytest.raises(ValueError, match="reduce must be"):
        time_calls({"a": lambda: None}, reduce="mean")


def test_timing_synchronises_the_device(monkeypatch):
    synced = []
    monkeypatch.setattr(measure, "synchronize", lambda device: synced.append(device))
    time_calls({"a": lambda: None}, rounds=2, device="cuda")
    assert synced == ["cuda"] * 6  # before and after the warm-up call and each of the 2 timed calls


def test_synchronize_is_a_no_op_without_a_device():
    measure.synchronize(None)
    measure.synchronize("cpu")
    measure.synchronize(torch.device("cpu"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_peak_rss_growth_sees_a_large_allocation():
    n = 64 * 2**20
    growth, how = peak_rss_growth(lambda: torch.ones(n // 4))  # 64 MiB, written (ones) so it is resident
    assert 0.9 * n <= growth <= 1.5 * n, growth
    assert "VmHWM" in how or "ru_maxrss" in how
    small, _ = peak_rss_growth(lambda: torch.ones(16))
    assert small < n // 4


def test_cost_curves_time_and_track_every_call_at_every_size():
    def calls_at(T):
        q, k, v = make_inputs(T)
        return {(name, T): attention_call(name, q, k, v, 16) for name in ("exact", "sliding window")}

    before = torch.get_num_threads()
    costs = cost_curves(calls_at, [64, 128], rounds=1, threads=1)
    assert torch.get_num_threads() == before  # the thread setting is restored
    assert set(costs) == {("exact", 64), ("exact", 128), ("sliding window", 64), ("sliding window", 128)}
    for c in costs.values():
        assert c["time_s"] > 0 and 0 < c["largest_bytes"] <= c["peak_bytes"]
    assert costs["exact", 128]["peak_bytes"] > costs["exact", 64]["peak_bytes"]  # (T, T) grows 4x
    no_memory = cost_curves(calls_at, [64], rounds=1, memory=False)
    assert all(set(c) == {"time_s"} for c in no_memory.values())


def test_machine_summary_names_the_cpu_threads_and_torch():
    line = measure.machine_summary()
    assert line.startswith("timings measured on CPU: ") and measure.cpu_model() in line
    assert f"torch {torch.__version__}" in line and "intra-op thread" in line
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            measure.machine_summary("cuda")


def test_bytes_written_counts_new_tensors_and_in_place_writes_not_views():
    from attnbook.measure import BytesWrittenCounter, bytes_written

    a, b = torch.zeros(10), torch.ones(6)  # 40 and 24 bytes
    assert bytes_written(lambda: torch.cat([a, b])) == 64  # a new tensor: all of it is written
    assert bytes_written(lambda: a[2:4].copy_(b[:2])) == 8  # in place: only the two elements written
    assert bytes_written(lambda: a.view(2, 5).t()[1:]) == 0  # views write nothing
    assert bytes_written(lambda: torch.cat([a, b], out=torch.empty(16))) == 64 + 64  # empty() counts, out= writes
    with torch.no_grad(), BytesWrittenCounter() as c:
        torch.cat([a, a])
        a.add_(1)
    assert c.bytes == 80 + 40 and c.by_op == {"aten::cat": 80, "aten::add_": 40}


def test_forward_backward_returns_the_gradients_and_tracks_a_training_step():
    from attnbook.measure import forward_backward

    x = torch.randn(50, 40, dtype=torch.float64)
    w = torch.randn(40, 30, dtype=torch.float64)
    step = forward_backward(lambda x, w: torch.tanh(x @ w), x, w)
    dx, dw = step()
    y = torch.tanh(x @ w)
    torch.testing.assert_close(dw, x.T @ (1 - y**2))  # d(sum tanh(x w)) / dw
    torch.testing.assert_close(dx, (1 - y**2) @ w.T)
    assert not x.requires_grad and x.grad is None  # the caller's tensors are left alone
    g = torch.randn(50, 30, dtype=torch.float64)
    dx_g, _ = forward_backward(lambda x, w: x @ w, x, w, grad_out=g)()
    torch.testing.assert_close(dx_g, g @ w.T)
    with torch.no_grad():  # time_calls and tracked_memory call it under no_grad: it turns gradients back on
        assert step()[0].shape == x.shape
    inference = tracked_memory(lambda: torch.tanh(x @ w))["peak_bytes"]
    training = tracked_memory(step)["peak_bytes"]
    assert training > inference  # what the forward pass keeps, and the gradients
    with pytest.raises(TypeError, match=r"inputs\[1\] must be a floating-point torch.Tensor"):
        forward_backward(lambda x, w: x, x, torch.ones(3, dtype=torch.long))
