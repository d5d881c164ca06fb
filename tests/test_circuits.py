"""attnbook.circuits: the attention-only model against attnbook's own attention, the task's structure, the
scores on hand-made weights, ablation and patching as interventions, the circuits against the model's own
computation, and (slow) an induction head forming where a one-layer model fails."""

import pytest
import torch

import attnbook
from attnbook.circuits import (
    AttentionOnlyTransformer,
    RepeatBatch,
    ablation_losses,
    composition_patching,
    copying_scores,
    duplicate_token_scores,
    gradient_attribution,
    head_scores,
    ov_circuit,
    positional_qk_circuit,
    prefix_matching_scores,
    previous_token_scores,
    qk_circuit,
    rank_correlation,
    repeat_loss,
    repeated_sequences,
    train_induction,
)


def _model(seed=0, num_layers=2):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AttentionOnlyTransformer(16, 24, d_model=32, num_heads=2, num_layers=num_layers).eval()


def _batch(n=8, seed=0, **kw):
    return repeated_sequences(n, 24, 16, min_length=6, generator=torch.Generator().manual_seed(seed), **kw)


def test_forward_is_residual_sum_of_multihead_attention_blocks():
    model, batch = _model(), _batch()
    x = model.embed.weight[batch.tokens] + model.pos.weight[:24]
    for mha in model.attn:
        out, _ = mha(x, mask=attnbook.causal_mask(24))
        x = x + out
    logits, weights = model(batch.tokens)
    torch.testing.assert_close(logits, model.unembed(x), atol=1e-5, rtol=1e-5)
    assert len(weights) == 2 and weights[0].shape == (8, 2, 24, 24)
    assert torch.all(weights[0].triu(1) == 0)  # causal


def test_head_writes_sum_to_the_layer_write():
    model, batch = _model(), _batch()
    z, _ = model.head_outputs(0, model.embed_tokens(batch.tokens))
    torch.testing.assert_close(model.head_writes(0, z).sum(1), model.write(0, z), atol=1e-5, rtol=1e-5)


def test_repeated_sequences_repeat_at_each_sequences_own_distance_and_offset():
    batch = _batch(64)
    assert len(set(batch.length.tolist())) > 1 and len(set(batch.start.tolist())) > 1
    for tokens, s, r in zip(batch.tokens, batch.start.tolist(), batch.length.tolist()):
        assert 6 <= r <= 12 and s + 2 * r <= 24
        assert torch.equal(tokens[s:s + r], tokens[s + r:s + 2 * r])
    fixed = _batch(4, fixed=True)
    assert fixed.length.tolist() == [12] * 4 and fixed.start.tolist() == [0] * 4
    assert torch.equal(fixed.tokens[:, :12], fixed.tokens[:, 12:])


def test_repeat_positions_are_the_predictable_ones():
    batch = RepeatBatch(torch.tensor([[5, 1, 2, 3, 1, 2, 3, 9]]), torch.tensor([1]), torch.tensor([3]))
    where, dist = batch.repeat_positions()
    assert where[0].nonzero().flatten().tolist() == [4, 5]  # predicting positions 5 and 6 from the first copy
    assert dist.tolist() == [[3]]


def test_repeated_sequences_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_length=13"):
        repeated_sequences(2, 24, 16, max_length=13)
    with pytest.raises(TypeError):
        repeated_sequences(2.0, 24, 16)


def test_scores_on_hand_made_weights():
    batch = _batch(4)
    B, T = batch.tokens.shape
    prev = torch.zeros(B, 1, T, T)
    prev[:, 0, 0, 0] = 1
    prev[:, 0, torch.arange(1, T), torch.arange(T - 1)] = 1
    assert previous_token_scores(prev).item() == 1.0
    induct = torch.zeros(B, 1, T, T)
    where, dist = batch.repeat_positions()
    b, t = where.nonzero(as_tuple=True)
    induct[b, 0, t, t - dist[b, 0] + 1] = 1
    assert prefix_matching_scores(induct, batch).item() == 1.0
    assert duplicate_token_scores(induct, batch).item() == 0.0
    assert previous_token_scores(induct).item() < 0.5
    with pytest.raises(ValueError, match="do not match"):
        prefix_matching_scores(induct[:2], batch)


def test_copying_score_is_one_for_a_copying_head_and_minus_one_for_its_opposite():
    model = _model(num_layers=1)
    with torch.no_grad():  # W_U W_O W_V W_E = identity: attend to token a, raise logit a
        E = torch.cat([torch.linalg.qr(torch.randn(16, 16))[0], torch.zeros(16, 16)], dim=1)  # (V, E), head 0's dims
        model.embed.weight.copy_(E)
        model.unembed.weight.copy_(E)
        mha = model.attn[0]
        mha.v_proj.weight.zero_()
        mha.out_proj.weight.zero_()
        mha.v_proj.weight[:16].copy_(torch.eye(16, 32))
        mha.out_proj.weight[:, :16].copy_(torch.eye(32, 16))
    torch.testing.assert_close(ov_circuit(model, (0, 0)), torch.eye(16), atol=1e-5, rtol=1e-5)
    assert copying_scores(model, 0)[0].item() == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():
        mha.out_proj.weight.neg_()
    assert copying_scores(model, 0)[0].item() == pytest.approx(-1.0, abs=1e-5)


def test_zero_ablation_of_every_head_leaves_embed_then_unembed():
    model, batch = _model(), _batch()
    heads = {(lay, h): "zero" for lay in range(2) for h in range(2)}
    logits, _ = model(batch.tokens, ablate=heads)
    torch.testing.assert_close(logits, model.unembed(model.embed_tokens(batch.tokens)))
    with pytest.raises(ValueError, match="outside"):
        model(batch.tokens, ablate={(2, 0): "zero"})
    with pytest.raises(ValueError, match="'zero' or 'mean'"):
        model(batch.tokens, ablate={(0, 0): "half"})


def test_mean_ablation_of_a_constant_head_changes_nothing():
    model, batch = _model(), _batch()
    same = RepeatBatch(batch.tokens[:1].expand(8, -1), batch.start[:1].expand(8), batch.length[:1].expand(8))
    ref, _ = model(same.tokens)
    out, _ = model(same.tokens, ablate={(0, 1): "mean", (1, 0): "mean"})  # every sequence identical
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    losses = ablation_losses(model, batch, "zero")
    assert losses.shape == (2, 2)
    assert losses[0, 0] == repeat_loss(model(batch.tokens, ablate={(0, 0): "zero"})[0], batch)


def test_patching_with_the_same_sequences_changes_nothing_and_another_changes_the_keys_only_path():
    model, batch, other = _model(), _batch(), _batch(seed=5)
    same = composition_patching(model, batch, batch, (0, 1))
    assert all(v == pytest.approx(same["none"], abs=1e-5) for v in same.values())
    moved = composition_patching(model, batch, other, (0, 1))
    assert moved["key"] != pytest.approx(moved["none"], abs=1e-6)
    with pytest.raises(ValueError, match="no later layer"):
        composition_patching(model, batch, other, (1, 0))


def test_qk_circuit_is_the_models_own_score_for_tokens_without_positions():
    model = _model()
    with torch.no_grad():
        model.pos.weight.zero_()
    mha = model.attn[0]
    E = model.embed.weight
    q, k, _ = mha.project(E[None])  # (1, H, V, D)
    torch.testing.assert_close(qk_circuit(model, (0, 1)), q[0, 1] @ k[0, 1].T / 4.0, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="layer before"):
        qk_circuit(model, (0, 0), key_head=(1, 0))
    pos = positional_qk_circuit(_model(), (0, 0))
    assert pos.shape == (24, 24) and torch.all(pos.triu(1) == 0)


def test_gradient_attribution_of_a_linear_score_is_input_times_weight():
    x = torch.randn(3, 5, 4)
    w = torch.randn(4)
    attr = gradient_attribution(lambda: x, lambda e: (e @ w).sum(1))
    expected = (x @ w).abs()
    torch.testing.assert_close(attr, expected / expected.sum(1, keepdim=True))
    with pytest.raises(ValueError, match="one value per sequence"):
        gradient_attribution(lambda: x, lambda e: e.sum())


def test_rank_correlation_against_known_orders():
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    torch.testing.assert_close(rank_correlation(a, a * 10), torch.tensor([1.0]))
    torch.testing.assert_close(rank_correlation(a, -a), torch.tensor([-1.0]))
    with pytest.raises(ValueError):
        rank_correlation(a, a[:, :3])


def test_model_rejects_bad_tokens():
    model = _model()
    with pytest.raises(TypeError, match="integer"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="seq_len=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        model(torch.full((1, 4), 16))


@pytest.mark.slow
def test_an_induction_head_forms_in_two_layers_and_not_in_one():
    task = dict(vocab_size=16, seq_len=24, min_length=6, d_model=32, num_heads=2, lr=1e-2, batch_size=32)
    model, hist = train_induction(num_layers=2, steps=500, every=100, seed=1, **task)
    _, hist1 = train_induction(num_layers=1, steps=500, every=100, seed=1, **task)
    assert hist.repeat_loss[0] > 2.5 and hist.repeat_loss[-1] < 1.5 and hist1.repeat_loss[-1] > 2.0
    batch = _batch(128, seed=3)
    scores = head_scores(model, batch)
    assert scores["previous_token"][0].max() > 0.3 and scores["prefix_matching"][1].max() > 0.4
    prev = (0, int(scores["previous_token"][0].argmax()))
    losses = ablation_losses(model, batch, "mean")
    assert losses[prev] > scores["repeat_loss"] + 0.5
    patched = composition_patching(model, batch, _batch(128, seed=4), prev)
    assert patched["key"] > patched["query"] + 0.5 and patched["key"] > patched["value"] + 0.5
    assert len(hist.snapshots) == len(hist.steps) == 6
    assert hist.first_step_below(1.5) is not None
