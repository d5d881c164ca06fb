"""The live explorers' Python side (attnbook.explorers.live): the module each exported graph is made from equals
the package's own functions and the explorer's own frames, and the exported graph, run by onnxruntime, equals
the module. (The browser's numbers are checked against the same module in tests/test_live.py.)"""

import itertools
import json
import random

import numpy as np
import pytest
import torch

from attnbook import causal_mask, padding_mask, scaled_dot_product_attention, sliding_window_mask
from attnbook.explorers import masks_explorer
from attnbook.explorers.live import LIVE, MASKS_T_MAX, export_live, masks_frame, masks_inputs
from attnbook.explorers.masks import MASK_KINDS, PADDED, WINDOWED
from attnbook.masks import combine_masks


def _reference_mask(kind: str, T: int, window: int, length: int) -> torch.Tensor:
    """The mask from attnbook.masks' public functions (what chapter 4 teaches)."""
    pad = padding_mask([min(length, T)], max_len=T)[0, 0]  # (1, S), as the explorer clips it
    parts = {"causal": [causal_mask(T)], "padding": [pad], "sliding window": [sliding_window_mask(T, window)],
             "causal + padding": [causal_mask(T), pad],
             "causal + window": [sliding_window_mask(T, window, causal=True)]}[kind]
    return combine_masks(*parts).expand(T, T)


def _settings():
    """Every setting the live page offers: each kind, each length, each window < T, each real length <= T."""
    for kind in MASK_KINDS:
        for T in range(2, MASKS_T_MAX + 1):
            windows = range(T) if kind in WINDOWED else [2]
            lengths = range(1, T + 1) if kind in PADDED else [5]
            yield from ((kind, T, w, n) for w, n in itertools.product(windows, lengths))


def test_masks_frame_is_the_package_masks_and_attention_for_every_live_setting():
    settings = list(_settings())
    assert len(settings) > 1500
    for kind, T, window, length in settings:
        d = masks_frame(kind, T, window, length)
        expected = _reference_mask(kind, T, window, length)
        assert torch.equal(d["mask"], expected), (kind, T, window, length)
        x, wq, wk = masks_inputs(T)
        _, w = scaled_dot_product_attention(x @ wq, x @ wk, x @ wk, expected)
        assert torch.allclose(d["weights"], w, atol=1e-6, rtol=0), (kind, T, window, length)
        assert d["allowed"] == int(expected.sum())
        assert d["empty_rows"] == int((~expected.any(-1)).sum())
        assert not torch.isnan(d["weights"]).any()


def test_masks_frame_equals_the_explorers_frames_on_its_grid():
    ex = masks_explorer()
    grid = [(k, T, w, n) for k in MASK_KINDS for T in (4, 8, 16) for w in (0, 1, 3) for n in (1, 5, 8) if w < T and n <= T]
    for kind, T, window, length in grid:
        ex.update(kind=kind, T=T, window=window, length=length)
        d = masks_frame(kind, T, window, length)
        assert torch.equal(d["mask"], ex.data["mask"])
        assert torch.allclose(d["weights"], ex.data["weights"], atol=1e-6, rtol=0)
        assert d["caption"] == ex.caption_text(static=True), (kind, T, window, length)


def test_masks_frame_refuses_bad_settings():
    with pytest.raises(ValueError, match="kind must be one of"):
        masks_frame("diagonal", 8, 2, 5)
    with pytest.raises(ValueError, match=r"T must be an int in \[1, 32\], got 33"):
        masks_frame("causal", 33, 2, 5)
    with pytest.raises(TypeError, match="window must be an int, got float 2.0"):
        masks_frame("sliding window", 8, 2.0, 5)


def test_live_registry_names_explorers_by_their_titles():
    assert LIVE == {"Masks": "masks"}
    assert masks_explorer().title in LIVE


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("live")
    written = export_live(out)
    return out, written


def test_export_writes_graph_and_spec(exported):
    out, written = exported
    assert sorted(p.name for p in written) == ["masks.json", "masks.onnx"]
    spec = json.loads((out / "masks.json").read_text())
    assert spec["kinds"] == MASK_KINDS and spec["graph"] == "masks.onnx"
    assert sorted(int(t) for t in spec["inputs"]) == list(range(1, MASKS_T_MAX + 1))
    # the inputs the page is fed are the explorer's, bit for bit
    x, wq, wk = masks_inputs(7)
    got = np.frombuffer(__import__("base64").b64decode(spec["inputs"]["7"]["x"]), dtype="<f4").reshape(7, 16)
    assert np.array_equal(got, x.numpy())
    assert len(spec["colormaps"]["viridis"]) == 256 and spec["colormaps"]["viridis"][0] == "#440154"


def test_exported_graph_in_onnxruntime_equals_torch(exported):
    ort = pytest.importorskip("onnxruntime")
    out, _ = exported
    spec = json.loads((out / "masks.json").read_text())
    session = ort.InferenceSession(str(out / "masks.onnx"), providers=["CPUExecutionProvider"])
    rng = random.Random(0)
    cases = [("causal", 8, 2, 5), ("padding", 2, 0, 1), ("causal + padding", 32, 0, 32)]
    cases += [(rng.choice(MASK_KINDS), T, rng.randrange(T), rng.randint(1, T))
              for T in (rng.randint(2, MASKS_T_MAX) for _ in range(20))]
    for kind, T, window, length in cases:
        x, wq, wk = masks_inputs(T)
        mask, weights = session.run(None, {"x": x.numpy(), "wq": wq.numpy(), "wk": wk.numpy(),
                                           "flags": np.array(spec["flags"][kind], dtype=bool),
                                           "window": np.array(window, dtype=np.int64),
                                           "length": np.array(length, dtype=np.int64)})
        d = masks_frame(kind, T, window, length)
        assert np.array_equal(mask, d["mask"].numpy()), (kind, T, window, length)
        assert np.abs(weights - d["weights"].numpy()).max() < 1e-6, (kind, T, window, length)
