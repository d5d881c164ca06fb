"""Measuring: where a number came from, how long code takes, how much memory it holds, which kernel ran.

Dimension legend: T sequence length (the size a cost curve runs over).

* **Where** (:func:`machine_summary`): timings depend on the machine. Every chapter that stores timings
  prints it once, next to them, so that a reader can weigh a stored "12.3 ms" against their own CPU or GPU.
* **Time** (:func:`time_calls`, :func:`time_samples`): one harness for the explorers, the chapters and
  ``bench/``. Calls are interleaved (every call once per round, so a load spike on a shared machine hits all
  of them alike), after one warm-up call each, under ``torch.no_grad()``, and the device is synchronised
  around each call (CUDA and MPS run asynchronously: without it the clock stops before the work is done).
* **Memory, tracked** (:class:`TensorMemoryTracker`, :func:`tracked_memory`): every tensor storage PyTorch's
  operators allocate, until it is freed. Deterministic (the same code gives the same bytes on every run),
  but blind to scratch buffers a C++ kernel allocates for itself.
* **Bytes written** (:class:`BytesWrittenCounter`, :func:`bytes_written`): the bytes PyTorch's operators
  write, into new tensors or in place (views write nothing): how much a KV cache copies per step.
* **Forward and backward** (:func:`forward_backward`): a call and its backward pass as one zero-argument
  callable, to time or track training rather than inference.
* **Memory, measured** (:func:`peak_rss_growth`, :func:`cuda_peak_growth`): how far one call raises the
  process's peak resident memory (Linux) or the CUDA allocator's peak: what the machine really saw.
* **Cost curves and crossovers** (:func:`cost_curves`, :func:`crossover`): time and tracked memory of
  several calls at several sizes, and the size from which one cost stays below another.
* **Kernel dispatch** (:func:`dispatched_ops`): the ATen operators a call ran, e.g. which kernel
  ``F.scaled_dot_product_attention`` picked.
* **Quiet** (:func:`torch_benchmark`): ``torch.utils.benchmark`` without the "No CUDA runtime is found" line a
  CUDA build of torch says on a machine without a GPU; ``dispatched_ops`` likewise silences the profiler's
  note that it "clears events at the end of each cycle" (newer torch). Only those messages.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import os
import platform
import resource
import statistics
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ._checks import check_int

__all__ = [
    "cpu_model",
    "machine_summary",
    "synchronize",
    "time_samples",
    "time_calls",
    "TensorMemoryTracker",
    "tracked_memory",
    "BytesWrittenCounter",
    "bytes_written",
    "forward_backward",
    "peak_rss_growth",
    "cuda_peak_growth",
    "cost_curves",
    "crossover",
    "dispatched_ops",
    "torch_benchmark",
]

K = TypeVar("K", bound=Hashable)


# ----------------------------------------------------------------------------- where


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
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={dev} was asked for, but torch.cuda.is_available() is False")
        parts.insert(0, f"GPU: {torch.cuda.get_device_name(dev)}")
    return "timings measured on " + ", ".join(parts)


# ----------------------------------------------------------------------------- time


def synchronize(device: str | torch.device | None) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op for the CPU and for ``None``)."""
    if device is None:
        return
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def time_samples(
    calls: Mapping[K, Callable[[], object]],
    rounds: int = 3,
    slow_s: float | None = 0.25,
    *,
    device: str | torch.device | None = None,
) -> dict[K, list[float]]:
    """Seconds of each timed call of each of ``calls`` (name -> zero-argument callable).

    Under ``torch.no_grad()``: one warm-up call each, then ``rounds`` interleaved rounds (every call once
    per round). A call whose warm-up took longer than ``slow_s`` seconds runs in the first two rounds only
    (its cost dwarfs the noise); ``slow_s=None`` times every call in every round. With a CUDA or MPS
    ``device`` the device is synchronised before the clock starts and before it stops.
    """
    check_int("rounds", rounds)
    samples: dict[K, list[float]] = {name: [] for name in calls}
    slow = set()
    with torch.no_grad():
        for name, fn in calls.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            if slow_s is not None and time.perf_counter() - t0 > slow_s:
                slow.add(name)
        for r in range(rounds):
            for name, fn in calls.items():
                if r >= 2 and name in slow:
                    continue
                synchronize(device)
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                samples[name].append(time.perf_counter() - t0)
    return samples


def time_calls(
    calls: Mapping[K, Callable[[], object]],
    rounds: int = 3,
    slow_s: float | None = 0.25,
    *,
    reduce: str = "min",
    device: str | torch.device | None = None,
) -> dict[K, float]:
    """Seconds per call of each of ``calls`` (name -> zero-argument callable), timed by :func:`time_samples`.

    ``reduce="min"`` (the default) keeps the fastest round: on a shared machine other processes only ever
    add time, so the minimum is the steadiest estimate of what the code itself costs. ``"median"`` is what
    ``bench/`` reports (with ``slow_s=None``: every round counts).
    """
    if reduce not in ("min", "median"):
        raise ValueError(f"reduce must be 'min' or 'median', got {reduce!r}")
    stat: Callable[[list[float]], float] = min if reduce == "min" else statistics.median
    return {name: stat(ts) for name, ts in time_samples(calls, rounds, slow_s, device=device).items()}


# ----------------------------------------------------------------------------- memory, tracked


class TensorMemoryTracker(TorchDispatchMode):
    """Inside ``with TensorMemoryTracker() as m:``, count the bytes of every
    tensor storage PyTorch's operators allocate, until it is freed.

    ``m.peak``: the most bytes alive at once; ``m.largest``: the largest single
    storage; ``m.current``: bytes still alive; ``m.ops``: the operators seen
    (e.g. ``"aten::mm"``). An output that shares its storage with an input of
    the same operator (a view, an in-place op) allocates nothing. Storages that
    existed before the block (the inputs) are not counted. Deterministic: the
    same code gives the same bytes. Scratch memory a C++ kernel allocates for
    itself, below the operator level, is invisible.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = self.peak = self.largest = 0
        self.ops: set[str] = set()
        self._live: dict[int, tuple[weakref.ref, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.add(func._schema.name)
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st._cdata not in inputs:
                    self._add(st)
        return out

    def _add(self, st: torch.UntypedStorage) -> None:
        key = st._cdata
        entry = self._live.get(key)
        if entry is not None and entry[0]() is st:
            return
        n = st.nbytes()
        self._live[key] = (weakref.ref(st, functools.partial(self._free, key)), n)
        self.current += n
        self.peak = max(self.peak, self.current)
        self.largest = max(self.largest, n)

    def _free(self, key: int, ref: weakref.ref) -> None:
        entry = self._live.get(key)
        if entry is not None and entry[0] is ref:
            del self._live[key]
            self.current -= entry[1]


def tracked_memory(fn: Callable[[], object]) -> dict[str, Any]:
    """Run ``fn()`` once under ``torch.no_grad()`` and a :class:`TensorMemoryTracker`;
    the output is dropped inside, so it counts towards the peak but not after.
    Returns ``{"peak_bytes", "largest_bytes", "ops"}``."""
    with torch.no_grad(), TensorMemoryTracker() as m:
        out = fn()
        del out
    return {"peak_bytes": m.peak, "largest_bytes": m.largest, "ops": sorted(m.ops)}


# ----------------------------------------------------------------------------- bytes written


class BytesWrittenCounter(TorchDispatchMode):
    """Inside ``with BytesWrittenCounter() as c:``, count the bytes PyTorch's operators write.

    An operator writes each tensor it returns, except a view of an input (``slice``, ``transpose``,
    ...), which writes nothing: a new tensor (``cat``, ``mm``, ``a + b``) counts its whole size, an
    in-place or ``out=`` operator (``copy_``, ``add_``) the size of the tensor it writes into, which
    may be a slice of a larger one. ``c.bytes``: the total; ``c.by_op``: per operator, e.g.
    ``{"aten::cat": 2048}``. Deterministic; what a C++ kernel writes to its own scratch memory is not seen.
    """

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **kwargs or {})
        written = 0
        results = out if isinstance(out, (tuple, list)) else (out,)
        for ret, t in zip(func._schema.returns, results):
            alias = ret.alias_info
            if isinstance(t, torch.Tensor) and (alias is None or alias.is_write):  # not a view of an input
                written += t.numel() * t.element_size()
        if written:
            name = func._schema.name
            self.bytes += written
            self.by_op[name] = self.by_op.get(name, 0) + written
        return out


def bytes_written(fn: Callable[[], object]) -> int:
    """Bytes the operators of one call of ``fn()`` write (:class:`BytesWrittenCounter`), under
    ``torch.no_grad()``. ``bytes_written(lambda: torch.cat([a, b]))`` is the bytes of a and b together;
    ``bytes_written(lambda: buf[:, 5:6].copy_(x))`` is the bytes of x."""
    with torch.no_grad(), BytesWrittenCounter() as c:
        fn()
    return c.bytes


# ----------------------------------------------------------------------------- forward and backward


def forward_backward(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor,
                     grad_out: torch.Tensor | None = None) -> Callable[[], tuple[torch.Tensor, ...]]:
    """A zero-argument callable that runs ``fn(*inputs)`` and its backward pass and returns the gradients
    with respect to ``inputs`` (as ``torch.autograd.grad``; nothing is accumulated in ``.grad``), for
    :func:`time_calls` and :func:`tracked_memory`, which then measure training rather than inference.

    Gradients are enabled inside the call (both helpers run their calls under ``torch.no_grad()``); the
    inputs are used through aliases that require grad (no copy). The output's gradient is ``grad_out``,
    or all ones (the loss ``fn(*inputs).sum()``). ``tracked_memory(forward_backward(f, q, k, v))`` is the
    peak of a training step of ``f``: what the forward pass keeps for the backward pass, and its tiles.
    """
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"inputs[{i}] must be a floating-point torch.Tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    leaves = tuple(t.detach().requires_grad_() for t in inputs)

    def run() -> tuple[torch.Tensor, ...]:
        with torch.enable_grad():
            out = fn(*leaves)
            if grad_out is None:
                return torch.autograd.grad(out.sum(), leaves)
            return torch.autograd.grad(out, leaves, grad_out)

    return run


# ----------------------------------------------------------------------------- memory, measured


def _status_kib(field: str) -> int | None:
    """A ``VmXXX`` line of ``/proc/self/status`` (KiB), or None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Linux: reset the peak RSS (VmHWM) to the current RSS (``echo 5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def peak_rss_growth(fn: Callable[[], object]) -> tuple[int, str]:
    """How far one call of ``fn()`` raises the process's peak resident memory above its resident memory
    just before: ``(bytes, how it was measured)``. The output is kept until the peak has been read.

    On Linux the peak is reset first (``/proc/self/clear_refs``), so the growth is VmHWM after the call
    minus VmRSS before it. Elsewhere it is the growth of ``ru_maxrss``, which can under-count: memory freed
    before the call may be reused. Run it in a fresh process, after a warm-up call, for a clean number
    (``bench/bench_efficient.py`` does).
    """
    if _reset_peak_rss():
        before = _status_kib("VmRSS")
        out = fn()
        after = _status_kib("VmHWM")
        del out
        if before is not None and after is not None:
            return (after - before) * 1024, "VmHWM after - VmRSS before (peak reset via /proc/self/clear_refs)"
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = fn()
    end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del out
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is in bytes there, KiB on Linux
    return int((end - start) * unit), "ru_maxrss after - before"


def cuda_peak_growth(fn: Callable[[], object], device: str | torch.device = "cuda") -> int:
    """Bytes by which one call of ``fn()`` raises the CUDA caching allocator's peak above what was
    allocated before it (``torch.cuda.max_memory_allocated``), the output kept until the peak is read."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return int(peak - before)


# ----------------------------------------------------------------------------- cost curves


def cost_curves(
    calls_at: Callable[[int], Mapping[K, Callable[[], object]]],
    sizes: Sequence[int],
    *,
    rounds: int = 3,
    memory: bool = True,
    threads: int | None = 1,
    reduce: str = "min",
    device: str | torch.device | None = None,
) -> dict[K, dict[str, float]]:
    """Time (and track the memory of) several calls at several sizes.

    ``calls_at(size)`` gives the calls for one size (key -> zero-argument callable; the keys must differ
    from one size to the next, e.g. ``(name, size)``). The calls of one size are timed together,
    interleaved (:func:`time_calls`), with ``threads`` torch threads (default 1: steadier on a shared
    machine; ``None`` keeps the current setting; the setting is restored afterwards). Returns
    ``{key: {"time_s", "peak_bytes", "largest_bytes"}}`` (no memory keys with ``memory=False``).
    """
    out: dict[K, dict[str, float]] = {}
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for size in sizes:
            calls = calls_at(size)
            times = time_calls(calls, rounds, reduce=reduce, device=device)
            for key, fn in calls.items():
                entry: dict[str, float] = {"time_s": times[key]}
                if memory:
                    mem = tracked_memory(fn)
                    entry.update(peak_bytes=mem["peak_bytes"], largest_bytes=mem["largest_bytes"])
                out[key] = entry
    finally:
        torch.set_num_threads(before)
    return out


def crossover(t_values: Sequence[float], cost: Sequence[float], ref_cost: Sequence[float]) -> float | None:
    """Where ``cost`` drops below ``ref_cost`` for good: the smallest measured T
    from which on every ``cost < ref_cost``, refined by interpolating the log of
    the ratio linearly in log T between that T and the one before it. Returns
    ``t_values[0]`` when ``cost`` is below from the start, ``None`` when it is
    not below at the last T."""
    if not (len(t_values) == len(cost) == len(ref_cost)) or not t_values:
        raise ValueError(f"t_values, cost and ref_cost need the same nonzero length, got "
                         f"{len(t_values)}, {len(cost)}, {len(ref_cost)}")
    ratio = [math.log(c / r) for c, r in zip(cost, ref_cost)]  # < 0: cheaper than the reference
    i = len(ratio)
    while i > 0 and ratio[i - 1] < 0:
        i -= 1
    if i == len(ratio):
        return None
    if i == 0:
        return float(t_values[0])
    t0, t1 = math.log(t_values[i - 1]), math.log(t_values[i])
    r0, r1 = ratio[i - 1], ratio[i]
    return math.exp(t0 + (t1 - t0) * r0 / (r0 - r1))


# ----------------------------------------------------------------------------- torch.utils.benchmark

_NO_CUDA_RUNTIME = "No CUDA runtime is found"


class _DropMessage(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def torch_benchmark() -> ModuleType:
    """``torch.utils.benchmark``, imported without the line "No CUDA runtime is found, using CUDA_HOME=..."
    that a CUDA build of torch says on a machine with a CUDA toolkit but no GPU (Colab's CPU runtime):
    ``benchmark`` imports ``torch.utils.cpp_extension``, which looks for the toolkit. torch 2.5 prints the
    line to stderr, newer torch logs it as a warning; only that line is dropped, anything else passes."""
    if "torch.utils.benchmark" in sys.modules:
        return sys.modules["torch.utils.benchmark"]
    logger = logging.getLogger("torch.utils.cpp_extension")
    drop = _DropMessage(_NO_CUDA_RUNTIME)
    logger.addFilter(drop)
    caught = io.StringIO()
    try:
        with contextlib.redirect_stderr(caught):
            import torch.utils.benchmark as benchmark
    finally:
        logger.removeFilter(drop)
        rest = "".join(line for line in caught.getvalue().splitlines(keepends=True)
                       if not line.startswith(_NO_CUDA_RUNTIME))
        if rest:
            sys.stderr.write(rest)
    return benchmark


# ----------------------------------------------------------------------------- kernel dispatch


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for a while: the profiler's C++ side
    prints start/stop lines with timestamps there, which would land in a notebook."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def dispatched_ops(fn: Callable[[], object], prefix: str = "aten::") -> list[str]:
    """Run ``fn()`` once under ``torch.profiler`` (CPU activity, which records the
    ATen operators for tensors on any device) and return the names of the
    operators that start with ``prefix``, in the order they were called, each once.
    ``dispatched_ops(lambda: F.scaled_dot_product_attention(q, k, v), "aten::_scaled")``
    names the kernel PyTorch chose, e.g. ``["aten::_scaled_dot_product_flash_attention_for_cpu"]``."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), warnings.catch_warnings():
        # newer torch (2.11) warns once per process that the profiler "clears events at the end of each
        # cycle": true, and beside the point for one run; only that message of that category is silenced
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle",
                                category=UserWarning)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    names: list[str] = []
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        if event.name.startswith(prefix) and event.name not in names:
            names.append(event.name)
    return names
