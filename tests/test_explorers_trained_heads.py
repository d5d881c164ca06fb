"""attnbook.explorers.trained_heads (chapter 7's explorer) without a browser: the maps it shows are the model's
own attention on the chosen input, the controls change them, the figure draws them, and the static scrubber
holds one frame per combination. What it runs (attnbook.train.run_with_attention) is tested in test_train.py.

Dimension legend: H heads, S source length, L target length (EOS included),
T and K the query and key length of the block shown.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnbook.explorers import trained_heads_explorer
from attnbook.explorers.base import figure_png
from attnbook.explorers.trained_heads import KINDS
from attnbook.tasks import addition_task, copy_task
from attnbook.train import attention_alignment, fit, predict, run_with_attention
from tests.helpers import seq2seq_attention, tiny_decoder_only, tiny_seq2seq
from tests.pixels import assert_blit_matches_full_render, assert_shows_something

COPY = copy_task(length=4, num_symbols=5)
ADD = addition_task(num_digits=1)
EXAMPLES = {"copy": ["0123", "4441", "2020"], "addition": ["3+4", "9+9", "0+5"]}


@pytest.fixture(scope="module")
def models():
    return {"copy": (tiny_seq2seq(COPY, d_model=16, num_heads=2, num_decoder_layers=2, dim_feedforward=32).eval(), COPY),
            "addition": (tiny_seq2seq(ADD, d_model=16, num_heads=4, dim_feedforward=32).eval(), ADD)}


@pytest.fixture(scope="module")
def explorer(models):
    return trained_heads_explorer(models, EXAMPLES, static_examples=2)


def test_each_kind_is_one_of_the_models_attention_maps(explorer, models):
    _, attn = seq2seq_attention(*models["copy"], "0123")
    assert sorted(KINDS.values()) == sorted(attn)  # every map the model returns, once
    assert explorer.control("kind").values == list(KINDS)


@pytest.mark.parametrize("task_name", ["copy", "addition"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_maps_are_the_models_attention_on_that_input(explorer, models, task_name, kind):
    model, task = models[task_name]
    for example, text in enumerate(EXAMPLES[task_name]):
        d = explorer.update(task=task_name, example=example, kind=kind, layer=0)
        out, attn = seq2seq_attention(model, task, text)
        torch.testing.assert_close(d["weights"], attn[KINDS[kind]][0][0])  # (H, T, K)
        assert d["source"] == text and d["prediction"] == task.decode(out[0])
        S, L = task.src_len, task.tgt_len + 1
        T, K = {"encoder": (S, S), "decoder_self": (L, L), "decoder_cross": (L, S)}[KINDS[kind]]
        assert d["weights"].shape == (model.encoder.layers[0].self_attn.num_heads, T, K)
        torch.testing.assert_close(d["weights"].sum(-1), torch.ones(d["weights"].shape[:2]))
        assert len(d["queries"]) == T and len(d["keys"]) == K


def test_labels_name_the_source_and_the_written_tokens(explorer, models):
    d = explorer.update(task="copy", example=1, kind="cross-attention", layer=0)
    assert d["keys"] == list("4441")
    model, task = models["copy"]
    out = predict(model, task, task.encode("4441"))[0]
    assert d["queries"] == [task.vocab.tokens[i].strip("<>") for i in out.tolist()]
    d = explorer.update(kind="decoder self-attention")
    assert d["keys"][0] == "bos" and d["keys"][1:] == d["queries"][:-1]  # the decoder reads BOS, then its output


def test_controls_change_the_data(explorer):
    base = explorer.update(task="copy", example=0, kind="cross-attention", layer=0)["weights"].clone()
    assert not torch.equal(explorer.update(example=1)["weights"], base)
    explorer.update(example=0)
    assert explorer.update(layer=1)["layer"] == 1  # the copy model has 2 decoder layers
    assert not torch.equal(explorer.data["weights"], base)
    d = explorer.update(task="addition")  # 1 decoder layer: the layer moves to the one it has
    assert explorer.values["layer"] == 0 and explorer.allowed["layer"] == [0]
    assert d["layer"] == 0 and d["num_layers"] == 1 and d["weights"].shape == (4, 3, 3)
    assert explorer.update(kind="encoder self-attention")["weights"].shape == (4, 3, 3)
    assert explorer.update(kind="decoder self-attention")["weights"].shape == (4, 3, 3)
    explorer.update(task="copy", example=0, kind="cross-attention", layer=0)


def test_figure_draws_every_head_and_the_labels(explorer):
    for task, H in (("copy", 2), ("addition", 4)):
        d = explorer.update(task=task, example=2, kind="cross-attention", layer=0)
        T, K = d["weights"].shape[1:]
        ax = explorer.figure.axes[0]
        tiles = torch.as_tensor(ax.images[0].get_array().filled(np.nan))
        assert tiles.shape == (T + 1, H * (K + 1) - 1)  # a blank row above the tiles: the heads' names
        for h in range(H):
            torch.testing.assert_close(tiles[1:, h * (K + 1): h * (K + 1) + K], d["weights"][h])
        texts = [t.get_text() for t in ax.texts]
        assert [f"head {h}" for h in range(H)] == [t for t in texts if t.startswith("head")]
        assert texts.count(d["keys"][0]) >= H  # the source symbols under every tile
        assert task in explorer.figure.texts[0].get_text()
    explorer.update(task="copy", example=0)


def test_the_layer_slider_offers_the_layers_the_chosen_block_has(models):
    explorer = trained_heads_explorer(models, EXAMPLES)
    layer = explorer.control_widgets["layer"]
    explorer.update(task="copy", kind="cross-attention")  # 2 decoder layers
    assert [v for _, v in layer.options] == [0, 1] and not layer.disabled and explorer.values["layer"] == 0
    layer.value = 1
    assert explorer.data["layer"] == 1
    explorer.control_widgets["kind"].value = "encoder self-attention"  # 1 encoder layer: nothing to choose
    assert explorer.values["layer"] == 0 and layer.value == 0 and layer.disabled
    assert [v for _, v in layer.options] == [0]
    assert "layer 0" in explorer.figure.texts[0].get_text()
    explorer.control_widgets["kind"].value = "decoder self-attention"
    assert [v for _, v in layer.options] == [0, 1] and not layer.disabled


def test_a_single_layer_is_not_offered(models):
    one = {"addition": models["addition"]}  # one layer in every block
    explorer = trained_heads_explorer(one, {"addition": EXAMPLES["addition"]})
    assert explorer.control_widgets["layer"].layout.display == "none"
    assert not explorer.control("layer").shown
    assert "layer =" not in explorer.static_html()  # nor listed as a fixed choice in the book


@pytest.mark.parametrize("first, second", [
    (dict(task="copy", example=0, kind="cross-attention", layer=0), dict(task="copy", example=1, kind="cross-attention", layer=1)),
    (dict(task="addition", example=0, kind="encoder self-attention", layer=0),
     dict(task="addition", example=2, kind="decoder self-attention", layer=0)),
])
def test_fast_frame_is_the_full_render(explorer, first, second):
    assert_blit_matches_full_render(explorer, first, second)
    explorer.update(task="copy", example=0, kind="cross-attention", layer=0)


def test_caption_reports_the_output_and_the_per_input_alignment(explorer, models):
    d = explorer.update(task="addition", example=1, kind="cross-attention", layer=0)
    model, task = models["addition"]
    run = run_with_attention(model, task, "9+9")
    expected = task.alignment_targets(run.src)[0].float()  # (L, S)
    rows = expected.sum(-1) > 0
    shares = (d["weights"] * expected).sum(-1)[:, rows].mean(-1)  # (H,)
    torch.testing.assert_close(d["shares"], shares)
    cap = explorer.caption_text()
    assert run.pretty() in cap and f"{shares[0]:.2f}" in cap
    assert ("correct" in cap) == run.correct and ("9+9=18" in cap) == (not run.correct)
    assert explorer.update(kind="encoder self-attention")["shares"] is None
    explorer.update(task="copy", example=0, kind="cross-attention")


def test_static_frames_cover_the_static_values(explorer):
    counts = [len(c.static) for c in explorer.controls]
    assert counts == [2, 2, 3, 2]  # tasks, static examples, kinds, layers
    frames = list(explorer.frames())
    assert len(frames) == 2 * 2 * 3 * 2
    assert all(assert_shows_something(png).shape[2] == 3 for _, png, _ in frames)
    assert {(v["task"], v["example"]) for v, _, _ in frames} == {(t, e) for t in EXAMPLES for e in (0, 1)}
    html = explorer.static_html()
    assert html.count('class="ab-frame"') == 24
    assert_shows_something(figure_png(explorer.figure))


def test_bad_arguments_are_named(models):
    with pytest.raises(ValueError, match="same number"):
        trained_heads_explorer(models, {"copy": ["0123"], "addition": ["3+4", "1+1"]})
    with pytest.raises(ValueError, match="same task names"):
        trained_heads_explorer(models, {"copy": ["0123"]})
    with pytest.raises(ValueError, match=r"'01234' is not a copy source"):
        trained_heads_explorer(models, {"copy": ["01234"], "addition": ["3+4"]})
    with pytest.raises(ValueError, match="static_examples"):
        trained_heads_explorer(models, EXAMPLES, static_examples=4)
    decoder_only = tiny_decoder_only(ADD, d_model=16, num_heads=2, num_layers=1)
    with pytest.raises(TypeError, match="Seq2SeqTransformer"):
        trained_heads_explorer({"addition": (decoder_only, ADD)}, {"addition": ["3+4"]})
    with pytest.raises(TypeError, match=r"\(model, task\)"):
        trained_heads_explorer({"copy": models["copy"][0]}, {"copy": ["0123"]})


@pytest.mark.slow
def test_a_briefly_trained_copier_shows_the_diagonal():
    task = copy_task(length=5, num_symbols=5)
    model = tiny_seq2seq(task, d_model=32, num_heads=2, dim_feedforward=64)
    fit(model, task, steps=120, warmup=10, device="cpu", progress=False, eval_every=120, eval_n=50)
    ex = trained_heads_explorer({"copy": (model, task)}, {"copy": ["01234", "43210"]})
    d = ex.update(example=1, kind="cross-attention")
    assert d["correct"] and d["prediction"] == "43210"
    best = int(d["shares"].argmax())
    assert d["shares"][best] > 0.9  # that head reads source position k when it writes output k
    diagonal = d["weights"][best, torch.arange(5), torch.arange(5)]  # (S,)
    assert bool((diagonal > 0.5).all())
    assert attention_alignment(model, task, n=64).score > 0.9
