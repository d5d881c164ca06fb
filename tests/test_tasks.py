"""attnbook.tasks (generators, vocab, models) and attnbook.train (fit, evaluate, alignment)."""

import pytest
import torch
import torch.nn as nn

from attnbook.tasks import (
    DecoderOnlyTransformer,
    Seq2SeqTransformer,
    Task,
    Vocab,
    addition_task,
    copy_task,
    reverse_task,
    sort_task,
)
from attnbook.tasks.data import _test_split
from attnbook.train import Alignment, History, attention_alignment, evaluate, fit, predict

ALL_TASKS = [copy_task(6), reverse_task(6), sort_task(6), addition_task(3)]


def _tiny_s2s(task, **kw):
    torch.manual_seed(0)
    return Seq2SeqTransformer(task.vocab, d_model=32, num_heads=2, dim_feedforward=64, **kw)


def _tiny_dec(task, **kw):
    torch.manual_seed(0)
    return DecoderOnlyTransformer(task.vocab, d_model=32, num_heads=2, num_layers=2, dim_feedforward=64, **kw)


# ----------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_same_seed_same_batch(task):
    src1, tgt1 = task.batch(32, seed=7)
    src2, tgt2 = task.batch(32, seed=7)
    assert torch.equal(src1, src2) and torch.equal(tgt1, tgt2)
    src3, _ = task.batch(32, seed=8)
    assert not torch.equal(src1, src3)
    assert src1.dtype == tgt1.dtype == torch.long
    assert src1.shape == (32, task.src_len) and tgt1.shape == (32, task.tgt_len + 1)
    assert torch.all(tgt1[:, -1] == Vocab.eos_id)
    # a generator gives a reproducible stream of different batches
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, b = task.batch(16, generator=g1)[0], task.batch(16, generator=g1)[0]
    assert not torch.equal(a, b) and torch.equal(a, task.batch(16, generator=g2)[0])


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_train_and_test_splits_are_disjoint(task):
    train, _ = task.batch(400, seed=0, split="train")
    test, _ = task.batch(100, seed=0, split="test")
    assert not _test_split(train).any()
    assert _test_split(test).all()
    everything, _ = task.batch(2000, seed=0, split="all")
    assert 0.05 < _test_split(everything).float().mean() < 0.15  # about one in ten held out


def test_vocab_round_trip_and_errors():
    v = Vocab("0123456789+")
    ids = v.encode("12 + 3")
    assert ids.tolist() == [5, 6, 14, 7] and len(v) == 15
    assert v.decode(ids) == "12+3"
    with_specials = torch.tensor([Vocab.bos_id, 5, 6, Vocab.eos_id, 7, Vocab.pad_id])
    assert v.decode(with_specials) == "12"  # stops at EOS, hides BOS
    assert v.decode(with_specials, skip_special=False, stop_at_eos=False) == "<bos>12<eos>3<pad>"
    assert v.decode(torch.stack([ids, ids])) == ["12+3", "12+3"]
    assert v.encode(["<sep>", "1"]).tolist() == [Vocab.sep_id, 5]
    with pytest.raises(ValueError, match="unknown symbol 'x'"):
        v.encode("1x")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        v.decode([99])
    with pytest.raises(ValueError, match="distinct"):
        Vocab("aa")


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_task_encode_decode_round_trip(task):
    src, tgt = task.batch(5, seed=1)
    texts = task.decode(src)
    for text, row in zip(texts, src):
        assert torch.equal(task.encode(text)[0], row)
    assert len(task.decode(tgt)[0]) == task.tgt_len


def test_copy_reverse_sort_targets():
    for task, fn in [
        (copy_task(8), lambda s: s),
        (reverse_task(8), lambda s: s[::-1]),
        (sort_task(8), lambda s: "".join(sorted(s))),
    ]:
        src, tgt = task.batch(50, seed=2)
        for s, t in zip(task.decode(src), task.decode(tgt)):
            assert t == fn(s)
    task = reverse_task(8)
    assert task.decode(task.solve(task.encode("31415926")))[0] == "62951413"
    assert task.pretty(task.encode("31415926"), task.solve(task.encode("31415926"))) == ["31415926 -> 62951413"]


@pytest.mark.parametrize("num_digits", [1, 3, 4])
def test_addition_answers_are_right(num_digits):
    task = addition_task(num_digits)
    src, tgt = task.batch(200, seed=3)
    assert src.shape == (200, 2 * num_digits + 1) and tgt.shape == (200, num_digits + 2)
    for s, t in zip(task.decode(src), task.decode(tgt)):
        a, b = s.split("+")
        assert len(a) == len(b) == num_digits
        assert len(t) == num_digits + 1 and int(t[::-1]) == int(a) + int(b)  # least significant first


def test_addition_formats():
    task = addition_task(3)
    src = task.encode("123+456")
    tgt = task.solve(src)
    assert task.decode(tgt)[0] == "9750"
    assert task.pretty(src, tgt) == ["123+456=0579"]
    assert task.decode(task.solve(task.encode("999+999")))[0] == "8991"
    plain = addition_task(3, reverse_answer=False)
    assert plain.decode(plain.solve(src))[0] == "0579"
    assert plain.pretty(src, plain.solve(src)) == ["123+456=0579"]
    with pytest.raises(ValueError, match="'a\\+b'"):
        task.solve(task.encode("1234567"))


def test_alignment_targets():
    src = copy_task(5).encode("01234")
    assert torch.equal(copy_task(5).alignment_targets(src)[0, :5], torch.eye(5, dtype=torch.bool))
    rev = reverse_task(5).alignment_targets(src)[0]
    assert torch.equal(rev[:5], torch.eye(5, dtype=torch.bool).flip(-1)) and not rev[5].any()  # EOS row empty
    add = addition_task(3)
    exp = add.alignment_targets(add.encode("123+456"))[0]  # (L, S)
    assert exp.shape == (5, 7)
    # units digit (written first) looks at '3' and '6', the hundreds at '1' and '4'
    assert exp[0].nonzero().flatten().tolist() == [2, 6]
    assert exp[2].nonzero().flatten().tolist() == [0, 4]
    assert not exp[3].any() and not exp[4].any()  # carry digit and EOS
    srt = sort_task(4)
    exp = srt.alignment_targets(srt.encode("3130"))[0]  # sorted: 0133
    assert exp[0].nonzero().flatten().tolist() == [3]  # the '0'
    assert exp[1].nonzero().flatten().tolist() == [1]  # the '1'
    assert exp[2].nonzero().flatten().tolist() == [0, 2]  # either '3'


def test_task_errors():
    with pytest.raises(ValueError, match="length must be an int >= 1"):
        copy_task(0)
    with pytest.raises(ValueError, match="num_symbols"):
        copy_task(5, num_symbols=1)
    with pytest.raises(ValueError, match="num_digits"):
        addition_task(0)
    task = copy_task(5)
    with pytest.raises(ValueError, match="have 5 symbols, got 3"):
        task.encode("123")
    with pytest.raises(ValueError, match=r"sources must be \(B, S=5\), got \(2, 4\)"):
        task.solve(torch.full((2, 4), 5))
    with pytest.raises(TypeError, match="LongTensor"):
        task.solve(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="symbol ids"):
        task.solve(torch.zeros(2, 5, dtype=torch.long))  # PAD is not a symbol
    with pytest.raises(ValueError, match="split must be"):
        task.batch(4, split="valid")
    with pytest.raises(ValueError, match="batch_size"):
        task.batch(0)


# ----------------------------------------------------------------------------- models


def test_seq2seq_shapes_and_attention():
    task = addition_task(3)
    model = _tiny_s2s(task, num_encoder_layers=2)
    src, tgt = task.batch(4, seed=0)
    logits = model(src, tgt[:, :3])
    assert logits.shape == (4, 3, len(task.vocab))
    logits2, attn = model(src, tgt[:, :3], return_attention=True)
    torch.testing.assert_close(logits, logits2, atol=1e-5, rtol=1e-5)
    assert [w.shape for w in attn["encoder"]] == [(4, 2, 7, 7)] * 2
    assert [w.shape for w in attn["decoder_self"]] == [(4, 2, 3, 3)]
    assert [w.shape for w in attn["decoder_cross"]] == [(4, 2, 3, 7)]
    assert [w.shape for w in model.source_attention(src, tgt)] == [(4, 2, 5, 7)]
    out = model.generate(src, 5)
    assert out.dtype == torch.long and out.shape[0] == 4 and out.shape[1] <= 5
    assert model.loss(src, tgt).ndim == 0


def test_decoder_only_shapes_and_attention():
    task = copy_task(6)
    model = _tiny_dec(task)
    src, tgt = task.batch(3, seed=0)
    ids = torch.cat([src, torch.full((3, 1), Vocab.sep_id), tgt], dim=1)
    logits, attn = model(ids, return_attention=True)
    assert logits.shape == (3, 14, len(task.vocab))
    assert [w.shape for w in attn["self"]] == [(3, 2, 14, 14)] * 2
    assert torch.all(attn["self"][0].triu(diagonal=1) == 0)
    assert [w.shape for w in model.source_attention(src, tgt)] == [(3, 2, 7, 6)] * 2
    assert model.generate(src, 7).shape[1] <= 7
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(src, 100)


def test_padded_source_is_ignored():
    task = copy_task(4)
    model = _tiny_s2s(task).eval()
    src, tgt = task.batch(2, seed=0)
    padded = torch.cat([src, torch.full((2, 3), Vocab.pad_id)], dim=1)  # (B, S + 3)
    tgt_in = model._teacher_input(tgt)
    with torch.no_grad():
        logits, attn = model(padded, tgt_in, return_attention=True)
        torch.testing.assert_close(logits, model(src, tgt_in), atol=1e-5, rtol=1e-5)
    assert torch.all(attn["decoder_cross"][0][..., 4:] == 0)
    assert torch.all(attn["encoder"][0][..., 4:] == 0)


def test_generate_pads_after_eos():
    task = copy_task(4)
    model = _tiny_s2s(task)
    with torch.no_grad():
        model.head.bias.fill_(-10.0)
        model.head.bias[Vocab.eos_id] = 10.0  # always says EOS at once
    src, _ = task.batch(2, seed=0)
    assert model.generate(src, 4).tolist() == [[Vocab.eos_id]] * 2
    with torch.no_grad():
        model.head.bias[Vocab.eos_id] = -10.0
        model.head.bias[5] = 10.0  # never says EOS: runs to max_new_tokens
    assert model.generate(src, 4).tolist() == [[5] * 4] * 2


def _grad_wrt_embeddings(model, embed, run, position):
    saved = {}

    def hook(module, inputs, output):
        output.retain_grad()
        saved["x"] = output

    handle = embed.register_forward_hook(hook)
    try:
        logits = run()
        logits[:, position].sum().backward()
    finally:
        handle.remove()
    return saved["x"].grad.abs().sum(dim=(0, 2))  # (T,) gradient reaching each input position


def test_decoder_only_does_not_see_the_future():
    task = copy_task(6)
    model = _tiny_dec(task)
    src, tgt = task.batch(2, seed=0)
    ids = torch.cat([src, torch.full((2, 1), Vocab.sep_id), tgt], dim=1)[:, :-1]  # (B, 13)
    t = 8
    grad = _grad_wrt_embeddings(model, model.embed, lambda: model(ids), t)
    assert torch.all(grad[t + 1 :] == 0)
    assert torch.all(grad[: t + 1] > 0)
    # and changing future tokens leaves earlier logits alone
    changed = ids.clone()
    changed[:, t + 1 :] = 4
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[:, : t + 1], model(changed)[:, : t + 1])


def test_seq2seq_decoder_does_not_see_the_future():
    task = reverse_task(6)
    model = _tiny_s2s(task)
    src, tgt = task.batch(2, seed=0)
    tgt_in = model._teacher_input(tgt)
    t = 3
    grad = _grad_wrt_embeddings(model, model.tgt_embed, lambda: model(src, tgt_in), t)
    assert torch.all(grad[t + 1 :] == 0) and torch.all(grad[: t + 1] > 0)


def test_model_errors():
    task = copy_task(4)
    with pytest.raises(TypeError, match="vocab must be an attnbook.tasks.Vocab"):
        Seq2SeqTransformer(20)
    model = _tiny_s2s(task, max_len=8)
    with pytest.raises(TypeError, match="LongTensor"):
        model(torch.zeros(2, 4), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids must be in \[0, 14\)"):
        model(torch.full((2, 4), 50), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="longer than max_len=8"):
        model(torch.full((2, 9), 5), torch.zeros(2, 3, dtype=torch.long))


# ----------------------------------------------------------------------------- training


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
    assert evaluate(_tiny_s2s(task), task, n=100) < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("make_model", [_tiny_s2s, _tiny_dec], ids=["seq2seq", "decoder-only"])
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
    model = _tiny_s2s(task)
    hist = fit(model, task, steps=30, batch_size=8, eval_every=5, eval_n=8, stop_at=0.0, progress=False)
    assert hist.step == [5]  # stopped at the first evaluation point
    assert next(model.parameters()).device.type in ("cpu", "cuda", "mps")


def test_fit_errors():
    task = copy_task(4)
    model = _tiny_s2s(task)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        fit(model, task, steps=0, progress=False)
    with pytest.raises(ValueError, match="lr must be positive"):
        fit(model, task, steps=1, lr=0.0, progress=False)
    with pytest.raises(TypeError, match="task must be an attnbook.tasks.Task"):
        fit(model, "copy", steps=1, progress=False)
    with pytest.raises(TypeError, match="has no loss\\(\\) method"):
        fit(nn.Linear(2, 2), task, steps=1, progress=False)
    assert isinstance(task, Task)
