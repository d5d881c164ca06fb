"""Check any attention implementation against a battery of invariants.

Dimension legend:
    B  batch size
    H  number of query heads
    Hkv number of key/value heads (H for plain multi-head attention)
    G  query heads per key/value head (H // Hkv)
    T  query length,  S  key/value length
    D  head dimension,  Dv  value head dimension (D unless values are wider or narrower)
    E  model dimension (``d_model`` = H * D)

:func:`check_attention` takes your attention, a function or an ``nn.Module``,
runs it on random inputs and prints one line per invariant, ``held`` or
``violated`` with the number it measured, then returns an
:class:`AttentionReport`. The first invariant, equality with
``torch.nn.functional.scaled_dot_product_attention``, says *whether* the
implementation is right; the others say *why not*: each one looks at a single
property (row sums, the scale, the heads, the causal mask, the dtype, ...) and,
where a convention is measured (the scale, the causal alignment, the RoPE
pairing, the ALiBi slopes), the other checks use the measured one, so that one
bug lights up the invariant that names it rather than all of them.

Those lines run short sequences (at most nine keys, down to a single query and
a single key, as a decoding step, a one-token input or one memory token give),
scores of order one and fresh, contiguous tensors. Four more take the checks where real models go:
``long_keys`` (:data:`LONG_KEY_LENGTHS`, 129, 200 and 257 keys, past and ragged
against the tiles of a tiled kernel, :data:`TILE_SIZES`; values and gradients,
and a module's cached decoding after 199 tokens), ``large_logits`` (float32 with scores in the hundreds, where a softmax
without the row maximum overflows), ``layout`` (non-contiguous views: q, k, v
transposed from ``(B, T, H, D)`` or sliced from one fused projection, against
their contiguous copies) and ``value_dim`` (values of another width, Dv != D).
The first, second and fourth compare with the reference of the first line and
wait for it: when it is violated they are ``n/a``.

Two lines hold a convention rather than a property of every correct attention
(:data:`CONVENTIONS`, tagged ``[convention]`` in the report): fully masked rows
give zeros, and the scale is 1/sqrt(D).

Calling conventions:

* a function is called as ``fn(q, k, v, mask=mask)`` (``fn(q, k, v)`` when there
  is no mask) with q ``(B, H, T, D)``, k and v ``(B, Hkv, S, D)``, and returns the
  output ``(B, H, T, D)`` or ``(output, weights)`` with weights ``(B, H, T, S)``;
* a module is called as ``module(x, mask=mask)`` for self-attention and
  ``module(x, memory, memory, mask=mask)`` for cross-attention, with x
  ``(B, T, E)``, and returns the output ``(B, T, E)`` or ``(output, weights)``;
  ``cache=`` is passed for cached decoding. The module-level checks read its
  weights from ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``
  (``nn.Linear``, as in attnbook and Hugging Face) and its ``num_heads`` and
  ``num_kv_heads``; a ``torch.nn.MultiheadAttention`` is read too.

``call=`` adapts any other convention (see :func:`check_attention`).

Masks are built in the course's convention (bool, True = may attend) and
converted to the one you declare with ``mask_convention``.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from . import masks as _masks
from ._checks import check_int, shape_str
from .kvcache import KVCache
from .positional import alibi_slopes, apply_rotary

__all__ = ["check_attention", "AttentionReport", "InvariantResult", "INVARIANTS", "CONVENTIONS", "MASK_CONVENTIONS",
           "LONG_KEY_LENGTHS", "TILE_SIZES", "tolerance"]

# the key lengths of the long-inputs line, and the tile sizes they are chosen against: each length is longer
# than a tile of every size and a multiple of none, so a tiled kernel meets several tiles and a partial last one
LONG_KEY_LENGTHS = (129, 200, 257)
TILE_SIZES = (16, 64, 128)

# (name, the line's title), in the order they are checked and printed
INVARIANTS = (
    ("sdpa", "equals F.scaled_dot_product_attention"),
    ("weights", "weight rows sum to 1, output = weights @ v"),
    ("permutation", "permutation equivariant (no positions)"),
    ("causal_leak", "no future leak under a causal mask"),
    ("padding", "padded keys get no weight"),
    ("causal_alignment", "causal alignment for T != S"),
    ("low_precision", "finite and close in float16 and bfloat16"),
    ("empty_rows", "fully masked rows give zeros, not NaN"),
    ("scale", "scores scaled by 1/sqrt(D), D = head dim"),
    ("heads", "each head reads only its own slice"),
    ("cross_attention", "cross-attention with S != T"),
    ("kv_cache", "cached decoding equals full decoding"),
    ("deterministic", "deterministic (no dropout at evaluation)"),
    ("long_keys", f"long inputs: {LONG_KEY_LENGTHS[0]}, {LONG_KEY_LENGTHS[1]} and {LONG_KEY_LENGTHS[2]} keys"),
    ("large_logits", "float32 with scores in the hundreds"),
    ("layout", "inputs that are views of another layout"),
    ("value_dim", "values of another width, Dv != D"),
    ("rope", "RoPE pairing of the features"),
    ("alibi", "ALiBi slopes, checked for 8 and 12 heads"),
)
_TITLES = dict(INVARIANTS)

# the lines that hold the course's convention (F.scaled_dot_product_attention's defaults), not a property of
# every correct attention: code that follows another convention on purpose violates them without being wrong
# (appendix A2: nn.MultiheadAttention gives NaN and Hugging Face's eager attention an average on fully masked
# rows; T5 leaves the scores unscaled). The report tags their lines "[convention]". The RoPE pairing, the ALiBi
# slopes, the causal alignment, the mask polarity and the GQA head mapping are conventions too, but declared
# ones: the checker holds the code to the one its caller declares (rope=, alibi=, causal=, mask_convention=,
# groups=).
CONVENTIONS = ("empty_rows", "scale")

# the mask conventions check_attention can hand to your code; the last two express padding only
MASK_CONVENTIONS = ("allowed", "blocked", "additive", "key_padding", "hf")
_PADDING_ONLY = ("key_padding", "hf")
_ALIGNMENTS = {"top-left": 0, "bottom-right": 1}
_PAIRINGS = ("interleaved", "half-split")

_TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}

# what an invariant's check returns: (status, detail, measured, tolerance)
_Outcome = tuple[str, str, float | None, float | None]
# a module's projection weights and sizes, as _module_spec reads them
_Spec = dict[str, Any]


def tolerance(dtype: torch.dtype) -> float:
    """The absolute tolerance the battery allows in ``dtype`` (outputs of size about 1):
    1e-10 in float64, 1e-5 in float32, 1e-2 in float16, 5e-2 in bfloat16."""
    if dtype not in _TOLERANCES:
        raise TypeError(f"no tolerance for {dtype}: use one of {', '.join(str(d) for d in _TOLERANCES)}")
    return _TOLERANCES[dtype]


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class InvariantResult:
    """One invariant: ``status`` is ``"held"``, ``"violated"`` or ``"n/a"``; ``measured`` is the
    number behind it (a max |difference|, a scale ratio, ...) and ``tolerance`` the bound it was held to."""

    name: str
    status: str
    detail: str
    measured: float | None = None
    tolerance: float | None = None

    @property
    def title(self) -> str:
        return _TITLES[self.name]

    @property
    def held(self) -> bool:
        return self.status == "held"

    @property
    def convention(self) -> bool:
        """Whether the line holds a convention (see :data:`CONVENTIONS`) rather than a property of every
        correct attention."""
        return self.name in CONVENTIONS

    @property
    def violated(self) -> bool:
        return self.status == "violated"

    def line(self) -> str:
        tag = "  [convention]" if self.convention else ""
        return f"{self.title:<44} {self.status} ({self.detail}){tag}"


@dataclass
class AttentionReport:
    """What :func:`check_attention` found: one :class:`InvariantResult` per invariant, by name."""

    subject: str
    results: dict[str, InvariantResult] = field(default_factory=dict)

    def __getitem__(self, name: str) -> InvariantResult:
        if name not in self.results:
            raise KeyError(f"no invariant {name!r}; the invariants are {', '.join(self.results)}")
        return self.results[name]

    def __iter__(self) -> Iterator[InvariantResult]:
        return iter(self.results.values())

    @property
    def violated(self) -> list[str]:
        """Names of the violated invariants, in battery order."""
        return [r.name for r in self if r.violated]

    @property
    def held(self) -> list[str]:
        return [r.name for r in self if r.held]

    @property
    def not_applicable(self) -> list[str]:
        return [r.name for r in self if r.status == "n/a"]

    @property
    def ok(self) -> bool:
        """True when no invariant is violated."""
        return not self.violated

    def __str__(self) -> str:
        lines = [f"check_attention({self.subject})"]
        lines += ["  " + r.line() for r in self if r.status != "n/a"]
        if self.not_applicable:
            lines.append("  not applicable here: " + ", ".join(self.not_applicable))
        n = sum(r.status != "n/a" for r in self)
        if self.violated:
            lines.append(f"  => {len(self.violated)} of {n} violated: {', '.join(self.violated)}")
        else:
            lines.append(f"  => all {n} held")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _bound(tol: float) -> str:
    return f"{tol:.0e}".replace("e-0", "e-")


def _num(x: float) -> str:
    """A measured number at 2 significant figures (what survives another CPU's rounding)."""
    if x != x:
        return "NaN"
    if math.isinf(x):
        return "inf"
    return f"{x:.2g}"


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64; NaN or inf anywhere in a makes it inf."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if not torch.isfinite(a).all():
        return math.inf
    return float((a - b).abs().max()) if a.numel() else 0.0


def _raised(err: Exception) -> str:
    msg = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if len(msg) > 70:
        msg = msg[:67] + "..."
    return f"raised {type(err).__name__}" + (f": {msg}" if msg else "")


class _OutputTypeError(TypeError):
    """The implementation returned something that is not an attention output."""


class _OutputShapeError(ValueError):
    """The implementation returned an output of the wrong shape."""


def _split_result(res: object, what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(output, weights or None) from what the implementation returned."""
    if isinstance(res, torch.Tensor):
        return res, None
    if isinstance(res, (tuple, list)) and res and isinstance(res[0], torch.Tensor):
        w = res[1] if len(res) > 1 and isinstance(res[1], torch.Tensor) else None
        return res[0], w
    raise _OutputTypeError(f"{what} must return the output tensor or (output, weights), got {type(res).__name__}")


def _ones_row(g: torch.Generator, mask: torch.Tensor) -> torch.Tensor:
    """Make sure every query row of a bool mask (..., T, S) allows at least one key."""
    S = mask.shape[-1]
    pick = torch.randint(0, S, mask.shape[:-1], generator=g)  # (..., T)
    return mask | F.one_hot(pick, S).bool()


def _random_mask(g: torch.Generator, B: int, T: int, S: int) -> torch.Tensor:
    """Bool (B, 1, T, S), about 70% True, at least one key per query."""
    return _ones_row(g, torch.rand(B, 1, T, S, generator=g) < 0.7)


def _random_padding(g: torch.Generator, B: int, S: int, *, empty_last: bool = False) -> torch.Tensor:
    """Bool (B, 1, 1, S) padding mask: the first sequence is full, the others have random lengths >= 1,
    or with ``empty_last`` the last one has no real key at all."""
    lengths = torch.randint(1, S + 1, (B,), generator=g)  # (B,)
    lengths[0] = S
    if empty_last:
        lengths[-1] = 0
    return _masks.padding_mask(lengths, S)


def _causal(T: int, S: int, alignment: str) -> torch.Tensor:
    """Bool (T, S), True = may attend: top-left (query i sees keys j <= i) or
    bottom-right (the queries are the last T of S positions: j <= i + S - T)."""
    return _masks.causal_mask(T, S, offset=S - T if alignment == "bottom-right" else 0)


# ---------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    """What the caller of :func:`check_attention` declared (validated once, read by every check)."""

    causal: bool | str | None = None
    mask_convention: str | Callable[[torch.Tensor], torch.Tensor] = "allowed"
    groups: int = 1
    rope: str | None = None
    rope_base: float = 10000.0
    alibi: bool = False
    call: Callable[..., Any] | None = None
    cache: bool | Callable[[], Any] | None = None
    dtype: torch.dtype = torch.float64
    tolerance: float | None = None
    seed: int = 0

    def validate(self, fn: Callable[..., Any]) -> None:
        """TypeError for an option of the wrong type, ValueError for one of the right type that makes no sense."""
        if not callable(fn):
            raise TypeError(f"fn must be a function or an nn.Module, got {type(fn).__name__}")
        if self.causal not in (None, True, False) and self.causal not in _ALIGNMENTS:
            raise ValueError(f"causal must be None, True, 'top-left' or 'bottom-right', got {self.causal!r}")
        if not (callable(self.mask_convention) or self.mask_convention in MASK_CONVENTIONS):
            raise ValueError(f"mask_convention must be one of {MASK_CONVENTIONS} or a callable, "
                             f"got {self.mask_convention!r}")
        check_int("groups (query heads per key/value head)", self.groups)
        if self.rope is not None and self.rope not in _PAIRINGS:
            raise ValueError(f"rope must be None, 'interleaved' or 'half-split', got {self.rope!r}")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)):
            raise TypeError(f"rope_base must be a number, got {self.rope_base!r}")
        if not self.rope_base > 1:
            raise ValueError(f"rope_base must be > 1, got {self.rope_base!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {self.dtype!r}")
        if self.dtype not in (torch.float64, torch.float32):
            raise ValueError(f"dtype must be torch.float64 or torch.float32 (half precision has its own check), "
                             f"got {self.dtype!r}")
        if self.tolerance is not None:
            if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)):
                raise TypeError(f"tolerance must be a number, got {self.tolerance!r}")
            if not self.tolerance > 0:
                raise ValueError(f"tolerance must be positive, got {self.tolerance!r}")
        check_int("seed", self.seed, 0)
        if self.call is not None and not callable(self.call):
            raise TypeError(f"call must be a callable, got {type(self.call).__name__}")
        if isinstance(fn, nn.Module):
            for name, val in (("rope", self.rope), ("alibi", self.alibi or None),
                              ("groups", self.groups if self.groups != 1 else None)):
                if val is not None:
                    raise ValueError(f"{name}= describes a function; a module's heads and positions are its own "
                                     f"(got {name}={val!r})")


class _Checker:
    def __init__(self, fn: Callable[..., Any], options: _Options) -> None:
        self.fn = fn
        self.is_module = isinstance(fn, nn.Module)
        causal = None if options.causal is False else options.causal
        self.causal = causal
        self.alignment = causal if isinstance(causal, str) else None  # the declared one
        self.mask_convention = options.mask_convention
        self.padding_only = isinstance(self.mask_convention, str) and self.mask_convention in _PADDING_ONLY
        self.groups = options.groups
        self.rope = options.rope
        self.rope_base = float(options.rope_base)
        self.alibi = bool(options.alibi)
        self.call = options.call
        self.dtype = options.dtype
        self.tol = _TOLERANCES[self.dtype] if options.tolerance is None else float(options.tolerance)
        self.seed = options.seed
        self.statuses: dict[str, str] = {}  # the verdicts so far: the long/large/Dv lines build on the first
        cache = options.cache
        # conventions measured by their own invariant, used by the other diagnostic checks
        self.measured_alignment: str | None = None
        self.measured_pairing: str | None = None
        self.measured_scale: float | None = None
        self._alibi_cache: dict[int, torch.Tensor] = {}
        self.spec: _Spec | None = None
        if isinstance(fn, nn.Module):
            self.module: nn.Module = copy.deepcopy(fn).to(self.dtype).eval()
            self.spec = _module_spec(self.module)
            self.cache_factory = self._cache_factory(cache)

    def width(self) -> int:
        """The module's model width E."""
        if self.spec is not None:
            return self.spec["E"]
        for name in ("d_model", "embed_dim", "hidden_size"):
            if isinstance(getattr(self.module, name, None), int):
                return getattr(self.module, name)
        raise ValueError("cannot tell the module's width E: give it q_proj/k_proj/v_proj/out_proj "
                         "(nn.Linear) or a d_model attribute")

    def mask_for(self, g: torch.Generator, B: int, T: int, S: int) -> torch.Tensor:
        """A random mask in the course's convention that leaves every query a key: (B, 1, T, S), or a
        padding mask (B, 1, 1, S) when the declared convention expresses padding only."""
        return _random_padding(g, B, S) if self.padding_only else _random_mask(g, B, T, S)

    # -- inputs and calls ----------------------------------------------------

    def gen(self, offset: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1000 + offset)

    def randn(self, g: torch.Generator, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype or self.dtype)

    def convert(self, mask: torch.Tensor | None, dtype: torch.dtype, T: int) -> torch.Tensor | None:
        """The course's bool mask, (B, 1, T, S) or a padding mask (B, 1, 1, S), in the declared convention.
        Conventions that are not padding-only get it expanded to (B, 1, T, S)."""
        if mask is None:
            return None
        conv = self.mask_convention
        if not self.padding_only:
            mask = mask.expand(mask.shape[0], 1, T, mask.shape[-1])  # (B, 1, T, S)
        if callable(conv):
            return conv(mask)
        if conv == "allowed":
            return mask
        if conv == "blocked":
            return _masks.to_blocked(mask)
        if conv == "additive":
            return _masks.to_additive(mask, dtype)
        padding = mask[:, 0, 0, :]  # (B, S): a padding mask broadcasts over queries
        if conv == "key_padding":
            return _masks.to_key_padding_mask(padding)
        return _masks.to_hf_attention_mask(padding)

    def qkv(
        self, g: torch.Generator, B: int, H: int, T: int, S: int, D: int, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        Hkv = H // self.groups
        return self.randn(g, B, H, T, D, dtype=dtype), self.randn(g, B, Hkv, S, D, dtype=dtype), \
            self.randn(g, B, Hkv, S, D, dtype=dtype)

    def run_fn(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Call the function: (output (B, H, T, D), weights or None)."""
        m = self.convert(mask, q.dtype, q.shape[-2])
        if self.call is not None:
            res = self.call(self.fn, q, k, v, m)
        elif m is None:
            res = self.fn(q, k, v)
        else:
            res = self.fn(q, k, v, mask=m)
        out, w = _split_result(res, "fn")
        if out.shape != q.shape[:-1] + v.shape[-1:]:
            raise _OutputShapeError(f"output {shape_str(out)} for q {shape_str(q)}, v {shape_str(v)}: expected (B, H, T, D) "
                             f"= {tuple(q.shape[:-1] + v.shape[-1:])}")
        return out, w

    def run_module(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        cache: Any = None,
        module: nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Call the module: (output (B, T, E), weights or None)."""
        module = self.module if module is None else module
        m = self.convert(mask, x.dtype, x.shape[1])
        if self.call is not None:
            res = self.call(module, x, memory, memory, m, cache)
        else:
            kwargs: dict[str, Any] = {}
            if m is not None:
                kwargs["mask"] = m
            if cache is not None:
                kwargs["cache"] = cache
            res = module(x, **kwargs) if memory is None else module(x, memory, memory, **kwargs)
        out, w = _split_result(res, "the module")
        if out.shape != x.shape:
            raise _OutputShapeError(f"output {shape_str(out)} for x {shape_str(x)}: expected (B, T, E) = {tuple(x.shape)}")
        return out, w

    # -- references ----------------------------------------------------------

    def alibi_of(self, H: int) -> torch.Tensor:
        """The slopes (H,) the function uses (measured) or the reference ones."""
        if H not in self._alibi_cache:
            self._alibi_cache[H] = self.probe_alibi(H)
        return self._alibi_cache[H]

    def reference(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        scale: float | None = None,
        alignment: str | None = None,
        pairing: str | None = None,
        slopes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """F.scaled_dot_product_attention in float64 with the conventions given (default: the declared ones).
        Rows with no allowed key are zeros. Returns (B, H, T, D)."""
        q, k, v = (t.to(torch.float64) for t in (q, k, v))  # differentiable: the SDPA check compares gradients
        B, H, T, D = q.shape
        S = k.shape[-2]
        G = H // k.shape[1]
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B, H, S, D): head h reads h // G
        pairing = pairing or self.rope
        if pairing is not None:
            inter = pairing == "interleaved"
            q = apply_rotary(q, base=self.rope_base, interleaved=inter)
            k = apply_rotary(k, base=self.rope_base, interleaved=inter)
        allowed = torch.ones(B, 1, T, S, dtype=torch.bool) if mask is None else mask.expand(B, 1, T, S)
        if self.causal is not None:
            allowed = allowed & _causal(T, S, alignment or self.alignment or self.measured_alignment or "top-left")
        bias = torch.zeros(1, H, T, S, dtype=torch.float64)
        if self.alibi:
            s = alibi_slopes(H, dtype=torch.float64) if slopes is None else slopes
            dist = (torch.arange(T)[:, None] + (S - T) - torch.arange(S)[None, :]).abs()  # (T, S)
            bias = -s[:, None, None] * dist[None].to(torch.float64)  # (H, T, S)
        attn = bias.masked_fill(~allowed, float("-inf"))  # (B, H, T, S)
        empty = ~allowed.any(dim=-1, keepdim=True)  # (B, 1, T, 1)
        attn = attn.masked_fill(empty, 0.0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, scale=scale)  # (B, H, T, D)
        return out.masked_fill(empty, 0.0)

    def module_reference(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        scale: float | None = None,
        module: nn.Module | None = None,
    ) -> torch.Tensor:
        """The module's own weights around F.scaled_dot_product_attention: (B, T, E) in float64."""
        spec = self.spec if module is None else _module_spec(module)
        if spec is None:
            raise ValueError("the module exposes no q_proj/k_proj/v_proj/out_proj weights")
        x = x.to(torch.float64)
        memory = x if memory is None else memory.to(torch.float64)
        B, T, _ = x.shape
        S = memory.shape[1]
        H, Hkv, D = spec["H"], spec["Hkv"], spec["D"]
        w: dict[str, tuple[Any, ...]] = {
            n: tuple(None if p is None else p.detach().to(torch.float64) for p in spec[n]) for n in "qkvo"
        }
        q = F.linear(x, *w["q"]).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = F.linear(memory, *w["k"]).view(B, S, Hkv, D).transpose(1, 2)  # (B, Hkv, S, D)
        v = F.linear(memory, *w["v"]).view(B, S, Hkv, D).transpose(1, 2)  # (B, Hkv, S, D)
        heads = self.reference(q, k, v, mask, scale=scale)  # (B, H, T, D)
        merged = heads.transpose(1, 2).reshape(B, T, H * D)  # (B, T, E)
        return F.linear(merged, *w["o"])

    # -- the module's cache --------------------------------------------------

    def _cache_factory(self, cache: bool | Callable[[], Any] | None) -> Callable[[], Any] | None:
        if cache is False:
            return None
        if cache is None or cache is True:
            params: Mapping[str, inspect.Parameter]
            try:
                params = inspect.signature(self.module.forward).parameters
            except (TypeError, ValueError):
                params = {}
            if "cache" in params or (cache is True and self.call is not None):
                return KVCache
            if cache is True:
                raise ValueError("cache=True, but the module's forward takes no `cache` argument (pass call=)")
            return None
        if not callable(cache):
            raise TypeError(f"cache must be None, True, False or a callable making an empty cache, got {cache!r}")
        return cache

    # -- measured conventions ------------------------------------------------

    def probe_alibi(self, H: int) -> torch.Tensor:
        """The slope of each head, read off the weights with zero queries (scores = the bias alone)."""
        T = S = 4
        D = 8
        q = torch.zeros(1, H, T, D, dtype=self.dtype)
        k = torch.zeros(1, H // self.groups, S, D, dtype=self.dtype)
        v = torch.eye(S, D, dtype=self.dtype).expand(1, H // self.groups, S, D).contiguous()  # one-hot values
        out, _ = self.run_fn(q, k, v)
        w = out[0, :, -1, :S].to(torch.float64)  # (H, S): last query's weights over the 4 keys
        return (w[:, -1].log() - w[:, -2].log()).detach()  # slope = log w[i, i] - log w[i, i - 1]


def _module_spec(module: nn.Module) -> _Spec | None:
    """The weights behind a module's projections (views: editing them edits the module), or None
    when it does not expose them."""
    if isinstance(module, nn.MultiheadAttention):
        E, H = module.embed_dim, module.num_heads
        if module._qkv_same_embed_dim:
            wq, wk, wv = module.in_proj_weight.split(E)  # (E, E) views of the fused (3E, E) weight
        else:
            wq, wk, wv = module.q_proj_weight, module.k_proj_weight, module.v_proj_weight
        bq, bk, bv = (None,) * 3 if module.in_proj_bias is None else module.in_proj_bias.split(E)
        return {"H": H, "Hkv": H, "D": E // H, "E": E, "kdim": module.kdim, "q": (wq, bq), "k": (wk, bk),
                "v": (wv, bv), "o": (module.out_proj.weight, module.out_proj.bias)}
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    if not all(isinstance(getattr(module, n, None), nn.Linear) for n in names):
        return None
    H = getattr(module, "num_heads", None)
    if not isinstance(H, int):
        return None
    q_proj, k_proj, v_proj, out_proj = (cast(nn.Linear, getattr(module, n)) for n in names)
    Hkv = getattr(module, "num_kv_heads", None) or getattr(module, "num_key_value_heads", None) or H
    E = q_proj.out_features
    if E % H or H % Hkv or k_proj.out_features != Hkv * (E // H):
        return None
    return {
        "H": H, "Hkv": Hkv, "D": E // H, "E": E, "kdim": k_proj.in_features,
        "q": (q_proj.weight, q_proj.bias), "k": (k_proj.weight, k_proj.bias),
        "v": (v_proj.weight, v_proj.bias), "o": (out_proj.weight, out_proj.bias),
    }


# ---------------------------------------------------------------------------
# The invariants. Each returns (status, detail, measured, tolerance).
# ---------------------------------------------------------------------------

# (B, Hkv, T, S, D): T == S, T < S, T > S, a single query (a decoding step), a single key (cross-attention to
# one memory token), one query and one key (the first token of a sequence), odd sizes
_SHAPES = ((2, 2, 5, 5, 8), (1, 3, 4, 7, 6), (2, 1, 7, 3, 5), (1, 2, 1, 9, 4), (2, 2, 3, 1, 4), (1, 2, 1, 1, 8),
           (3, 5, 6, 6, 3), (1, 1, 6, 6, 10))
# a module's (B, T) for the first line (self-attention: a one-token input among them), and its cross-attention
# cases (B, T, S, the memory's real lengths): a padded memory, one query over it (the first decoding step of an
# encoder-decoder), one memory token
_MODULE_SHAPES = ((2, 5), (1, 1), (3, 7))
_CROSS_SHAPES = ((2, 5, 7, (7, 4)), (3, 1, 7, (7, 3, 1)), (2, 4, 1, (1, 1)))


def _na(detail: str) -> _Outcome:
    return "n/a", detail, None, None


def _held_or_violated(err: float, tol: float, what: str = "max |diff|") -> _Outcome:
    if err <= tol:
        return "held", f"{what} < {_bound(tol)}", err, tol
    return "violated", f"{what} = {_num(err)}", err, tol


def _check_sdpa(c: _Checker) -> _Outcome:
    tol = c.tol
    raised: tuple[Exception, tuple[int, ...]] | None  # the first failure and its case
    cases: list[tuple[int, ...]]
    inputs: tuple[torch.Tensor, ...]
    ref_inputs: tuple[torch.Tensor, ...]
    worst, raised, n, grads = 0.0, None, 0, "values and gradients"
    worst_case: tuple[int, ...] = ()
    if c.is_module:
        if c.spec is None:
            return _na("the module exposes no q_proj/k_proj/v_proj/out_proj weights")
        cases = [(B, T, T) for B, T in _MODULE_SHAPES]
    else:
        # a causal or ALiBi function puts its queries at positions it chooses when T > S, and a RoPE
        # function rotates queries and keys by their own index: those get the shapes without ambiguity
        cases = [(B, Hkv * c.groups, T, S, D) for B, Hkv, T, S, D in _SHAPES
                 if not (c.rope and (T != S or D % 2)) and not ((c.causal is not None or c.alibi) and T > S)]
    for i, case in enumerate(cases):
        for with_mask in (False, True):
            if with_mask and c.causal is not None:
                continue
            g = c.gen(10 + i)
            try:
                if c.is_module:
                    B, T, S = case
                    x = c.randn(g, B, T, c.width()).requires_grad_()
                    mask = c.mask_for(g, B, T, S) if with_mask else None
                    out, _ = c.run_module(x, mask=mask)
                    with torch.enable_grad():
                        xr = x.detach().clone().requires_grad_()
                        ref = c.module_reference(xr, mask=mask)
                    inputs, ref_inputs = (x,), (xr,)
                else:
                    B, H, T, S, D = case
                    q, k, v = (t.requires_grad_() for t in c.qkv(g, B, H, T, S, D))
                    mask = c.mask_for(g, B, T, S) if with_mask else None
                    out, _ = c.run_fn(q, k, v, mask)
                    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
                    ref = c.reference(qr, kr, vr, mask)
                    inputs, ref_inputs = (q, k, v), (qr, kr, vr)
                n += 1
                case_err = _maxdiff(out, ref)
                if out.requires_grad:
                    cot = c.randn(g, *out.shape)
                    got = torch.autograd.grad(out, inputs, cot, allow_unused=True)
                    want = torch.autograd.grad(ref, ref_inputs, cot.to(torch.float64))
                    for a, b in zip(got, want):
                        case_err = max(case_err, math.inf if a is None else _maxdiff(a, b))
                else:
                    grads = "values; not differentiable, so no gradients"
                if case_err > max(worst, tol):
                    worst_case = case
                worst = max(worst, case_err)
            except Exception as exc:  # noqa: BLE001 (any failure of the user's code is a finding)
                raised = raised or (exc, case)
    what = f"{n} cases, {grads}"

    def shape(case: tuple[int, ...]) -> str:
        return f"x (B={case[0]}, T={case[1]})" if c.is_module else \
            f"q (B={case[0]}, H={case[1]}, T={case[2]}, D={case[4]}), S={case[3]}"

    if raised:
        first_exc, case = raised
        prefix = f"max |diff| = {_num(worst)}; " if n and worst > tol else ""
        return "violated", f"{prefix}{_raised(first_exc)} on {shape(case)}", math.inf, tol
    status, detail, err, _ = _held_or_violated(worst, tol)
    if status == "violated":
        detail += f" (worst on {shape(worst_case)})"
    return status, f"{detail}, {what}", err, tol


def _check_weights(c: _Checker) -> _Outcome:
    tol = c.tol
    g = c.gen(20)
    if c.is_module:
        B, T = 2, 5
        x = c.randn(g, B, T, c.width())
        mask = None if c.causal is not None else c.mask_for(g, B, T, T)
        with torch.no_grad():
            _, w = c.run_module(x, mask=mask)
        if w is None:
            return _na("the module returns no weights")
        if w.shape[-2:] != (T, T):
            return "violated", f"weights {shape_str(w)}, expected (..., T, S) = (..., {T}, {T})", math.inf, tol
        err = _maxdiff(w.sum(-1), torch.ones(()))
        return _held_or_violated(err, tol, "max |row sum - 1|")
    B, H, T, S, D = 2, 3 * c.groups, 6, 6, 6  # T != S is the first line's business
    q, k, v = c.qkv(g, B, H, T, S, D)
    mask = None if c.causal is not None else c.mask_for(g, B, T, S)
    with torch.no_grad():
        out, w = c.run_fn(q, k, v, mask)
    if w is None:
        return _na("the function returns no weights")
    if w.shape != (B, H, T, S):
        return "violated", f"weights {shape_str(w)}, expected (B, H, T, S) = {(B, H, T, S)}", math.inf, tol
    w64 = w.to(torch.float64)
    row_err = _maxdiff(w64.sum(-1), torch.ones(()))
    # which value head a query head reads is the heads check's business: take the closest one
    per_kv_head = w64[:, :, None] @ v.to(torch.float64)[:, None]  # (B, H, Hkv, T, D)
    gaps = (per_kv_head - out.detach().to(torch.float64)[:, :, None]).abs().amax(dim=(0, 3, 4))  # (H, Hkv)
    out_err = float(gaps.amin(dim=1).max()) if torch.isfinite(out).all() else math.inf
    if row_err <= tol and out_err <= tol:
        return "held", f"max |row sum - 1| and |out - weights @ v| < {_bound(tol)}", max(row_err, out_err), tol
    parts = []
    if row_err > tol:
        parts.append(f"max |row sum - 1| = {_num(row_err)}")
    if out_err > tol:
        parts.append(f"max |out - weights @ v| = {_num(out_err)}")
    return "violated", "; ".join(parts), max(row_err, out_err), tol


def _check_permutation(c: _Checker) -> _Outcome:
    if c.causal is not None:
        return _na("a causal mask orders the tokens")
    if c.rope or c.alibi:
        return _na("positions are part of the function")
    tol = c.tol
    g = c.gen(30)
    T = 6
    perm = torch.randperm(T, generator=g)
    perm2 = torch.randperm(T, generator=g)
    with torch.no_grad():
        if c.is_module:
            x = c.randn(g, 2, T, c.width())
            out, _ = c.run_module(x)
            out_p, _ = c.run_module(x[:, perm])
            err = _maxdiff(out_p, out[:, perm])
        else:
            q, k, v = c.qkv(g, 2, 2 * c.groups, T, T, 8)
            out, _ = c.run_fn(q, k, v)
            out_p, _ = c.run_fn(q[:, :, perm], k[:, :, perm], v[:, :, perm])  # every token moved
            out_k, _ = c.run_fn(q, k[:, :, perm2], v[:, :, perm2])  # keys and values moved together
            err = max(_maxdiff(out_p, out[:, :, perm]), _maxdiff(out_k, out))
    return _held_or_violated(err, tol)


def _check_causal_leak(c: _Checker) -> _Outcome:
    if c.causal is None and c.padding_only:
        return _na(f"mask_convention={c.mask_convention!r} expresses padding only")
    tol = c.tol
    g = c.gen(40)
    T = 6
    B = 2
    mask = None if c.causal is not None else _masks.causal_mask(T)[None, None].expand(B, 1, T, T)
    leak = 0.0
    inputs: tuple[torch.Tensor, ...]
    if c.is_module:
        x = c.randn(g, B, T, c.width()).requires_grad_()
        out, _ = c.run_module(x, mask=mask)
        inputs = (x,)
    else:
        q, k, v = (t.requires_grad_() for t in c.qkv(g, B, 2 * c.groups, T, T, 8))
        out, _ = c.run_fn(q, k, v, mask)
        inputs = (q, k, v)
    if not out.requires_grad:
        return _na("not differentiable, so the gradient test cannot run")
    t_axis = 1 if c.is_module else 2
    for t in range(T - 1):
        grads = torch.autograd.grad(out.select(t_axis, t).sum(), inputs, retain_graph=True, allow_unused=True)
        for gr in grads:
            if gr is not None:
                future = gr.narrow(t_axis, t + 1, T - t - 1)
                leak = max(leak, math.inf if not torch.isfinite(future).all() else float(future.abs().max()))
    if leak <= tol:
        return "held", f"max |d out_t / d input_j| < {_bound(tol)} for every j > t", leak, tol
    return "violated", f"max |d out_t / d input_j| over j > t = {_num(leak)}", leak, tol


def _check_padding(c: _Checker) -> _Outcome:
    """Gradient test: no output of a real query may depend on a padded key (or its value)."""
    if c.causal is not None:
        return _na("the function takes no mask")
    tol = c.tol
    g = c.gen(45)
    B, T = 3, 6
    lengths = torch.tensor([6, 4, 2])
    pad = _masks.padding_mask(lengths, T)  # (B, 1, 1, S)
    padded = ~pad[:, 0, 0, :]  # (B, S)
    if c.is_module:
        x = c.randn(g, B, T, c.width()).requires_grad_()
        out, _ = c.run_module(x, mask=pad)
        if not out.requires_grad:
            return _na("not differentiable, so the gradient test cannot run")
        # a padded position's own query may read anything: only the real queries' outputs count
        (gx,) = torch.autograd.grad(out, x, (~padded)[..., None].to(out.dtype).expand_as(out))
        grads = [gx[padded]]  # (n padded, E)
    else:
        q, k, v = (t.requires_grad_() for t in c.qkv(g, B, 2 * c.groups, T, T, 8))
        out, _ = c.run_fn(q, k, v, pad)
        if not out.requires_grad:
            return _na("not differentiable, so the gradient test cannot run")
        gk, gv = torch.autograd.grad(out, (k, v), torch.ones_like(out), allow_unused=True)
        grads = [gr.transpose(1, 2)[padded] for gr in (gk, gv) if gr is not None]  # (n padded, Hkv, D)
    leak = max((math.inf if not torch.isfinite(gr).all() else float(gr.abs().max()) for gr in grads), default=0.0)
    if leak <= tol:
        return "held", f"max |d out / d padded key| < {_bound(tol)}", leak, tol
    return "violated", f"max |d out / d padded key| = {_num(leak)}", leak, tol


def _check_alignment(c: _Checker) -> _Outcome:
    if c.causal is None:
        return _na("the caller's mask decides")
    if c.is_module:
        return _na("a module's alignment shows in cached decoding")
    tol = c.tol
    found: dict[str, bool] = {}
    worst: dict[str, float] = {}
    for i, (T, S) in enumerate(((3, 7), (2, 5))):
        g = c.gen(50 + i)
        q, k, v = c.qkv(g, 2, 2 * c.groups, T, S, 6)
        with torch.no_grad():
            out, _ = c.run_fn(q, k, v)
            G = c.groups
            k_rep, v_rep = (t.to(torch.float64).repeat_interleave(G, dim=1) for t in (k, v))  # (B, H, S, D)
            q64 = q.to(torch.float64)
            if c.rope or c.alibi:  # positions inside: compare with our reference in each alignment
                refs = {a: c.reference(q, k, v, alignment=a, pairing=c.measured_pairing) for a in _ALIGNMENTS}
            else:  # PyTorch's own causal biases
                refs = {"top-left": F.scaled_dot_product_attention(q64, k_rep, v_rep, attn_mask=causal_upper_left(T, S)),
                        "bottom-right": F.scaled_dot_product_attention(q64, k_rep, v_rep,
                                                                       attn_mask=causal_lower_right(T, S))}
        for a, ref in refs.items():
            worst[a] = max(worst.get(a, 0.0), _maxdiff(out, ref))
    for a in _ALIGNMENTS:
        found[a] = worst[a] <= tol
    detected = next((a for a in _ALIGNMENTS if found[a]), None)
    c.measured_alignment = detected
    names = {"top-left": "top-left, as is_causal=True", "bottom-right": "bottom-right, as with a KV cache"}
    if detected is None:
        return ("violated", f"neither: max |diff| = {_num(worst['top-left'])} against causal_upper_left, "
                f"{_num(worst['bottom-right'])} against causal_lower_right", min(worst.values()), tol)
    if c.alignment is not None and detected != c.alignment:
        return "violated", f"{names[detected]}; declared {c.alignment}", worst[c.alignment], tol
    return "held", f"{names[detected]}; T = 3, S = 7 and T = 2, S = 5", worst[detected], tol


def _check_low_precision(c: _Checker) -> _Outcome:
    findings, worst = [], {}
    for i, lowp in enumerate((torch.float16, torch.bfloat16)):
        tol = tolerance(lowp)
        g = c.gen(60 + i)
        try:
            with torch.no_grad():
                if c.is_module:
                    B, T = 2, 5
                    x = c.randn(g, B, T, c.width(), dtype=lowp)
                    mask = None if c.causal is not None else c.mask_for(g, B, T, T)
                    module = copy.deepcopy(c.module).to(lowp)
                    out, _ = c.run_module(x, mask=mask, module=module)
                    ref, _ = c.run_module(x.to(c.dtype), mask=mask, module=copy.deepcopy(module).to(c.dtype))
                else:
                    B, H, T, S, D = 2, 2 * c.groups, 5, 5, 8
                    q, k, v = c.qkv(g, B, H, T, S, D, dtype=lowp)
                    mask = None if c.causal is not None else c.mask_for(g, B, T, S)
                    out, _ = c.run_fn(q, k, v, mask)
                    ref, _ = c.run_fn(q.to(c.dtype), k.to(c.dtype), v.to(c.dtype), mask)
        except Exception as err:  # noqa: BLE001
            findings.append(f"{str(lowp).split('.')[-1]}: {_raised(err)}")
            worst[lowp] = math.inf
            continue
        if out.dtype != lowp:
            findings.append(f"{str(lowp).split('.')[-1]} input gave a {str(out.dtype).split('.')[-1]} output")
        worst[lowp] = _maxdiff(out, ref)
        if worst[lowp] > tol:
            findings.append(f"{str(lowp).split('.')[-1]}: " + ("not finite" if math.isinf(worst[lowp])
                                                                 else f"max |diff| = {_num(worst[lowp])}"))
    if findings:
        return "violated", "; ".join(findings), max(worst.values()), None
    return ("held", f"max |diff| to its {str(c.dtype).split('.')[-1]} result < {_bound(tolerance(torch.float16))} "
            f"and < {_bound(tolerance(torch.bfloat16))}", max(worst.values()), None)


def _check_empty_rows(c: _Checker) -> _Outcome:
    if c.causal is not None:
        return _na("under a causal mask every query sees a key")
    tol = c.tol
    g = c.gen(70)
    B, T, S = 3, 5, 5
    if c.padding_only:
        mask = _random_padding(g, B, S, empty_last=True)
    else:
        mask = _random_mask(g, B, T, S)
        mask[0, 0, 1] = False  # two queries with every key masked
        mask[2, 0, 3] = False
    empty = ~mask.expand(B, 1, T, S).any(dim=-1)  # (B, 1, T)
    n_empty = int(empty.sum())
    inputs: tuple[torch.Tensor, ...]
    if c.is_module:
        x = c.randn(g, B, T, c.width()).requires_grad_()
        out, w = c.run_module(x, mask=mask)
        target = None  # what an empty row must give: out_proj(0), the output projection's bias
        if c.spec is not None:
            w_o, b_o = (None if p is None else p.detach().to(torch.float64) for p in c.spec["o"])
            target = F.linear(torch.zeros(c.spec["E"], dtype=torch.float64), cast(torch.Tensor, w_o), b_o)
        rows = out[empty[:, 0]]  # (n_empty, E)
        inputs = (x,)
    else:
        q, k, v = (t.requires_grad_() for t in c.qkv(g, B, 2 * c.groups, T, S, 8))
        out, w = c.run_fn(q, k, v, mask)
        rows = out.transpose(1, 2)[empty[:, 0]]  # (n_empty, H, D)
        target = torch.zeros((), dtype=torch.float64)
        inputs = (q, k, v)
    nan_rows = int((~torch.isfinite(rows)).flatten(1).any(dim=1).sum()) if rows.numel() else 0
    if nan_rows:
        return "violated", f"NaN in {nan_rows} of {n_empty} empty rows", math.inf, tol
    if not torch.isfinite(out).all():
        return "violated", "NaN in rows that have keys", math.inf, tol
    if out.requires_grad:
        grads = torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True)
        if any(gr is not None and not torch.isfinite(gr).all() for gr in grads):
            return "violated", f"finite output, but NaN gradients through the {n_empty} empty rows", math.inf, tol
    if target is None:
        return "held", f"{n_empty} empty rows finite (no weights to compare)", 0.0, tol
    err = _maxdiff(rows, target)
    if w is not None and not c.is_module:
        err = max(err, _maxdiff(w.transpose(1, 2)[empty[:, 0]], torch.zeros(())))
    what = "max |output| on empty rows" if not c.is_module else "max |output - out_proj(0)| on empty rows"
    return _held_or_violated(err, tol, what)


def _check_scale(c: _Checker) -> _Outcome:
    tol = c.tol
    g = c.gen(80)
    with torch.no_grad():
        if c.is_module:
            if c.spec is None:
                return _na("the module exposes no projection weights")
            H, D = c.spec["H"], c.spec["D"]
            x = c.randn(g, 2, 5, c.spec["E"])
            out, _ = c.run_module(x)

            def ref(r: float) -> torch.Tensor:
                return c.module_reference(x, scale=r / math.sqrt(D))
        else:
            H, D = 4 * c.groups, 8
            q, k, v = c.qkv(g, 2, H, 5, 5, D)
            out, _ = c.run_fn(q, k, v)

            def ref(r: float) -> torch.Tensor:
                return c.reference(q, k, v, scale=r / math.sqrt(D), pairing=c.measured_pairing,
                                   alignment=c.measured_alignment,
                                   slopes=c.alibi_of(H) if c.alibi else None)
        err_at_1 = _maxdiff(out, ref(1.0))
        if err_at_1 <= tol:
            c.measured_scale = 1.0
            return "held", f"scale x sqrt(D) = 1 within max |diff| < {_bound(tol)}", 1.0, tol
        # fit the scale: a log grid from 1/32 to 32 times 1/sqrt(D), then a golden-section refinement
        grid = [2.0 ** (e / 8) for e in range(-40, 41)]
        errs = [_maxdiff(out, ref(r)) for r in grid]
        i = min(range(len(grid)), key=errs.__getitem__)
        lo, hi = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, len(grid) - 1)])
        phi = (math.sqrt(5) - 1) / 2
        for _ in range(60):
            a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
            if _maxdiff(out, ref(math.exp(a))) < _maxdiff(out, ref(math.exp(b))):
                hi = b
            else:
                lo = a
        r = math.exp((lo + hi) / 2)
        # a function that computes in a lower precision inside still has a scale: allow its rounding
        if _maxdiff(out, ref(r)) > max(1e3 * tol, 1e-4):
            return _na("no single scale reproduces the output: see the first line")
    c.measured_scale = r
    if abs(r - 1) < 1e-3:  # the right scale; what differs at 1 exactly is the first line's business
        return "held", f"scale x sqrt(D) = {r:.2f}, fitted", r, tol
    why = ""
    if H > 1 and abs(r - 1 / math.sqrt(H)) < 1e-4:
        why = f" = 1/sqrt(H) with H = {H}: 1/sqrt(d_model) used"
    elif abs(r * math.sqrt(D) - 1) < 1e-4:
        why = ": 1/D used"
    elif abs(r - math.sqrt(D)) < 1e-3:
        why = ": not scaled at all"
    return "violated", f"scale x sqrt(D) = {r:.2f}{why}", r, tol


def _changed_heads(before: torch.Tensor, after: torch.Tensor, threshold: float) -> list[int]:
    """Which heads (axis 1 of (B, H, T, D)) moved by more than threshold."""
    d = (after.to(torch.float64) - before.to(torch.float64)).abs()
    d = torch.nan_to_num(d, nan=math.inf).amax(dim=(0, 2, 3))  # (H,)
    return [h for h in range(d.shape[0]) if d[h] > threshold]


def _check_heads(c: _Checker) -> _Outcome:
    """Perturb one head's slice (a query head, a key head, a value head) and see which heads' outputs move."""
    tol = c.tol
    g = c.gen(90)
    if c.is_module:
        if c.spec is None:
            return _na("the module exposes no q_proj/k_proj/v_proj/out_proj weights")
        H, Hkv, D, E = c.spec["H"], c.spec["Hkv"], c.spec["D"], c.spec["E"]
        x = c.randn(g, 2, 5, E)
        base_module = copy.deepcopy(c.module)
        with torch.no_grad():  # an identity output projection shows the merged heads (B, T, H * D)
            w_o, b_o = cast(_Spec, _module_spec(base_module))["o"]  # a copy of c.module: it has a spec too
            w_o.copy_(torch.eye(E, dtype=w_o.dtype))
            if b_o is not None:
                b_o.zero_()

        def heads_after(which: str | None = None, head: int = 0) -> torch.Tensor:
            m = copy.deepcopy(base_module)
            if which is not None:  # move the rows of W^Q, W^K or W^V that belong to this head
                w = cast(_Spec, _module_spec(m))[which][0]
                w[head * D:(head + 1) * D] += c.randn(g, D, w.shape[1])
            out, _ = c.run_module(x, module=m)  # (B, T, E)
            return out.view(2, 5, H, D).transpose(1, 2)  # (B, H, T, D)
    else:
        Hkv, D = 4, 6
        H = Hkv * c.groups
        qkv = c.qkv(g, 2, H, 5, 5, D)

        def heads_after(which: str | None = None, head: int = 0) -> torch.Tensor:
            ins = [t.clone() for t in qkv]
            if which is not None:  # move one head of q, k or v
                t = ins["qkv".index(which)]
                t[:, head] += c.randn(g, t.shape[0], t.shape[2], t.shape[3])
            return c.run_fn(*ins)[0]  # (B, H, T, D)
    if H == 1:
        return _na("one head")
    G = H // Hkv
    threshold = max(1e3 * tol, 1e-6)
    problems, key_reads, query_ok = [], [], True
    with torch.no_grad():
        base = heads_after()
        for h in range(H):
            moved = _changed_heads(base, heads_after("q", h), threshold)
            if moved != [h]:
                query_ok = False
                problems.append(f"query head {h}'s slice moves heads {moved}")
        for which in "kv":
            for kvh in range(Hkv):
                moved = _changed_heads(base, heads_after(which, kvh), threshold)
                want = list(range(kvh * G, (kvh + 1) * G))
                if which == "k":
                    key_reads.append(moved)
                if moved != want:
                    problems.append(f"{which} head {kvh} moves query heads {moved}, expected {want}")
    if not problems:
        mapping = f", query head h reads key/value head h // {G}" if G > 1 else ""
        return "held", f"{H} heads{mapping}", 0.0, tol
    if G > 1 and query_ok and sorted(sum(key_reads, [])) == list(range(H)):
        got = [next(kvh for kvh, m in enumerate(key_reads) if h in m) for h in range(H)]
        if got == [h % Hkv for h in range(H)]:
            return "violated", f"query head h reads key/value head h % {Hkv}, not h // {G}", 1.0, tol
        shown = ", ".join(map(str, got[:8])) + (", ..." if H > 8 else "")
        return "violated", f"query heads read key/value heads [{shown}], not h // {G}", 1.0, tol
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return "violated", problems[0] + more, 1.0, tol


def _check_cross(c: _Checker) -> _Outcome:
    if not c.is_module:
        return _na("a function: the T != S shapes of the first line cover it")
    if c.causal is not None:
        return _na("the module is causal")
    if c.spec is None:
        return _na("the module exposes no projection weights")
    tol = c.tol
    worst, where = 0.0, ""
    for i, (B, T, S, lengths) in enumerate(_CROSS_SHAPES):
        g = c.gen(100 + i)
        x = c.randn(g, B, T, c.spec["E"])
        memory = c.randn(g, B, S, c.spec["kdim"])
        mask = _masks.padding_mask(torch.tensor(lengths), S)  # (B, 1, 1, S)
        try:
            with torch.no_grad():
                out, _ = c.run_module(x, memory, mask=mask)
        except Exception as exc:  # noqa: BLE001
            return "violated", f"{_raised(exc)} (T = {T}, S = {S})", math.inf, tol
        ref = c.module_reference(x, memory, mask, scale=(c.measured_scale or 1.0) / math.sqrt(c.spec["D"]))
        err = _maxdiff(out, ref)
        if err > worst or not where:
            worst, where = err, f"T = {T}, S = {S}"
    shown = "; ".join(f"T = {T}, S = {S}" for _, T, S, _ in _CROSS_SHAPES)
    if worst <= tol:
        return "held", f"max |diff| < {_bound(tol)}, key padding; {shown}", worst, tol
    return "violated", f"max |diff| = {_num(worst)} at {where}, key padding", worst, tol


def _check_kv_cache(c: _Checker) -> _Outcome:
    if not c.is_module:
        return _na("a function")
    if c.cache_factory is None:
        return _na("the module takes no cache")
    if c.padding_only:
        return _na(f"mask_convention={c.mask_convention!r} cannot express the causal masks")
    tol = c.tol
    g = c.gen(110)
    B, T = 2, 7
    x = c.randn(g, B, T, c.width())
    own = c.causal is not None  # the module masks by itself

    def mask(t: int, s: int) -> torch.Tensor | None:
        return None if own else _masks.causal_mask(t, s, offset=s - t)[None, None].expand(B, 1, t, s)

    try:
        with torch.no_grad():
            full, _ = c.run_module(x, mask=mask(T, T))
            cache = c.cache_factory()
            steps = [c.run_module(x[:, :3], mask=mask(3, 3), cache=cache)[0],  # prefill 3 tokens
                     c.run_module(x[:, 3:5], mask=mask(2, 5), cache=cache)[0]]  # a chunk of 2
            steps += [c.run_module(x[:, t:t + 1], cache=cache)[0] for t in (5, 6)]  # one token at a time
            cache = c.cache_factory()  # a one-token prompt: the first step sees a single key
            first = [c.run_module(x[:, t:t + 1], cache=cache)[0] for t in range(3)]
    except Exception as exc:  # noqa: BLE001
        return "violated", _raised(exc), math.inf, tol
    worst = max(_maxdiff(torch.cat(steps, dim=1), full), _maxdiff(torch.cat(first, dim=1), full[:, :3]))
    status, detail, err, _ = _held_or_violated(worst, tol)
    return status, f"{detail}; prefill 3, a chunk of 2, then 1 + 1; and from one token, 1 + 1 + 1", err, tol


def _check_deterministic(c: _Checker) -> _Outcome:
    g = c.gen(120)
    with torch.no_grad():
        if c.is_module:
            x = c.randn(g, 2, 5, c.width())
            a, wa = c.run_module(x)
            b, wb = c.run_module(x)
        else:
            q, k, v = c.qkv(g, 2, 2 * c.groups, 5, 5, 8)
            a, wa = c.run_fn(q, k, v)
            b, wb = c.run_fn(q, k, v)
    err = _maxdiff(a, b)
    if wa is not None and wb is not None:
        err = max(err, _maxdiff(wa, wb))
    if err == 0:
        return "held", "two calls, identical outputs", 0.0, 0.0
    return "violated", f"two calls on the same input differ by {_num(err)}", err, 0.0


def _check_rope(c: _Checker) -> _Outcome:
    if not c.rope:
        return _na("rope= not given")
    tol = c.tol
    g = c.gen(130)
    q, k, v = c.qkv(g, 2, 2 * c.groups, 6, 6, 8)
    with torch.no_grad():
        out, _ = c.run_fn(q, k, v)
        errs = {p: _maxdiff(out, c.reference(q, k, v, pairing=p, alignment=c.measured_alignment))
                for p in _PAIRINGS}
    detected = next((p for p in _PAIRINGS if errs[p] <= tol), None)
    c.measured_pairing = detected
    if detected is None:
        return ("violated", f"neither pairing: max |diff| = {_num(errs['interleaved'])} interleaved, "
                f"{_num(errs['half-split'])} half-split", min(errs.values()), tol)
    if detected != c.rope:
        return "violated", f"{detected}; the weights are {c.rope}", errs[c.rope], tol
    return "held", f"{detected}, as declared", errs[detected], tol


def _check_alibi(c: _Checker) -> _Outcome:
    if not c.alibi:
        return _na("alibi= not given")
    tol = 1e-6  # the slopes are read off the weights in float64 (float32: a little less exact)
    if c.dtype == torch.float32:
        tol = 1e-4
    worst, parts = 0.0, []
    for H in (8, 12) if 8 % c.groups == 0 and 12 % c.groups == 0 else (8 * c.groups, 12 * c.groups):
        measured = c.alibi_of(H)
        err = _maxdiff(measured, alibi_slopes(H, dtype=torch.float64))
        worst = max(worst, err)
        if err <= tol:
            parts.append(f"{H} heads right")
        else:
            wrong = int(((measured - alibi_slopes(H, dtype=torch.float64)).abs() > tol).sum())
            parts.append(f"{H} heads: {wrong} slopes off by up to {_num(err)}")
    if worst <= tol:
        return "held", f"max |slope - attnbook.alibi_slopes| < {_bound(tol)}", worst, tol
    return "violated", "; ".join(parts), worst, tol


# -- beyond the short, order-one, contiguous inputs of the lines above --------------------------------------

_S_SHORT, _S_MID, _S_LONG = LONG_KEY_LENGTHS  # 129, 200, 257: ragged against TILE_SIZES (16, 64, 128)
# (B, Hkv, T, S, D, with a padding mask): one query over 257 keys (decoding), 3 queries over 200 keys, and
# self-attention over 129 keys with a head dim of 80
_LONG_SHAPES = ((1, 2, 1, _S_LONG, 8, False), (2, 1, 3, _S_MID, 16, True), (1, 1, _S_SHORT, _S_SHORT, 80, False))
# a module's (B, T, with a padding mask) for self-attention, and the length of the cached-decoding case
_LONG_MODULE = ((1, _S_LONG, False), (2, _S_SHORT, True))
_LONG_CACHED = _S_MID
# (B, Hkv, T, S, D, Dv, with a mask): values narrower and wider than the queries and keys
_VALUE_SHAPES = ((2, 2, 5, 5, 8, 3, True), (1, 1, 4, 7, 6, 12, False))
# the large-logits line: each query row's scores are shifted by an offset drawn from [-LARGE, LARGE] and spread
# by a factor from 1 to SPREAD; in float32 exp overflows above 88.7 and underflows to 0 below about -104
_LARGE = 300.0
_SPREAD = 30.0
_LARGE_TOL = 1e-3  # float32 scores of size 300 carry rounding errors of about 1e-5 (see _check_large_logits)


def _needs_first_line(c: _Checker) -> _Outcome | None:
    """The long, large-logits and value-width lines take the first line's reference where it does not go; a
    function that already differs from it on short inputs would light them all up, so they wait for it."""
    if c.statuses.get("sdpa") == "violated":
        return _na("differs from SDPA on short inputs already: see the first line")
    if c.statuses.get("sdpa") != "held":
        return _na("no reference: see the first line")
    return None


def _against_reference(
    c: _Checker, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, g: torch.Generator
) -> tuple[float, float | None]:
    """max |output - reference| and, when the output is differentiable, max |gradient - reference's| for a
    random cotangent (None when it is not)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, _ = c.run_fn(q, k, v, mask)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        ref = c.reference(qr, kr, vr, mask)
    err = _maxdiff(out, ref)
    if not out.requires_grad:
        return err, None
    cot = c.randn(g, *out.shape)
    got = torch.autograd.grad(out, (q, k, v), cot, allow_unused=True)
    want = torch.autograd.grad(ref, (qr, kr, vr), cot.to(torch.float64))
    return err, max(math.inf if a is None else _maxdiff(a, b) for a, b in zip(got, want))


def _module_against_reference(
    c: _Checker, x: torch.Tensor, mask: torch.Tensor | None, g: torch.Generator
) -> tuple[float, float | None]:
    """As :func:`_against_reference`, for a module on x (B, T, E)."""
    x = x.detach().requires_grad_()
    out, _ = c.run_module(x, mask=mask)
    xr = x.detach().clone().requires_grad_()
    with torch.enable_grad():
        ref = c.module_reference(xr, mask=mask)
    err = _maxdiff(out, ref)
    if not out.requires_grad:
        return err, None
    cot = c.randn(g, *out.shape)
    (got,) = torch.autograd.grad(out, x, cot, allow_unused=True)
    (want,) = torch.autograd.grad(ref, xr, cot.to(torch.float64))
    return err, math.inf if got is None else _maxdiff(got, want)


def _cached_against_full(c: _Checker, x: torch.Tensor, prefill: int) -> float:
    """Prefill ``prefill`` tokens into an empty cache, then decode the rest one token at a time: max |diff| to
    one causal pass over all of x (B, T, E)."""
    assert c.cache_factory is not None
    B, T = x.shape[:2]
    own = c.causal is not None

    def mask(t: int, s: int) -> torch.Tensor | None:
        return None if own else _masks.causal_mask(t, s, offset=s - t)[None, None].expand(B, 1, t, s)

    with torch.no_grad():
        full, _ = c.run_module(x, mask=mask(T, T))
        cache = c.cache_factory()
        steps = [c.run_module(x[:, :prefill], mask=mask(prefill, prefill), cache=cache)[0]]
        steps += [c.run_module(x[:, t:t + 1], cache=cache)[0] for t in range(prefill, T)]
    return _maxdiff(torch.cat(steps, dim=1), full)


def _check_long_keys(c: _Checker) -> _Outcome:
    """The first line's comparison (values and gradients) on :data:`LONG_KEY_LENGTHS` keys: past the tiles of a
    tiled kernel (:data:`TILE_SIZES`) and ragged against them, where a forgotten rescale or a window left on
    shows."""
    if (wait := _needs_first_line(c)) is not None:
        return wait
    tol = c.tol
    worst, grads, where, n = 0.0, True, "", 0
    for i, case in enumerate(_LONG_MODULE if c.is_module else _LONG_SHAPES):
        g = c.gen(140 + i)
        if c.is_module:
            B, T, padded = case
            S = T
        else:
            B, Hkv, T, S, D, padded = case
            if (c.rope and T != S) or ((c.causal is not None or c.alibi) and T > S):
                continue
        mask = _random_padding(g, B, S) if padded and c.causal is None else None
        try:
            if c.is_module:
                err, grad_err = _module_against_reference(c, c.randn(g, B, T, c.width()), mask, g)
            else:
                err, grad_err = _against_reference(c, *c.qkv(g, B, Hkv * c.groups, T, S, D), mask, g)
        except Exception as exc:  # noqa: BLE001
            return "violated", f"{_raised(exc)} (T = {T}, S = {S})", math.inf, tol
        n += 1
        grads = grads and grad_err is not None
        case_err = max(err, grad_err or 0.0)
        if case_err > worst:
            worst, where = case_err, f"T = {T}, S = {S}"
    what = f"{n} cases, {'values and gradients' if grads else 'values'}"
    if c.is_module and c.statuses.get("kv_cache") == "held":  # a short cache that fails is its own line's
        g = c.gen(149)
        x = c.randn(g, 1, _LONG_CACHED, c.width())
        try:
            err = _cached_against_full(c, x, _LONG_CACHED - 1)
        except Exception as exc:  # noqa: BLE001
            return "violated", f"{_raised(exc)} (cached decoding after {_LONG_CACHED - 1} tokens)", math.inf, tol
        what += f", and decoding after {_LONG_CACHED - 1} cached tokens"
        if err > worst:
            worst, where = err, f"decoding after {_LONG_CACHED - 1} cached tokens"
    if worst <= tol:
        return "held", f"max |diff| < {_bound(tol)}, {what}", worst, tol
    return "violated", f"max |diff| = {_num(worst)} at {where}", worst, tol


def _large_inputs(
    c: _Checker, g: torch.Generator, B: int, H: int, T: int, S: int, D: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 q, k, v whose scores (B, H, T, S) are, row by row, an offset in [-300, 300] plus a spread of
    1 to 30 times a unit normal. Every key's feature 0 is 4 and each query row's feature 0 carries its
    offset (a shift softmax ignores and a bare exp does not)."""
    q, k, v = c.qkv(g, B, H, T, S, D, dtype=torch.float64)
    offset = (torch.rand(B, H, T, 1, generator=g, dtype=torch.float64) * 2 - 1) * _LARGE  # (B, H, T, 1)
    spread = _SPREAD ** torch.rand(B, H, T, 1, generator=g, dtype=torch.float64)  # (B, H, T, 1), 1 to 30
    q = q * spread
    q[..., 0] = (offset[..., 0] * math.sqrt(D) / 4)  # q_0 * k_0 / sqrt(D) = the offset
    k[..., 0] = 4.0
    return q.float(), k.float(), v.float()


def _check_large_logits(c: _Checker) -> _Outcome:
    """float32 on scores in the hundreds, where a softmax without the row maximum overflows (exp(89) is inf
    in float32) and F.scaled_dot_product_attention stays finite, against the float64 reference on the same
    rounded inputs. Rounding a score of 300 in float32 moves it by about 1e-5, and the output by as much."""
    if (wait := _needs_first_line(c)) is not None:
        return wait
    tol = _LARGE_TOL
    worst = 0.0
    try:
        with torch.no_grad():
            if c.is_module:
                assert c.spec is not None  # the first line held
                g = c.gen(150)
                B, T = 2, 6
                x = c.randn(g, B, T, c.width(), dtype=torch.float64)
                module = copy.deepcopy(c.module).to(torch.float64)
                spec = cast(_Spec, _module_spec(module))
                H, Hkv, D = spec["H"], spec["Hkv"], spec["D"]
                w = {n: spec[n] for n in "qk"}
                q = F.linear(x, *w["q"]).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
                k = F.linear(x, *w["k"]).view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
                k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D)
                top = float((q @ k.transpose(-2, -1)).abs().max()) / math.sqrt(D)
                for p in w["q"]:  # scale W^Q (and its bias): the largest score becomes 300
                    if p is not None:
                        p.mul_(_LARGE / top)
                mask = None if c.causal is not None else c.mask_for(g, B, T, T)
                module = module.float()  # the reference gets the same rounded weights and inputs
                out, _ = c.run_module(x.float(), mask=mask, module=module)
                ref = c.module_reference(x.float(), mask=mask, module=copy.deepcopy(module).double())
                worst = _maxdiff(out, ref)
                if out.dtype != torch.float32:
                    return "violated", f"a float32 input gave a {str(out.dtype).split('.')[-1]} output", math.inf, tol
            else:
                for i, (B, Hkv, T, S, D, masked) in enumerate(((2, 2, 6, 7, 8, True), (1, 1, 1, 9, 8, False))):
                    if (c.rope and T != S) or ((c.causal is not None or c.alibi) and T > S):
                        T = S
                    g = c.gen(150 + i)
                    q, k, v = _large_inputs(c, g, B, Hkv * c.groups, T, S, D)
                    mask = c.mask_for(g, B, T, S) if masked and c.causal is None else None
                    out, _ = c.run_fn(q, k, v, mask)
                    if out.dtype != torch.float32:
                        return ("violated", f"a float32 input gave a {str(out.dtype).split('.')[-1]} output",
                                math.inf, tol)
                    worst = max(worst, _maxdiff(out, c.reference(q, k, v, mask)))
    except Exception as exc:  # noqa: BLE001
        return "violated", f"float32: {_raised(exc)}", math.inf, tol
    scores = f"scores offset by up to +-{_LARGE:.0f} per row" if not c.is_module else \
        f"W^Q scaled so that the largest score is {_LARGE:.0f}"
    if math.isinf(worst):
        return "violated", f"not finite (NaN or inf) with {scores}", worst, tol
    if worst > tol:
        return "violated", f"max |diff| to the float64 reference ~ {worst:.0e} with {scores}", worst, tol
    return "held", f"max |diff| to the float64 reference < {_bound(tol)}, {scores}", worst, tol


def _layouts(
    c: _Checker, g: torch.Generator, B: int, H: int, T: int, D: int
) -> Iterator[tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """(name, (q, k, v)) as views of the layouts real code hands to attention; T = S (self-attention)."""
    Hkv = H // c.groups
    q = c.randn(g, B, T, H, D).transpose(1, 2)  # (B, H, T, D) view of (B, T, H, D)
    k = c.randn(g, B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D) view of (B, T, Hkv, D)
    v = c.randn(g, B, T, Hkv, D).transpose(1, 2)
    yield "(B, T, H, D) transposed", (q, k, v)
    fused = c.randn(g, B, T, H + 2 * Hkv, D)  # (B, T, H + 2 Hkv, D): one projection for q, k and v
    q, k, v = (t.transpose(1, 2) for t in fused.split([H, Hkv, Hkv], dim=2))  # (B, H or Hkv, T, D) views
    yield "slices of a fused qkv projection", (q, k, v)


def _check_layout(c: _Checker) -> _Outcome:
    """Non-contiguous views (the transposes and slices a model's reshapes leave) must give what their
    contiguous copies give: values and gradients. A function that raises on them violates it too."""
    tol = c.tol
    g = c.gen(160)
    B, T = 2, 6
    worst, names = 0.0, []
    cases: list[tuple[str, tuple[torch.Tensor, ...]]]
    if c.is_module:
        x_seq_first = c.randn(g, T, B, c.width())  # (T, B, E): nn.MultiheadAttention's default layout
        cases = [("(T, B, E) transposed", (x_seq_first.transpose(0, 1),))]  # (B, T, E) view
        x_wide = c.randn(g, B, 2 * T, c.width())
        cases.append(("every other token of a longer sequence", (x_wide[:, ::2],)))  # (B, T, E) view
    else:
        cases = list(_layouts(c, g, B, 2 * c.groups, T, 8))
    mask = None if c.causal is not None else c.mask_for(g, B, T, T)
    for name, views in cases:
        base = [t.detach().requires_grad_() for t in views]  # non-contiguous leaves
        copies = [t.detach().contiguous().requires_grad_() for t in views]
        try:  # the contiguous copies first: a failure there is not the layout's
            if c.is_module:
                want, _ = c.run_module(copies[0], mask=mask)
                again, _ = c.run_module(copies[0], mask=mask)
            else:
                want, _ = c.run_fn(copies[0], copies[1], copies[2], mask)
                again, _ = c.run_fn(copies[0], copies[1], copies[2], mask)
        except Exception:  # noqa: BLE001
            return _na("fails on contiguous inputs too: see the first line")
        if _maxdiff(again, want) != 0:
            return _na("two calls on the same input differ: see deterministic")
        try:
            if c.is_module:
                out, _ = c.run_module(base[0], mask=mask)
            else:
                out, _ = c.run_fn(base[0], base[1], base[2], mask)
        except Exception as exc:  # noqa: BLE001
            return "violated", f"{_raised(exc)} ({name})", math.inf, tol
        err = _maxdiff(out, want)
        if out.requires_grad and want.requires_grad:
            cot = c.randn(g, *out.shape)
            got = torch.autograd.grad(out, base, cot, allow_unused=True)
            exp = torch.autograd.grad(want, copies, cot, allow_unused=True)
            for a, b in zip(got, exp):
                if (a is None) != (b is None):
                    err = math.inf
                elif a is not None and b is not None:
                    err = max(err, _maxdiff(a, b))
        if err > tol:
            names.append(name)
        worst = max(worst, err)
    shown = " and ".join(n for n, _ in cases)
    if worst <= tol:
        return "held", f"max |diff| to contiguous copies < {_bound(tol)}: {shown}", worst, tol
    return "violated", f"max |diff| to contiguous copies = {_num(worst)}: {' and '.join(names)}", worst, tol


def _check_value_dim(c: _Checker) -> _Outcome:
    """Values may be narrower or wider than queries and keys (Dv != D, as in multi-head latent attention):
    the output is (B, H, T, Dv) and the scale stays 1/sqrt(D)."""
    if c.is_module:
        return _na("a module: its value width is its own")
    if (wait := _needs_first_line(c)) is not None:
        return wait
    tol = c.tol
    worst, grads, dims = 0.0, True, []
    for i, (B, Hkv, T, S, D, Dv, masked) in enumerate(_VALUE_SHAPES):
        if (c.rope and T != S) or ((c.causal is not None or c.alibi) and T > S):
            continue
        dims.append(f"D = {D}, Dv = {Dv}")
        g = c.gen(170 + i)
        H = Hkv * c.groups
        q, k = c.randn(g, B, H, T, D), c.randn(g, B, Hkv, S, D)
        v = c.randn(g, B, Hkv, S, Dv)
        mask = c.mask_for(g, B, T, S) if masked and c.causal is None else None
        try:
            err, grad_err = _against_reference(c, q, k, v, mask, g)
        except Exception as exc:  # noqa: BLE001
            return "violated", f"{_raised(exc)} (D = {D}, Dv = {Dv})", math.inf, tol
        grads = grads and grad_err is not None
        worst = max(worst, err, grad_err or 0.0)
    status, detail, measured, _ = _held_or_violated(worst, tol)
    return status, f"{detail}, {'values and gradients' if grads else 'values'}; {' and '.join(dims)}", measured, tol


_CHECKS = {
    "sdpa": _check_sdpa, "weights": _check_weights, "permutation": _check_permutation,
    "causal_leak": _check_causal_leak, "padding": _check_padding, "causal_alignment": _check_alignment, "low_precision": _check_low_precision,
    "empty_rows": _check_empty_rows, "scale": _check_scale, "heads": _check_heads, "cross_attention": _check_cross,
    "kv_cache": _check_kv_cache, "deterministic": _check_deterministic, "long_keys": _check_long_keys,
    "large_logits": _check_large_logits, "layout": _check_layout, "value_dim": _check_value_dim,
    "rope": _check_rope, "alibi": _check_alibi,
}
# conventions are measured first, so that the diagnostic checks can use them
_ORDER = ("causal_alignment", "rope", "alibi", "scale")


# ---------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------


def _subject(fn: Callable[..., Any]) -> str:
    if isinstance(fn, nn.Module):
        return type(fn).__name__ + "(...)"
    return getattr(fn, "__qualname__", getattr(fn, "__name__", type(fn).__name__))


def check_attention(
    fn: Callable[..., Any],
    *,
    causal: bool | str | None = None,
    mask_convention: str | Callable[[torch.Tensor], torch.Tensor] = "allowed",
    groups: int = 1,
    rope: str | None = None,
    rope_base: float = 10000.0,
    alibi: bool = False,
    call: Callable[..., Any] | None = None,
    cache: bool | Callable[[], Any] | None = None,
    dtype: torch.dtype = torch.float64,
    tolerance: float | None = None,
    seed: int = 0,
    name: str | None = None,
    verbose: bool = True,
) -> AttentionReport:
    """Run the invariant battery on an attention function or module; print one line per invariant.

    Args:
        fn: a function ``fn(q, k, v, mask=None)`` with q ``(B, H, T, D)`` and k, v ``(B, H // groups, S, D)``,
            returning the output ``(B, H, T, D)`` or ``(output, weights)``; or an ``nn.Module`` called as
            ``module(x, mask=...)`` / ``module(x, memory, memory, mask=...)`` on ``(B, T, E)`` (see the module's
            docstring). A module is deep-copied and put in eval mode; yours is not touched.
        causal: ``None`` (default): the function takes the caller's mask and the checker passes masks.
            ``True``, ``"top-left"`` or ``"bottom-right"``: the function applies a causal mask by itself and is
            called without one; for T != S the checker finds which alignment it uses, against
            ``torch.nn.attention.bias.causal_upper_left`` (top-left, like ``is_causal=True``) and
            ``causal_lower_right`` (bottom-right, the KV-cache convention), and a declared alignment must match.
        mask_convention: how your code reads a mask: ``"allowed"`` (bool, True = may attend; the course's and
            ``F.scaled_dot_product_attention``'s), ``"blocked"`` (bool, True = blocked, ``nn.MultiheadAttention``'s
            ``attn_mask``), ``"additive"`` (float, 0 or ``finfo(dtype).min``), ``"key_padding"`` (bool ``(B, S)``,
            True = padding), ``"hf"`` (int ``(B, S)``, 1 = keep, Hugging Face's ``attention_mask``), or a callable
            taking the course's bool mask ``(B, 1, T, S)``. The last two express padding only.
        groups: grouped-query attention for a function: k and v get ``H // groups`` heads and query head h
            must read key/value head ``h // groups``. A module's ``num_kv_heads`` is read from it.
        rope: ``"interleaved"`` or ``"half-split"``: the function applies rotary embeddings itself (positions
            ``arange(T)``, base ``rope_base``) and the weights were trained with this pairing.
        alibi: the function adds ALiBi's bias ``-slope_h * |i - j|`` itself; its slopes are measured for 8 and 12
            heads and compared with :func:`attnbook.alibi_slopes`.
        call: another calling convention: ``call(fn, q, k, v, mask)`` for a function,
            ``call(module, x, key, value, mask, cache)`` for a module (key, value and cache may be None);
            either returns the output or ``(output, weights)``. The mask is already converted.
        cache: for a module: ``None`` uses :class:`attnbook.KVCache` when its ``forward`` takes ``cache``;
            ``False`` skips the check; a callable makes an empty cache.
        dtype: the dtype of the exact checks (float64 or float32); float16 and bfloat16 are always checked.
        tolerance: the bound of the exact checks; default :func:`tolerance` of ``dtype``.
        seed: the random inputs' seed.
        name: what the report calls ``fn`` (default: its name, or its class for a module).
        verbose: print the report.

    Returns:
        An :class:`AttentionReport`: ``report.violated`` lists the violated invariants' names,
        ``report["scale"].measured`` the number behind one of them, ``report.ok`` whether none was violated.

    Raises:
        TypeError, ValueError: for options that make no sense, or when ``fn`` fails on the simplest input (one
        batch, T = S, no mask), which means the calling convention is not the one declared.
    """
    options = _Options(causal, mask_convention, groups, rope, rope_base, alibi, call, cache, dtype, tolerance, seed)
    options.validate(fn)
    c = _Checker(fn, options)
    tol = c.tol
    results: dict[str, InvariantResult] = {}
    # the inputs come from their own generators; the global one (dropout, if any) is seeded here and
    # restored afterwards, so the report does not depend on what ran before
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _smoke(c)
        for inv in _ORDER + tuple(n for n, _ in INVARIANTS if n not in _ORDER):
            try:
                status, detail, measured, bound = _CHECKS[inv](c)
            except Exception as err:  # noqa: BLE001 (the user's code failed inside this check)
                status, detail, measured, bound = "violated", _raised(err), math.inf, tol
            results[inv] = InvariantResult(inv, status, detail, measured, bound)
            c.statuses[inv] = status
    subject = _subject(fn) if name is None else str(name)
    report = AttentionReport(subject, {n: results[n] for n, _ in INVARIANTS})
    if verbose:
        print(report)
    return report


def _smoke(c: _Checker) -> None:
    """The simplest call; failing here means the calling convention is not the declared one."""
    g = c.gen(0)
    if c.is_module:
        x = c.randn(g, 1, 4, c.width())
        shapes = f"x {shape_str(x)}"
    else:
        q, k, v = c.qkv(g, 1, 2 * c.groups, 4, 4, 8)
        shapes = f"q {shape_str(q)}, k {shape_str(k)}, v {shape_str(v)} without a mask"
    try:
        with torch.no_grad():
            c.run_module(x) if c.is_module else c.run_fn(q, k, v)
    except (_OutputTypeError, _OutputShapeError) as err:
        raise type(err).__mro__[1](f"check_attention: {err}") from err
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"check_attention: calling it on {shapes} raised {type(err).__name__}: {err} "
                         f"(is its calling convention the one declared? see call= and mask_convention=)") from err
