"""FlashAttention as a Triton kernel: the forward and backward programs, run compiled on a GPU or by
Triton's interpreter on a CPU, and the bytes they move.

Dimension legend:
    B  batch size
    H  number of heads
    T  query length (target)
    S  key/value length (source)
    D  head dimension (queries and keys), Dv value head dimension
    W  sliding-window half-width (``window``)
    Bq, Bk  queries and keys of one tile (``block_m``, ``block_n``)
    Dp, Dvp D and Dv rounded up to a power of two (a Triton block's sides must be powers of two)

:func:`triton_attention` takes q ``(B, H, T, D)``, k ``(B, H, S, D)``, v ``(B, H, S, Dv)``, an optional
bool mask that broadcasts to ``(B, H, T, S)`` (True = may attend, as everywhere in attnbook), ``causal``
(top-left, as ``is_causal=True``) and ``window`` (``|i - j| <= W``, as :func:`attnbook.sliding_window_mask`),
and returns the output ``(B, H, T, Dv)``, equal to ``F.scaled_dot_product_attention`` and so are its
gradients. A query row that may attend no key gets a zero output, not NaN.

Three kernels (FlashAttention-2, Dao 2023):

* the **forward** kernel runs one program per (query tile, batch x head); each loops over the key tiles its
  queries can see (causal and window tiles that hold no allowed pair are skipped), keeps the running max
  ``m``, sum ``l`` and unnormalised output ``acc`` on chip (the online softmax) and writes the output and
  the per-query log-sum-exp;
* the **dK/dV** kernel runs one program per key tile and loops over query tiles, recomputing each tile's
  weights from the stored log-sum-exp, ``P = exp(s - lse)``;
* the **dQ** kernel runs one program per query tile and loops over key tiles (no atomics: each program
  owns what it writes).

Triton is imported only when a kernel first runs, so ``import attnbook`` works without it. On a CPU the
kernels need Triton's interpreter: set ``TRITON_INTERPRET=1`` before the first kernel runs (the kernels are
built then, and Triton reads the variable when a kernel is built). :func:`kernel_bytes` counts what one call
reads and writes in slow memory from the tile sizes, and :func:`explicit_bytes` what the explicit
``softmax(q k^T) v`` moves, for the roofline.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import sys
from typing import Any

import torch

from ._checks import check_bool, check_int, shape_str
from .core import check_mask, check_qkv, check_scale

# triton.language, bound by _import_triton() when a kernel first runs: the kernels' bodies read this global
# then, never when this module is imported (so it imports without Triton, and Triton is imported only after
# the reader chose the interpreter or the compiler)
tl: Any = None

__all__ = [
    "triton_attention",
    "triton_attention_with_lse",
    "TritonAttentionFunction",
    "triton_available",
    "interpreter_enabled",
    "key_tile_range",
    "kernel_bytes",
    "explicit_bytes",
    "attention_flops",
    "tile_sram_bytes",
    "BLOCK_M",
    "BLOCK_N",
    "INSTALL",
]

BLOCK_M = 32
"""Default query tile (``block_m``): the queries one program holds."""
BLOCK_N = 32
"""Default key tile (``block_n``): the keys one loop step loads."""
INSTALL = 'pip install "triton>=3.2"'
"""The command that installs Triton (Linux wheels; the book is tested with the version in requirements.txt)."""

_LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
_LOWEST = torch.finfo(torch.float32).min  # blocked scores of the float32 tiles
_TINY = torch.finfo(torch.float32).tiny


def triton_available() -> bool:
    """Whether ``import triton`` works here."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (the kernels then run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


# ----------------------------------------------------------------------------- the kernels (Triton source)
# Plain functions, jitted by _kernels() when a kernel first runs (so the interpreter switch is read then).
# Pointers and scalars are annotated Any; the compile-time constants tl.constexpr (a string here: Triton
# reads the annotation's text).


def _forward_kernel(
    Q: Any, K: Any, V: Any, M: Any, O: Any, LSE: Any, qk_scale: Any,
    sqb: Any, sqh: Any, sqt: Any, sqd: Any, skb: Any, skh: Any, sks: Any, skd: Any,
    svb: Any, svh: Any, svs: Any, svd: Any, smb: Any, smh: Any, smt: Any, sms: Any,
    sob: Any, soh: Any, sot: Any, sod: Any,
    H: Any, T: Any, S: Any, D: Any, Dv: Any, W: Any,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, LOWEST: tl.constexpr, TINY: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
) -> None:
    start = tl.program_id(0) * BLOCK_M  # this program's first query
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start + tl.arange(0, BLOCK_M)  # (Bq,) query positions
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    row_ok = offs_m < T
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (Bq, Dp) loaded once
    if UPCAST:  # the interpreter's tl.dot multiplies bfloat16's bit patterns: give it float32
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], LOWEST, tl.float32)  # (Bq,) running max (base 2)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # (Bq,) running sum of exp2
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)  # (Bq, Dvp) unnormalised output
    # the key tiles that can hold an allowed pair: [lo, hi)
    lo = 0
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, start + BLOCK_M)  # keys after the tile's last query are all blocked
    if WINDOW:
        lo = tl.maximum(0, start - W) // BLOCK_N * BLOCK_N  # a tile boundary at or before the first key
        hi = tl.minimum(hi, start + BLOCK_M + W)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (Bk,) key positions
        col_ok = offs_n < S
        kt = tl.load(K + b * skb + h * skh + offs_n[None, :] * sks + offs_d[:, None] * skd,
                     mask=col_ok[None, :] & (offs_d[:, None] < D), other=0.0)  # (Dp, Bk) the tile, transposed
        v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svs + offs_dv[None, :] * svd,
                    mask=col_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)  # (Bk, Dvp)
        if UPCAST:
            kt, v = kt.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale  # (Bq, Bk) scores in base 2
        allowed = row_ok[:, None] & col_ok[None, :]  # (Bq, Bk) inside the tensors
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        if WINDOW:
            gap = offs_m[:, None] - offs_n[None, :]
            allowed = allowed & (gap <= W) & (gap >= -W)
        if HAS_MASK:
            mk = tl.load(M + b * smb + h * smh + offs_m[:, None] * smt + offs_n[None, :] * sms,
                         mask=row_ok[:, None] & col_ok[None, :], other=0)
            allowed = allowed & (mk != 0)
        s = tl.where(allowed, s, LOWEST)
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (Bq,)
        p = tl.where(allowed, tl.exp2(s - m_new[:, None]), 0.0)  # (Bq, Bk) blocked: exactly 0
        alpha = tl.exp2(m_i - m_new)  # (Bq,) rescales what was summed against the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    l_safe = tl.maximum(l_i, TINY)  # a row with no allowed key: l = 0, acc = 0, so the output is 0
    out = acc / l_safe[:, None]
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_dv[None, :] * sod, out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < Dv))
    tl.store(LSE + bh * T + offs_m, m_i + tl.log2(l_safe), mask=row_ok)  # base 2; LOWEST for an empty row


def _dkdv_kernel(
    Q: Any, K: Any, V: Any, M: Any, DO: Any, LSE: Any, DELTA: Any, DK: Any, DV: Any, qk_scale: Any, sm_scale: Any,
    sqb: Any, sqh: Any, sqt: Any, sqd: Any, skb: Any, skh: Any, sks: Any, skd: Any,
    svb: Any, svh: Any, svs: Any, svd: Any, smb: Any, smh: Any, smt: Any, sms: Any,
    H: Any, T: Any, S: Any, D: Any, Dv: Any, W: Any,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, LOWEST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
) -> None:
    start_n = tl.program_id(0) * BLOCK_N  # this program's first key
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    col_ok = offs_n < S
    k = tl.load(K + b * skb + h * skh + offs_n[:, None] * sks + offs_d[None, :] * skd,
                mask=col_ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (Bk, Dp)
    v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svs + offs_dv[None, :] * svd,
                mask=col_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)  # (Bk, Dvp)
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    # the query tiles that can see this key tile: [lo, hi)
    lo = 0
    hi = T
    if CAUSAL:
        lo = start_n // BLOCK_M * BLOCK_M  # queries before the tile's first key see none of it
    if WINDOW:
        lo = tl.maximum(lo, tl.maximum(0, start_n - W) // BLOCK_M * BLOCK_M)
        hi = tl.minimum(hi, start_n + BLOCK_N + W)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < T
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                    mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (Bq, Dp)
        do = tl.load(DO + bh * T * Dv + offs_m[:, None] * Dv + offs_dv[None, :],
                     mask=row_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)  # (Bq, Dvp) contiguous
        lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0)  # (Bq,)
        delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0)  # (Bq,)
        if UPCAST:
            q, do = q.to(tl.float32), do.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (Bq, Bk) recomputed
        allowed = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        if WINDOW:
            gap = offs_m[:, None] - offs_n[None, :]
            allowed = allowed & (gap <= W) & (gap >= -W)
        if HAS_MASK:
            mk = tl.load(M + b * smb + h * smh + offs_m[:, None] * smt + offs_n[None, :] * sms,
                         mask=row_ok[:, None] & col_ok[None, :], other=0)
            allowed = allowed & (mk != 0)
        p = tl.where(allowed, tl.exp2(tl.where(allowed, s, LOWEST) - lse[:, None]), 0.0)  # (Bq, Bk) final weights
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=DOT_PRECISION)  # dV += P^T dO
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (Bq, Bk) dP = dO V^T
        ds = p * (dp - delta[:, None])  # (Bq, Bk) dS = P * (dP - D)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=DOT_PRECISION)  # dK += dS^T Q
    tl.store(DK + bh * S * D + offs_n[:, None] * D + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < D))
    tl.store(DV + bh * S * Dv + offs_n[:, None] * Dv + offs_dv[None, :], dv.to(DV.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < Dv))


def _dq_kernel(
    Q: Any, K: Any, V: Any, M: Any, DO: Any, LSE: Any, DELTA: Any, DQ: Any, qk_scale: Any, sm_scale: Any,
    sqb: Any, sqh: Any, sqt: Any, sqd: Any, skb: Any, skh: Any, sks: Any, skd: Any,
    svb: Any, svh: Any, svs: Any, svd: Any, smb: Any, smh: Any, smt: Any, sms: Any,
    H: Any, T: Any, S: Any, D: Any, Dv: Any, W: Any,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, LOWEST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
) -> None:
    start = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start + tl.arange(0, BLOCK_M)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    row_ok = offs_m < T
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (Bq, Dp)
    do = tl.load(DO + bh * T * Dv + offs_m[:, None] * Dv + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)  # (Bq, Dvp)
    lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0)
    if UPCAST:
        q, do = q.to(tl.float32), do.to(tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo = 0
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, start + BLOCK_M)
    if WINDOW:
        lo = tl.maximum(0, start - W) // BLOCK_N * BLOCK_N
        hi = tl.minimum(hi, start + BLOCK_M + W)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < S
        k = tl.load(K + b * skb + h * skh + offs_n[:, None] * sks + offs_d[None, :] * skd,
                    mask=col_ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (Bk, Dp)
        v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svs + offs_dv[None, :] * svd,
                    mask=col_ok[:, None] & (offs_dv[None, :] < Dv), other=0.0)  # (Bk, Dvp)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (Bq, Bk)
        allowed = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        if WINDOW:
            gap = offs_m[:, None] - offs_n[None, :]
            allowed = allowed & (gap <= W) & (gap >= -W)
        if HAS_MASK:
            mk = tl.load(M + b * smb + h * smh + offs_m[:, None] * smt + offs_n[None, :] * sms,
                         mask=row_ok[:, None] & col_ok[None, :], other=0)
            allowed = allowed & (mk != 0)
        p = tl.where(allowed, tl.exp2(tl.where(allowed, s, LOWEST) - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)  # dQ += dS K
    tl.store(DQ + bh * T * D + offs_m[:, None] * D + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < D))


def _import_triton(interpret: bool) -> Any:
    """``triton``, imported for the interpreter or the compiler. Triton builds its own library functions
    (``tl.zeros``, ``tl.sum``, ...) when it is imported, for the mode ``TRITON_INTERPRET`` names then; when
    something imported it earlier for the compiler (``transformers`` and ``torch`` do), it is imported again
    for the interpreter (its compiled extension, ``triton._C``, is kept)."""
    global tl
    if not triton_available():
        raise ImportError(f"attnbook.triton_attention needs Triton: {INSTALL} (Linux; on a CPU also set "
                          "TRITON_INTERPRET=1 before the first kernel runs)")
    lang = importlib.import_module("triton.language")
    if interpret and type(lang.zeros).__name__ != "InterpretedFunction":
        for name in [n for n in sys.modules if n.split(".")[0] == "triton" and not n.startswith("triton._C")]:
            del sys.modules[name]
        lang = importlib.import_module("triton.language")
    tl = lang
    return importlib.import_module("triton")


@functools.cache
def _jitted(interpret: bool) -> tuple[Any, Any, Any]:
    """The three kernels, jitted for the interpreter or for the compiler (Triton decides at jit time)."""
    triton = _import_triton(interpret)
    return triton.jit(_forward_kernel), triton.jit(_dkdv_kernel), triton.jit(_dq_kernel)


def _kernels(device: torch.device) -> tuple[Any, Any, Any]:
    interpret = interpreter_enabled()
    if device.type == "cpu" and not interpret:
        raise RuntimeError("CPU tensors need Triton's interpreter: set the environment variable "
                           "TRITON_INTERPRET=1 before the first kernel runs (os.environ['TRITON_INTERPRET'] = '1'), "
                           "or pass CUDA tensors")
    if device.type != "cpu" and interpret:
        raise RuntimeError(f"TRITON_INTERPRET=1 runs the kernels on CPU tensors; these are on {device}")
    return _jitted(interpret)


# ----------------------------------------------------------------------------- the Python side


def _power_of_two(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())  # tl.dot needs sides of at least 16


def _mask_args(mask: torch.Tensor | None, B: int, H: int, T: int, S: int) -> tuple[torch.Tensor | None, tuple[int, ...]]:
    """The mask as uint8 ``(B, H, T, S)`` (a view with stride 0 along broadcast dims) and its strides."""
    if mask is None:
        return None, (0, 0, 0, 0)
    check_mask(mask, torch.Size((B, H, T, S)))
    if mask.dtype != torch.bool:
        raise TypeError(f"triton_attention takes a bool mask (True = may attend), got {mask.dtype}; "
                        "an additive float mask is not supported by these kernels")
    m = mask.expand(B, H, T, S).view(torch.uint8)  # (B, H, T, S) a view
    return m, tuple(m.stride())


def _settings(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: int | None,
              block_m: int, block_n: int, scale: float | None) -> tuple[bool, int | None, int, int, float]:
    check_qkv(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, length, dim), got shape {shape_str(t)}")
    if not (q.shape[:2] == k.shape[:2] == v.shape[:2]):
        raise ValueError(f"q {shape_str(q)}, k {shape_str(k)} and v {shape_str(v)} must share (B, H)")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    causal = check_bool("causal", causal)
    if window is not None:
        window = check_int("window", window, 0)
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        size = check_int(name, size, 16)
        if size & (size - 1):
            raise ValueError(f"{name} must be a power of two (a Triton block's side), got {size}")
    return causal, window, block_m, block_n, check_scale(scale, q.shape[-1])


def _dot_precision(dtype: torch.dtype) -> str:
    # "ieee": a float32 product in float32. The compiled kernel's default on NVIDIA GPUs is "tf32"
    # (10-bit mantissas), which the interpreter never uses: asking for ieee keeps the two alike.
    return "ieee"


def _common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
            window: int | None, block_m: int, block_n: int, scale: float) -> tuple[list[Any], dict[str, Any]]:
    B, H, T, D = q.shape
    S, Dv = k.shape[2], v.shape[-1]
    m, mstrides = _mask_args(mask, B, H, T, S)
    args: list[Any] = [*q.stride(), *k.stride(), *v.stride(), *mstrides]
    const = dict(HAS_MASK=m is not None, CAUSAL=causal, WINDOW=window is not None, DOT_PRECISION=_dot_precision(q.dtype),
                 UPCAST=q.dtype == torch.bfloat16 and interpreter_enabled(),
                 LOWEST=_LOWEST, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=_power_of_two(D), BLOCK_DV=_power_of_two(Dv))
    const["_mask"] = m if m is not None else q  # a pointer the kernel never reads when HAS_MASK is False
    const["_sizes"] = [H, T, S, D, Dv, 0 if window is None else window]
    return args, const


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
             window: int | None, block_m: int, block_n: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel; return the output ``(B, H, T, Dv)`` and the base-2 log-sum-exp ``(B, H, T)``."""
    fwd, _, _ = _kernels(q.device)
    B, H, T, _D = q.shape
    Dv = v.shape[-1]
    strides, const = _common(q, k, v, mask, causal, window, block_m, block_n, scale)
    out = torch.empty(B, H, T, Dv, dtype=q.dtype, device=q.device)  # (B, H, T, Dv)
    lse2 = torch.empty(B, H, T, dtype=torch.float32, device=q.device)  # (B, H, T)
    m, sizes = const.pop("_mask"), const.pop("_sizes")
    grid = (-(-T // block_m), B * H)
    fwd[grid](q, k, v, m, out, lse2, scale * _LOG2E, *strides, *out.stride(), *sizes, TINY=_TINY, **const)
    return out, lse2


def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, out: torch.Tensor,
              lse2: torch.Tensor, dout: torch.Tensor, causal: bool, window: int | None, block_m: int, block_n: int,
              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, dkdv, dq_kernel = _kernels(q.device)
    B, H, T, D = q.shape
    S, Dv = k.shape[2], v.shape[-1]
    dout = dout.contiguous()  # (B, H, T, Dv)
    delta = (dout.float() * out.float()).sum(-1).contiguous()  # (B, H, T) D_i = dO_i . O_i
    strides, const = _common(q, k, v, mask, causal, window, block_m, block_n, scale)
    m, sizes = const.pop("_mask"), const.pop("_sizes")
    dq = torch.empty(B, H, T, D, dtype=q.dtype, device=q.device)  # (B, H, T, D) contiguous, as the kernel writes it
    dk = torch.empty(B, H, S, D, dtype=k.dtype, device=k.device)  # (B, H, S, D)
    dv = torch.empty(B, H, S, Dv, dtype=v.dtype, device=v.device)  # (B, H, S, Dv)
    dkdv[(-(-S // block_n), B * H)](q, k, v, m, dout, lse2, delta, dk, dv, scale * _LOG2E, scale, *strides, *sizes,
                                    **const)
    dq_kernel[(-(-T // block_m), B * H)](q, k, v, m, dout, lse2, delta, dq, scale * _LOG2E, scale, *strides, *sizes,
                                         **const)
    return dq, dk, dv


class TritonAttentionFunction(torch.autograd.Function):
    """:func:`triton_attention` as an autograd function: the forward kernel saves q, k, v, the output and the
    log-sum-exp (nothing of size T x S); the backward kernels recompute each tile's weights from them.
    Call it through :func:`triton_attention`, which checks the arguments."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                causal: bool, window: int | None, block_m: int, block_n: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse2 = _forward(q, k, v, mask, causal, window, block_m, block_n, scale)
        ctx.save_for_backward(q, k, v, out, lse2)
        ctx.mask = mask
        ctx.settings = (causal, window, block_m, block_n, scale)
        lse = lse2 / _LOG2E  # (B, H, T) natural log
        lse = lse.masked_fill(lse2 <= _LOWEST / 2, -math.inf)  # a row with no allowed key: log 0
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, _dlse: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, ctx.mask, out, lse2, dout, *ctx.settings)
        return dq, dk, dv, None, None, None, None, None, None


def triton_attention_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    block_m: int = BLOCK_M,
    block_n: int = BLOCK_N,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`triton_attention`'s output ``(B, H, T, Dv)`` and the per-query log-sum-exp ``(B, H, T)``
    (natural log; ``-inf`` for a query that may attend no key), as ``attnbook.flash_attention_with_lse``."""
    causal, window, block_m, block_n, scale = _settings(q, k, v, causal, window, block_m, block_n, scale)
    out, lse = TritonAttentionFunction.apply(q, k, v, mask, causal, window, block_m, block_n, scale)
    return out, lse


def triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    block_m: int = BLOCK_M,
    block_n: int = BLOCK_N,
) -> torch.Tensor:
    """Exact softmax attention by Triton kernels (FlashAttention-2), with its own backward pass.

    q ``(B, H, T, D)``, k ``(B, H, S, D)``, v ``(B, H, S, Dv)`` (float32, float16 or bfloat16; CUDA tensors, or
    CPU tensors under ``TRITON_INTERPRET=1``); ``mask``: bool, broadcasting to ``(B, H, T, S)``, True = may
    attend (a padding mask ``(B, 1, 1, S)`` is read with stride 0, never expanded in memory); ``causal``:
    query i sees keys j <= i (top-left, as ``is_causal=True``); ``window``: also ``|i - j| <= window``
    (:func:`attnbook.sliding_window_mask`). Key tiles with no allowed pair under ``causal``/``window`` are
    skipped. Returns ``(B, H, T, Dv)`` equal to ``F.scaled_dot_product_attention`` with the same mask, and
    a zero output for a query that may attend no key. The tiles hold ``block_m`` queries and ``block_n``
    keys (powers of two, at least 16); the products and the softmax run in float32."""
    return triton_attention_with_lse(q, k, v, mask, causal=causal, window=window, scale=scale,
                                     block_m=block_m, block_n=block_n)[0]


# ----------------------------------------------------------------------------- which tiles, how many bytes


def key_tile_range(q_start: int, block_m: int, block_n: int, S: int, *, causal: bool = False,
                   window: int | None = None) -> tuple[int, int]:
    """The keys ``[lo, hi)`` the forward kernel's loop visits for the query tile starting at ``q_start``
    (``lo`` on a tile boundary): all of them, or, under ``causal`` and ``window``, those of the key tiles
    that can hold an allowed pair. The same arithmetic as the kernel's."""
    q_start = check_int("q_start", q_start, 0)
    block_m, block_n, S = check_int("block_m", block_m), check_int("block_n", block_n), check_int("S", S)
    lo, hi = 0, S
    if causal:
        hi = min(S, q_start + block_m)
    if window is not None:
        window = check_int("window", window, 0)
        lo = max(0, q_start - window) // block_n * block_n
        hi = min(hi, q_start + block_m + window)
    return lo, max(lo, hi)


def _visited_key_tiles(T: int, S: int, block_m: int, block_n: int, causal: bool, window: int | None) -> int:
    total = 0
    for a in range(0, T, block_m):
        lo, hi = key_tile_range(a, block_m, block_n, S, causal=causal, window=window)
        total += -(-(hi - lo) // block_n)
    return total


def kernel_bytes(T: int, S: int, D: int, Dv: int | None = None, *, batch_size: int = 1, num_heads: int = 1,
                 element_size: int = 2, block_m: int = BLOCK_M, block_n: int = BLOCK_N, causal: bool = False,
                 window: int | None = None) -> dict[str, int]:
    """Bytes the forward kernel reads and writes in slow memory (HBM) per call, from the tile sizes:
    each program reads its query tile once and every key and value tile it visits (so K and V are read once
    per query tile), and writes its output tile and one float32 log-sum-exp per query. Caches between the
    chip and HBM (a GPU's L2) can serve some of the repeated K/V reads; this counts them all."""
    Dv = D if Dv is None else Dv
    BH = check_int("batch_size", batch_size) * check_int("num_heads", num_heads)
    T, S, D, Dv = check_int("T", T), check_int("S", S), check_int("D", D), check_int("Dv", Dv)
    e = check_int("element_size", element_size)
    keys = _visited_key_tiles(T, S, block_m, block_n, causal, window) * block_n  # key rows loaded, tiles whole
    read = BH * e * (T * D + keys * (D + Dv))
    written = BH * (e * T * Dv + 4 * T)
    return {"read": read, "written": written, "total": read + written}


def explicit_bytes(T: int, S: int, D: int, Dv: int | None = None, *, batch_size: int = 1, num_heads: int = 1,
                   element_size: int = 2) -> dict[str, int]:
    """Bytes the explicit ``softmax(q k^T) v`` moves in slow memory, three kernels each going through HBM:
    ``q k^T`` reads q, k and writes the ``(T, S)`` scores; the softmax reads them and writes the ``(T, S)``
    weights; ``weights @ v`` reads them and v and writes the output."""
    Dv = D if Dv is None else Dv
    BH = check_int("batch_size", batch_size) * check_int("num_heads", num_heads)
    e = check_int("element_size", element_size)
    TS = check_int("T", T) * check_int("S", S)
    read = BH * e * (T * D + S * D + TS + TS + S * Dv)
    written = BH * e * (TS + TS + T * Dv)
    return {"read": read, "written": written, "total": read + written}


def attention_flops(T: int, S: int, D: int, Dv: int | None = None, *, batch_size: int = 1, num_heads: int = 1,
                    causal: bool = False) -> int:
    """Floating-point operations of the forward pass's two products, ``2 T S D + 2 T S Dv`` per head (a
    multiply and an add per term); about half under a causal mask (the pairs j <= i)."""
    Dv = D if Dv is None else Dv
    BH = check_int("batch_size", batch_size) * check_int("num_heads", num_heads)
    pairs = T * S if not causal else sum(min(i + 1, S) for i in range(T))
    return BH * 2 * pairs * (D + Dv)


def tile_sram_bytes(block_m: int, block_n: int, D: int, Dv: int | None = None, element_size: int = 2) -> int:
    """On-chip bytes one forward program holds: the query tile, one key and one value tile (in the input's
    dtype), the float32 scores/weights tile, the float32 accumulator and ``m``, ``l`` (registers and shared
    memory together; a compiler that pipelines loads keeps two or three K/V tiles in flight)."""
    Dv = D if Dv is None else Dv
    e = check_int("element_size", element_size)
    return e * (block_m * D + block_n * (D + Dv)) + 4 * (block_m * block_n + block_m * Dv + 2 * block_m)
