"""attnbook.tasks: the generators, the vocabulary (teacher forcing's shifted input, what a decoder wrote up to
its EOS) and the two toy models. Training them (attnbook.train) is tested in test_train.py.

Dimension legend: B batch, S source length, L target length (EOS included), T sequence length, V vocabulary.
"""

import pytest
import torch

from attnbook.tasks import (
    Seq2SeqTransformer,
    Vocab,
    addition_task,
    copy_task,
    reverse_task,
    sort_task,
)
from tests.helpers import tiny_decoder_only, tiny_seq2seq

ALL_TASKS = [copy_task(6), reverse_task(6), sort_task(6), addition_task(3)]


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


SMALL_TASKS = [copy_task(2, num_symbols=10), reverse_task(2, num_symbols=10), sort_task(2, num_symbols=10),
               addition_task(1), copy_task(3, num_symbols=5)]  # 100 or 125 sources: every one gets drawn


@pytest.mark.parametrize("task", SMALL_TASKS, ids=lambda t: f"{t.name}-{t.src_len}")
def test_train_and_test_splits_are_disjoint(task):
    def sources(n, split):
        return {tuple(row) for row in task.batch(n, seed=0, split=split)[0].tolist()}

    train, test, everything = sources(3000, "train"), sources(1000, "test"), sources(3000, "all")
    assert not train & test  # a test source is never trained on
    assert train | test == everything  # and every source is in one of them
    assert 0.05 < len(test) / len(everything) < 0.15  # about one in ten held out


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


def test_shift_right_is_teacher_forcings_input():
    v = Vocab("abc")  # symbols a, b, c are ids 4, 5, 6 (after PAD, BOS, EOS, SEP)
    B_, E, P = v.bos_id, v.eos_id, v.pad_id
    tgt = torch.tensor([[4, 5, 6, E], [6, E, P, P]])  # (B, L)
    shifted = v.shift_right(tgt)
    assert shifted.tolist() == [[B_, 4, 5, 6], [B_, 6, E, P]]
    assert shifted.dtype == tgt.dtype and tgt.tolist() == [[4, 5, 6, E], [6, E, P, P]]  # the input is left alone
    assert v.shift_right(tgt[:, :1]).tolist() == [[B_], [B_]]
    assert v.shift_right(tgt[:, :0]).shape == (2, 0)


def test_shift_right_is_what_the_models_are_trained_on():
    """loss() is the cross-entropy of the logits the model gives for the shifted target."""
    task = copy_task(4)
    model = tiny_seq2seq(task).eval()
    src, tgt = task.batch(3, seed=0)
    with torch.no_grad():
        logits = model(src, task.vocab.shift_right(tgt))  # (B, L, V)
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=Vocab.pad_id)
        torch.testing.assert_close(model.loss(src, tgt), ce)


def test_shift_right_errors():
    with pytest.raises(TypeError, match=r"tgt must be a torch.Tensor of token ids \(B, L\), got list"):
        Vocab("abc").shift_right([[4, 5]])


def test_shift_right_wrong_shape_is_a_value_error():
    with pytest.raises(ValueError, match=r"\(B, L\).*\(4\)"):
        Vocab("abc").shift_right(torch.tensor([4, 5, 6, 4]))


def test_stop_after_eos_pads_what_follows_the_first_eos():
    v = Vocab("abc")
    E, P = v.eos_id, v.pad_id
    ids = torch.tensor([[4, E, 5, E, 6],   # stops at the first EOS; a second one is padded too
                        [4, 5, 6, 4, 5],   # no EOS: unchanged
                        [E, 4, 4, 4, 4],   # EOS first
                        [4, 5, 6, 4, E]])  # EOS last: unchanged
    out = v.stop_after_eos(ids)
    assert out.tolist() == [[4, E, P, P, P], [4, 5, 6, 4, 5], [E, P, P, P, P], [4, 5, 6, 4, E]]
    assert out.dtype == ids.dtype and ids[0, 2] == 5  # a new tensor: the input is left alone
    assert torch.equal(v.stop_after_eos(out), out)  # applying it twice changes nothing
    assert v.decode(out, skip_special=False, stop_at_eos=False)[0] == "a<eos><pad><pad><pad>"


def test_stop_after_eos_is_what_generate_returns():
    """A model that says EOS, then other tokens, when forced to go on: its output stops at the first EOS."""
    task = copy_task(4)
    model = tiny_seq2seq(task)
    with torch.no_grad():
        model.head.bias.fill_(-10.0)
        model.head.bias[Vocab.eos_id] = 10.0
    src, _ = task.batch(2, seed=0)
    out = model.generate(src, 4)
    assert torch.equal(task.vocab.stop_after_eos(out), out)


def test_stop_after_eos_errors():
    v = Vocab("abc")
    with pytest.raises(TypeError, match="ids"):
        v.stop_after_eos([[4, 5]])
    with pytest.raises(ValueError, match=r"ids.*\(4\)"):
        v.stop_after_eos(torch.tensor([4, 5, 6, 4]))


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
    model = tiny_seq2seq(task, num_encoder_layers=2)
    src, tgt = task.batch(4, seed=0)
    logits = model(src, tgt[:, :3])
    assert logits.shape == (4, 3, len(task.vocab))
    logits2, attn = model(src, tgt[:, :3], need_weights=True)
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
    model = tiny_decoder_only(task)
    src, tgt = task.batch(3, seed=0)
    ids = torch.cat([src, torch.full((3, 1), Vocab.sep_id), tgt], dim=1)
    logits, attn = model(ids, need_weights=True)
    assert logits.shape == (3, 14, len(task.vocab))
    assert [w.shape for w in attn["self"]] == [(3, 2, 14, 14)] * 2
    assert torch.all(attn["self"][0].triu(diagonal=1) == 0)
    assert [w.shape for w in model.source_attention(src, tgt)] == [(3, 2, 7, 6)] * 2
    assert model.generate(src, 7).shape[1] <= 7
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(src, 100)


def test_padded_source_is_ignored():
    task = copy_task(4)
    model = tiny_seq2seq(task).eval()
    src, tgt = task.batch(2, seed=0)
    padded = torch.cat([src, torch.full((2, 3), Vocab.pad_id)], dim=1)  # (B, S + 3)
    tgt_in = task.vocab.shift_right(tgt)
    with torch.no_grad():
        logits, attn = model(padded, tgt_in, need_weights=True)
        torch.testing.assert_close(logits, model(src, tgt_in), atol=1e-5, rtol=1e-5)
    assert torch.all(attn["decoder_cross"][0][..., 4:] == 0)
    assert torch.all(attn["encoder"][0][..., 4:] == 0)


def test_generate_pads_after_eos():
    task = copy_task(4)
    model = tiny_seq2seq(task)
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
    model = tiny_decoder_only(task)
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
    model = tiny_seq2seq(task)
    src, tgt = task.batch(2, seed=0)
    tgt_in = task.vocab.shift_right(tgt)
    t = 3
    grad = _grad_wrt_embeddings(model, model.tgt_embed, lambda: model(src, tgt_in), t)
    assert torch.all(grad[t + 1 :] == 0) and torch.all(grad[: t + 1] > 0)


def test_model_errors():
    task = copy_task(4)
    with pytest.raises(TypeError, match="vocab must be an attnbook.tasks.Vocab"):
        Seq2SeqTransformer(20)
    model = tiny_seq2seq(task, max_len=8)
    with pytest.raises(TypeError, match="LongTensor"):
        model(torch.zeros(2, 4), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids must be in \[0, 14\)"):
        model(torch.full((2, 4), 50), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="longer than max_len=8"):
        model(torch.full((2, 9), 5), torch.zeros(2, 3, dtype=torch.long))
