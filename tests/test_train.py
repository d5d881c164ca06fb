"""attnbook.train: fit, evaluate, predict and the attention alignment score; eval_mode; and one input's every
attention map (run_with_attention, TaskAttention), which chapter 7's explorer shows.

Dimension legend: B batch, H heads, S source length, L target length (EOS included), T and K the query and
key length of one kind of attention.
"""

import pytest
import torch
import torch.nn as nn

from attnbook.tasks import Task, addition_task, copy_task, reverse_task
from attnbook.train import (
    Alignment,
    History,
    TaskAttention,
    attention_alignment,
    check_seq2seq,
    eval_mode,
    evaluate,
    fit,
    predict,
    run_with_attention,
)
from tests.helpers import seq2seq_attention, tiny_decoder_only, tiny_seq2seq

# ----------------------------------------------------------------------------- evaluation and training


class _Oracle(nn.Module):
    """Writes the right answer and attends exactly where expected (or off by one)."""

    def __init__(self, task, shift=0):
        super().__init__()
        self.task, self.shift = task, shift
        self.w = nn.Parameter(torch.zeros(1))

    def generate(self, src, max_new_tokens):
        return self.task.solve(src)[:, :max_new_tokens]

    def loss(self, src, tgt):
        return self.w.sum()

    def source_attention(self, src, tgt):
        exp = self.task.alignment_targets(src, tgt).float()
        exp = exp / exp.sum(-1, keepdim=True).clamp(min=1)  # (B, L, S)
        wrong = exp.roll(1, dims=-1)
        return [torch.stack([wrong, exp if self.shift == 0 else wrong], dim=1)]  # (B, 2, L, S)


def test_evaluate_and_alignment_with_an_oracle():
    task = reverse_task(5)
    assert evaluate(_Oracle(task), task, n=100) == 1.0
    al = attention_alignment(_Oracle(task), task, n=50)
    assert isinstance(al, Alignment) and al.scores.shape == (1, 2)
    assert (al.layer, al.head) == (0, 1) and al.score == pytest.approx(1.0)
    assert al.scores[0, 0] == pytest.approx(0.0)
    src = task.encode("01234")
    assert task.decode(predict(_Oracle(task), task, src))[0] == "43210"


def test_untrained_model_is_mostly_wrong():
    task = addition_task(3)
    assert evaluate(tiny_seq2seq(task), task, n=100) < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("make_model", [tiny_seq2seq, tiny_decoder_only], ids=["seq2seq", "decoder-only"])
def test_short_fit_reduces_loss(make_model):
    task = copy_task(5)
    model = make_model(task)
    hist = fit(model, task, steps=40, batch_size=32, lr=3e-3, device="cpu", progress=False, eval_every=10, eval_n=32)
    assert isinstance(hist, History)
    assert hist.step == [10, 20, 30, 40]
    assert len(hist.loss) == len(hist.accuracy) == len(hist.lr) == 4
    assert hist.loss[-1] < 0.8 * hist.loss[0]
    assert all(0.0 <= a <= 1.0 for a in hist.accuracy)
    assert hist.seconds > 0 and not model.training
    al = attention_alignment(model, task, n=32)
    assert 0.0 <= al.score <= 1.0


@pytest.mark.slow
def test_fit_default_device_and_stop_at():
    task = copy_task(4)
    model = tiny_seq2seq(task)
    hist = fit(model, task, steps=30, batch_size=8, eval_every=5, eval_n=8, stop_at=0.0, progress=False)
    assert hist.step == [5]  # stopped at the first evaluation point
    assert next(model.parameters()).device.type in ("cpu", "cuda", "mps")


def test_fit_errors():
    task = copy_task(4)
    model = tiny_seq2seq(task)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        fit(model, task, steps=0, progress=False)
    with pytest.raises(ValueError, match="lr must be positive"):
        fit(model, task, steps=1, lr=0.0, progress=False)
    with pytest.raises(TypeError, match="task must be an attnbook.tasks.Task"):
        fit(model, "copy", steps=1, progress=False)
    with pytest.raises(TypeError, match="has no loss\\(\\) method"):
        fit(nn.Linear(2, 2), task, steps=1, progress=False)
    assert isinstance(task, Task)


def test_predict_and_alignment_leave_the_training_flag_as_it_was():
    task = copy_task(4)
    model = tiny_seq2seq(task, dropout=0.5)  # dropout: eval mode is what makes predict deterministic
    src = task.batch(8, seed=0)[0]
    model.train()
    first = predict(model, task, src)
    assert model.training and torch.equal(predict(model, task, src), first)
    attention_alignment(model, task, n=8)
    assert model.training
    model.eval()
    predict(model, task, src)
    assert not model.training


# ----------------------------------------------------------------------------- eval_mode


def test_eval_mode_restores_the_flag():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
    for was_training in (True, False):
        model.train(was_training)
        with eval_mode(model) as m:
            assert m is model
            assert not model.training and not model[1].training  # every submodule
        assert model.training == was_training and model[1].training == was_training


def test_eval_mode_restores_the_flag_when_the_block_raises():
    model = nn.Dropout(0.5).train()
    with pytest.raises(RuntimeError, match="inside"):
        with eval_mode(model):
            assert not model.training
            raise RuntimeError("inside")
    assert model.training


def test_eval_mode_turns_dropout_off():
    model = nn.Dropout(0.5).train()
    x = torch.ones(1000)
    with eval_mode(model):
        assert torch.equal(model(x), x)
    assert not torch.equal(model(x), x)  # training again: dropout is back


def test_eval_mode_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        with eval_mode("model"):
            pass
    with pytest.raises(TypeError, match="got function"):
        with eval_mode(lambda x: x):
            pass


# ----------------------------------------------------------------------------- one input, every map

COPY = copy_task(length=4, num_symbols=5)
ADD = addition_task(num_digits=1)


@pytest.fixture(scope="module")
def copier():
    return tiny_seq2seq(COPY, d_model=16, num_heads=2, num_decoder_layers=2, dim_feedforward=32).eval()


@pytest.fixture(scope="module")
def adder():
    return tiny_seq2seq(ADD, d_model=16, num_heads=4, dim_feedforward=32).eval()


@pytest.mark.parametrize("text", ["0123", "4441"])
def test_run_with_attention_holds_the_models_own_maps(copier, text):
    run = run_with_attention(copier, COPY, text)
    out, attn = seq2seq_attention(copier, COPY, text)
    assert isinstance(run, TaskAttention) and run.task is COPY and run.source == text
    assert torch.equal(run.src, COPY.encode(text)) and torch.equal(run.output, out)
    assert torch.equal(run.target, COPY.solve(run.src))
    S, L = COPY.src_len, COPY.tgt_len + 1
    layers = {"encoder": 1, "decoder_self": 2, "decoder_cross": 2}
    assert set(run.weights) == set(layers)
    for kind, shape in (("encoder", (2, S, S)), ("decoder_self", (2, L, L)), ("decoder_cross", (2, L, S))):
        assert len(run.weights[kind]) == layers[kind]
        for got, want in zip(run.weights[kind], attn[kind]):
            assert got.shape == shape and got.dtype == torch.float32
            torch.testing.assert_close(got, want[0])  # (H, T, K): batch row 0


def test_run_with_attention_labels_and_text(copier):
    run = run_with_attention(copier, COPY, "4441")
    tokens = COPY.vocab.tokens
    written = [tokens[i].strip("<>") for i in run.output[0].tolist()]
    assert run.labels["encoder"] == (list("4441"), list("4441"))
    assert run.labels["decoder_cross"] == (written, list("4441"))
    queries, keys = run.labels["decoder_self"]
    assert queries == written and keys == ["bos"] + written[:-1]  # the decoder reads BOS, then its output
    assert run.prediction == COPY.decode(run.output[0])
    assert run.correct == (run.prediction == "4441" and bool(torch.equal(run.output, run.target)))
    assert run.pretty() == COPY.pretty(run.src, run.output)[0]
    assert run.pretty("target") == "4441 -> 4441"


def test_a_right_answer_is_correct():
    """An oracle-like run: a model whose every output is right is ``correct``, one wrong token is not."""
    model = tiny_seq2seq(COPY, d_model=16, num_heads=2, dim_feedforward=32).eval()
    run = run_with_attention(model, COPY, "0123")
    right = TaskAttention(COPY, "0123", run.src, run.target.clone(), run.target, run.weights, run.labels)
    assert right.correct and right.prediction == "0123"
    wrong = run.target.clone()
    wrong[0, 0] = COPY.vocab.encode("4")[0]
    assert not TaskAttention(COPY, "0123", run.src, wrong, run.target, run.weights, run.labels).correct


def test_alignment_shares_are_the_share_on_the_expected_positions(adder):
    run = run_with_attention(adder, ADD, "9+9")
    expected = ADD.alignment_targets(run.src, run.target)[0].float()  # (L, S)
    rows = expected.sum(-1) > 0
    w = run.weights["decoder_cross"][0]  # (H, L, S)
    shares = (w * expected).sum(-1)[:, rows].mean(-1)  # (H,)
    torch.testing.assert_close(run.alignment_shares(), shares)
    assert run.alignment_shares().shape == (4,) and ((shares >= 0) & (shares <= 1)).all()


def test_run_with_attention_leaves_the_training_flag_as_it_was(copier):
    copier.train()
    try:
        run_with_attention(copier, COPY, "0123")
        assert copier.training
    finally:
        copier.eval()


def test_run_with_attention_refuses_other_models_and_tasks(copier):
    decoder_only = tiny_decoder_only(ADD, d_model=16, num_heads=2, num_layers=1)
    with pytest.raises(TypeError, match="model: .*Seq2SeqTransformer, got DecoderOnlyTransformer"):
        run_with_attention(decoder_only, ADD, "3+4")
    with pytest.raises(TypeError, match="task must be an attnbook.tasks.Task, got str"):
        run_with_attention(copier, "copy", "0123")
    with pytest.raises(ValueError, match="have 4 symbols"):
        run_with_attention(copier, COPY, "012")


def test_check_seq2seq_names_the_argument():
    check_seq2seq("model", tiny_seq2seq(COPY, d_model=16, num_heads=2))  # no error
    with pytest.raises(TypeError, match=r"models\['copy'\]: .*needs an attnbook.tasks.Seq2SeqTransformer, got Linear"):
        check_seq2seq("models['copy']", nn.Linear(2, 2))
