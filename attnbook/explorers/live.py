"""The book's live explorers: the package's own computations, exported as ONNX graphs that the rendered book
runs in the reader's browser (onnxruntime-web), with what the page needs to feed and draw them.

The static book shows each explorer as a scrubber over frames rendered when the book was built
(:meth:`attnbook.explorers.base.Explorer.static_html`). An explorer listed in :data:`LIVE` also gets a
"live" switch (added by the book's extension, ``_ext/attnbook_book.py``): switched on, the page loads
``attnbook_live.js`` (next to this module), the runtime and this explorer's graph from ``_static/live/`` and
computes every frame itself, for any value in range rather than the scrubber's grid. Nothing of that is
loaded before the switch.

:func:`export_live` writes, for each live explorer, ``<name>.onnx`` (the graph, exported by ``torch.onnx``
from a module of this file that calls the package's code) and ``<name>.json`` (its controls, the inputs it is
fed, the figures' colormaps); ``tools/live_assets.py`` calls it when the book is built, once for both
editions. The Python side of every number the page shows is the same module run in torch
(:func:`masks_frame`); ``tests/test_live.py`` checks the browser's numbers against it, and
``tests/test_explorers_live.py`` checks it against the explorer's own ``compute``.

Dimension legend: T queries and keys (self-attention), E model dim, D head dim (= E here).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import torch

from .._checks import check_int
from ..core import scaled_dot_product_attention

__all__ = ["LIVE", "MASKS_T_MAX", "masks_inputs", "MasksFrame", "masks_frame", "masks_caption", "export_live"]

LIVE = {"Masks": "masks"}
"""Each live explorer: its title (what its scrubber shows, so the book's extension recognises it) -> the name of
its files under ``_static/live/``."""

MASKS_T_MAX = 32  # the live masks explorer's longest sequence (the scrubber's grid goes to 16)

# mask kind -> (causal, window applies, real length applies), in the order of MasksFrame's ``flags``
_MASK_FLAGS = {"causal": (True, False, False), "padding": (False, False, True), "sliding window": (False, True, False),
               "causal + padding": (True, False, True), "causal + window": (True, True, False)}


def masks_inputs(T: int, seed: int = 0, d_model: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token vectors and the query and key projections chapter 4's explorer attends with, for length T:
    ``x (T, E)``, ``wq (E, E)``, ``wk (E, E)`` (``masks_explorer`` draws them here, so the two cannot drift)."""
    T = check_int("T", T)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, d_model, generator=g)  # (T, E)
    wq, wk = (torch.randn(d_model, d_model, generator=g) / d_model**0.5 for _ in range(2))  # (E, E) each
    return x, wq, wk


class MasksFrame(torch.nn.Module):
    """One frame of chapter 4's explorer, for any length, window and real length: the bool mask ``(T, S)`` of
    a kind (``flags``: causal, sliding window, padding, combined by AND as ``masks.combine_masks`` does) and the
    weights :func:`attnbook.scaled_dot_product_attention` gives under it.

    The mask is built from tensors (``window``, ``length``: 0-d int64) so that one exported graph serves every
    setting; ``tests/test_explorers_live.py`` checks it equals ``masks.causal_mask``, ``sliding_window_mask``
    and ``padding_mask`` for every setting the live page offers."""

    def forward(self, x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, flags: torch.Tensor,
                window: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = x.shape[0]
        i = torch.arange(T, device=x.device)[:, None]  # (T, 1) queries
        j = torch.arange(T, device=x.device)[None, :]  # (1, S) keys
        d = i - j  # (T, S)
        causal, windowed, padded = flags[0], flags[1], flags[2]
        # bool algebra, no `where` on bools (onnxruntime has no bool Where kernel)
        allowed = ~causal | (d >= 0)
        allowed = allowed & (~windowed | (causal & (d <= window)) | (~causal & (d.abs() <= window)))
        allowed = allowed & (~padded | (j < length))  # (T, S)
        q, k = x @ wq, x @ wk  # (T, D) each
        _, weights = scaled_dot_product_attention(q, k, k, allowed)  # (T, S)
        return allowed, weights


def _mask_feeds(kind: str, T: int, window: int, length: int, seed: int = 0,
                d_model: int = 16) -> tuple[torch.Tensor, ...]:
    if kind not in _MASK_FLAGS:
        raise ValueError(f"kind must be one of {list(_MASK_FLAGS)}, got {kind!r}")
    T = check_int("T", T, 1, MASKS_T_MAX)
    window = check_int("window", window, 0)
    length = check_int("length", length, 0)
    x, wq, wk = masks_inputs(T, seed, d_model)
    return (x, wq, wk, torch.tensor(_MASK_FLAGS[kind]), torch.tensor(window), torch.tensor(length))


def masks_frame(kind: str, T: int, window: int, length: int, seed: int = 0, d_model: int = 16) -> dict[str, Any]:
    """What the live masks explorer shows for one setting, computed in torch: ``mask`` (bool ``(T, S)``),
    ``weights`` (``(T, S)``), ``allowed`` pairs and ``empty_rows`` (queries with no key), and its caption."""
    with torch.no_grad():
        mask, weights = MasksFrame()(*_mask_feeds(kind, T, window, length, seed, d_model))
    d = {"kind": kind, "T": T, "window": window, "length": length, "mask": mask, "weights": weights,
         "allowed": int(mask.sum()), "empty_rows": int((~mask.any(-1)).sum())}
    d["caption"] = masks_caption(d) + _not_applying(kind)
    return d


def _not_applying(kind: str) -> str:
    """What an explorer's caption ends with when some controls do not apply (``Explorer.caption_text``)."""
    from .masks import PADDED, WINDOWED

    off = [label for label, used in (("window", kind in WINDOWED), ("real length (padding)", kind in PADDED))
           if not used]
    return f"; {' and '.join(off)} {'does' if len(off) == 1 else 'do'} not apply here" if off else ""


def masks_caption(d: dict[str, Any]) -> str:
    """The caption of a masks frame (the explorer's own words, which the live page writes too)."""
    from .masks import PADDED, WINDOWED

    window = f", window = {d['window']}" if d["kind"] in WINDOWED else ""
    length = f", real length = {d['length']}" if d["kind"] in PADDED else ""
    empty = d["empty_rows"]
    return (f"{d['kind']}, T = {d['T']}{window}{length}: {d['allowed']} of {d['T'] ** 2} (query, key) pairs "
            f"allowed; {empty} query row{'' if empty == 1 else 's'} with no key "
            "(their weights are all 0, not NaN)")


def _f32(t: torch.Tensor) -> str:
    """A float tensor as base64 little-endian float32 (what the page decodes into a Float32Array)."""
    return base64.b64encode(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode("ascii")


def _colormap(name: str, n: int = 256) -> list[str]:
    """A matplotlib colormap as n '#rrggbb' steps: the page draws with the figures' own colours."""
    import matplotlib

    cmap = matplotlib.colormaps[name]
    return [matplotlib.colors.to_hex(cmap(i / (n - 1))) for i in range(n)]


def _view_dtype(self: Any, dtype: Any) -> Any:
    """ONNX for ``Tensor.view(torch.uint8)`` of a bool tensor (``core.fully_masked_rows``): 0/1, a Cast."""
    from onnxscript import opset18 as op

    return op.Cast(self, to=2)  # 2: ONNX's UINT8


def _export(module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, input_names: list[str],
            output_names: list[str], dynamic_shapes: tuple[Any, ...]) -> None:
    # traced on the meta device: masked_softmax then zeroes empty rows unconditionally (as on a GPU) instead of
    # asking the data whether there are any, so the graph holds no data-dependent branch
    meta = tuple(a.to("meta") for a in args)
    program = torch.onnx.export(module, meta, dynamo=True, dynamic_shapes=dynamic_shapes, input_names=input_names,
                                output_names=output_names, verbose=False,
                                custom_translation_table={torch.ops.aten.view.dtype: _view_dtype})
    assert program is not None
    program.save(str(path))


def export_live(outdir: str | Path) -> list[Path]:
    """Write every live explorer's graph and spec into ``outdir`` (the site's ``_static/live/``); returns the
    files written."""
    from .masks import MASK_KINDS, PADDED, WINDOWED

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    T = torch.export.Dim("T", min=2, max=MASKS_T_MAX)
    onnx_path = out / "masks.onnx"
    _export(MasksFrame(), _mask_feeds("causal", 8, 2, 5), onnx_path, ["x", "wq", "wk", "flags", "window", "length"],
            ["mask", "weights"], ({0: T}, None, None, None, None, None))
    inputs = {}
    for n in range(1, MASKS_T_MAX + 1):
        x, wq, wk = masks_inputs(n)
        inputs[str(n)] = {"x": _f32(x), "wq": _f32(wq), "wk": _f32(wk), "d_model": x.shape[1]}
    spec = {
        "name": "masks", "graph": onnx_path.name, "kinds": MASK_KINDS, "windowed": list(WINDOWED),
        "padded": list(PADDED), "flags": {k: list(v) for k, v in _MASK_FLAGS.items()},
        "controls": [
            {"name": "kind", "label": "mask", "type": "select", "options": MASK_KINDS, "value": "causal"},
            {"name": "T", "label": "sequence length", "type": "range", "min": 2, "max": MASKS_T_MAX, "value": 8},
            {"name": "window", "label": "window", "type": "range", "min": 0, "max": MASKS_T_MAX - 1, "value": 2},
            {"name": "length", "label": "real length (padding)", "type": "range", "min": 1, "max": MASKS_T_MAX,
             "value": 5},
        ],
        "inputs": inputs,
        "colormaps": {"Greys_r": _colormap("Greys_r"), "viridis": _colormap("viridis")},
    }
    spec_path = out / "masks.json"
    spec_path.write_text(json.dumps(spec, separators=(",", ":")), encoding="utf-8")
    return [onnx_path, spec_path]
