"""Tests for attnbook.recall: both tasks draw what they say; G models trained together are G separate models;
each kind computes the attention it names (softmax, linear, the additive control and the delta rule, built here
from the package's functions one model at a time); a query with ``query_writes=False`` reads the state the pairs
left; the causal models see no later token; training is deterministic and learns; bad input names the problem.

Dimension legend: G models, B batch, N stored pairs, Q queries, T tokens, H heads, D head dim, E = H D.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbook import scaled_dot_product_attention
from attnbook.efficient import delta_rule_attention, l2norm, linear_attention_recurrent
from attnbook.recall import (
    _EVAL_SEED,  # the held-out sequences' seed: the reference below scores the same ones
    KEYS,
    RECALL_KINDS,
    VALUES,
    RecallModels,
    least_squares_recall,
    mqar_batch,
    pairs_batch,
    recall_curves,
    train_recall,
)


def pair_tokens(B: int, N: int, seed: int) -> torch.Tensor:
    """pairs_batch as RecallModels reads it: (B, N + 1, 2) ids, the query's value id the "none" one."""
    keys, values, query, _ = pairs_batch(B, N, torch.Generator().manual_seed(seed))
    pairs = torch.stack([keys, KEYS + values], dim=2)  # (B, N, 2)
    asked = torch.stack([query, torch.full_like(query, KEYS + VALUES)], dim=1)[:, None]  # (B, 1, 2)
    return torch.cat([pairs, asked], dim=1)


def test_pairs_batch_draws_distinct_keys_and_the_queried_value():
    keys, values, query, target = pairs_batch(50, 16, torch.Generator().manual_seed(0))
    assert keys.shape == values.shape == (50, 16) and query.shape == target.shape == (50,)
    assert all(len(set(row.tolist())) == 16 for row in keys)
    assert int(keys.min()) >= 0 and int(keys.max()) < KEYS and int(values.min()) >= 0 and int(values.max()) < VALUES
    at = (keys == query[:, None]).float().argmax(dim=1)  # (B,) where the query key is stored
    assert torch.equal(values.gather(1, at[:, None])[:, 0], target)
    again = pairs_batch(50, 16, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip((keys, values, query, target), again))


def test_mqar_batch_layout():
    """k_1 v_1 ... k_N v_N, then Q distinct stored keys; each target is the value after that key."""
    tokens, target = mqar_batch(40, 12, 5, torch.Generator().manual_seed(1))
    assert tokens.shape == (40, 29) and target.shape == (40, 5)
    keys, values = tokens[:, 0:24:2], tokens[:, 1:24:2] - KEYS  # (B, N) each
    assert (keys < KEYS).all() and ((values >= 0) & (values < VALUES)).all()
    assert all(len(set(r.tolist())) == 12 for r in keys)
    queries = tokens[:, 24:]  # (B, Q)
    assert all(len(set(r.tolist())) == 5 for r in queries)
    at = (keys[:, None, :] == queries[:, :, None]).float().argmax(dim=-1)  # (B, Q) which pair is asked
    assert ((keys[:, None, :] == queries[:, :, None]).sum(-1) == 1).all()
    assert torch.equal(values.gather(1, at), target)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda g: pairs_batch(4, 0, g), ValueError, "num_pairs"),
    (lambda g: pairs_batch(4, KEYS + 1, g), ValueError, "num_pairs"),
    (lambda g: pairs_batch(0, 4, g), ValueError, "batch_size"),
    (lambda g: pairs_batch(4, 2.0, g), TypeError, "num_pairs"),
    (lambda g: mqar_batch(4, 4, 5, g), ValueError, "num_queries"),
    (lambda g: mqar_batch(4, 4, 2, 0), TypeError, "generator"),
])
def test_batches_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.Generator())


def slice_model(models: RecallModels, g: int, seed: int) -> RecallModels:
    """A single model with model g's parameters (and its own init, to compare)."""
    one = RecallModels(models.kind, models.task, (seed,), head_dim=models.head_dim, num_heads=models.num_heads,
                       query_writes=models.query_writes)
    for (name, p), (_, p1) in zip(models.named_parameters(), one.named_parameters()):
        assert torch.equal(p[g:g + 1], p1), name  # seeded alike: the same initial weights
    return one


@pytest.mark.parametrize("kind", RECALL_KINDS)
@pytest.mark.parametrize("task", ["pairs", "mqar"])
def test_models_side_by_side_are_separate_models(kind, task):
    """Seeds (3, 5) trained together: the same logits as each model alone, on its own tokens."""
    models = RecallModels(kind, task, (3, 5), head_dim=4)
    if task == "pairs":
        tokens = torch.stack([pair_tokens(6, 7, 0), pair_tokens(6, 7, 1)])  # (G, B, T, 2)
        Q = 1
    else:
        tokens = torch.stack([mqar_batch(6, 7, 3, torch.Generator().manual_seed(s))[0] for s in (0, 1)])
        Q = 3
    with torch.no_grad():
        both = models(tokens, Q)  # (G, B, Q, VALUES)
        for g, seed in enumerate((3, 5)):
            alone = slice_model(models, g, seed)(tokens[g], Q)[0]
            torch.testing.assert_close(both[g], alone, rtol=1e-5, atol=1e-6)
    assert both.shape == (2, 6, Q, VALUES)


def by_hand(m: RecallModels, tokens: torch.Tensor, Q: int) -> torch.Tensor:
    """One model (G = 1) computed step by step from the package's functions: (B, Q, VALUES)."""
    H, D = m.num_heads, m.head_dim
    E = H * D
    x = m.embed[0][tokens]  # (B, T, E) or (B, T, 2, E)
    if m.task == "pairs":
        x = x.sum(-2)
    B, T, _ = x.shape
    qkv = x @ m.qkv[0] + m.qkv_bias[0]  # (B, T, 3E)
    if m.conv is not None:
        prev = torch.cat([qkv.new_zeros(B, 1, 3 * E), qkv[:, :-1]], dim=1)  # (B, T, 3E) x_{t-1}
        qkv = m.conv[0][:, 0] * qkv + m.conv[0][:, 1] * prev
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(E, dim=-1))  # (B, H, T, D)
    if m.kind == "softmax":
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        out = scaled_dot_product_attention(q, k, v, allowed)[0]
    elif m.kind == "linear":
        out = linear_attention_recurrent(q, k, v)
    else:
        beta = torch.sigmoid(x @ m.beta_proj[0]).transpose(1, 2)  # (B, H, T)
        if not m.query_writes:
            beta = beta.clone()
            beta[..., T - Q:] = 0
        if m.kind == "delta":
            out = delta_rule_attention(q, k, v, beta, use_qk_l2norm=True, method="recurrent")
        else:  # S_t = S_{t-1} + beta_t k_t v_t^T, one step at a time
            qn, kn = l2norm(q) * D ** -0.5, l2norm(k)
            S, outs = q.new_zeros(B, H, D, D), []
            for t in range(T):
                S = S + beta[:, :, t, None, None] * kn[:, :, t, :, None] * v[:, :, t, None, :]
                outs.append((qn[:, :, t, :, None] * S).sum(-2))
            out = torch.stack(outs, dim=2)
    y = out[:, :, T - Q:].transpose(1, 2).reshape(B, Q, E) @ m.out_proj[0]  # (B, Q, E)
    return y @ m.readout[0] + m.readout_bias[0]


@pytest.mark.parametrize("kind", RECALL_KINDS)
@pytest.mark.parametrize(("task", "query_writes"), [("pairs", True), ("pairs", False), ("mqar", True),
                                                    ("mqar", False)])
def test_each_kind_is_the_attention_it_names(kind, task, query_writes):
    m = RecallModels(kind, task, (7,), head_dim=8, query_writes=query_writes)
    if task == "pairs":
        tokens, Q = pair_tokens(5, 40, 2), 1  # T = 41: two delta chunks
    else:
        tokens, Q = mqar_batch(5, 20, 6, torch.Generator().manual_seed(2))[0], 6  # T = 46
    with torch.no_grad():
        got, ref = m(tokens, Q)[0], by_hand(m, tokens, Q)
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-5


def test_a_query_that_does_not_write_reads_the_pairs_state():
    """query_writes=False: the delta model's query reads S_N, the state after the N pairs, exactly."""
    m = RecallModels("delta", "pairs", (0,), head_dim=8, query_writes=False)
    tokens = pair_tokens(4, 10, 3)
    H, D = m.num_heads, m.head_dim
    with torch.no_grad():
        x = m.embed[0][tokens].sum(-2)  # (B, T, E)
        q, k, v = ((x @ m.qkv[0] + m.qkv_bias[0]).split(H * D, -1))
        q, k, v = (t.view(4, 11, H, D).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        beta = torch.sigmoid(x @ m.beta_proj[0]).transpose(1, 2)  # (B, H, T)
        _, state = delta_rule_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], beta[:, :, :10], use_qk_l2norm=True,
                                        output_final_state=True)  # (B, H, D, D) after the pairs
        read = (l2norm(q[:, :, 10]) * D ** -0.5)[:, :, None] @ state  # (B, H, 1, D)
        y = read.transpose(1, 2).reshape(4, 1, H * D) @ m.out_proj[0] @ m.readout[0] + m.readout_bias[0]
        torch.testing.assert_close(m(tokens)[0], y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", RECALL_KINDS)
def test_order_of_the_pairs(kind):
    """Pre-paired tokens and no positions: softmax, linear and additive recall the same for any order of the pairs;
    the delta rule's later writes correct earlier ones, so its answer depends on the order."""
    m = RecallModels(kind, "pairs", (1,), head_dim=8)
    tokens = pair_tokens(8, 12, 2)
    perm = torch.cat([torch.randperm(12, generator=torch.Generator().manual_seed(3)), torch.tensor([12])])
    with torch.no_grad():
        a, b = m(tokens), m(tokens[:, perm])
    if kind == "delta":
        assert (a - b).abs().max() > 1e-3
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", RECALL_KINDS)
def test_mqar_queries_see_no_later_token(kind):
    m = RecallModels(kind, "mqar", (2,), head_dim=8)
    tokens, _ = mqar_batch(3, 10, 4, torch.Generator().manual_seed(4))
    later = tokens.clone()
    later[:, -1] = (later[:, -1] + 1) % KEYS
    with torch.no_grad():
        a, b = m(tokens, 4), m(later, 4)
    torch.testing.assert_close(a[:, :, :3], b[:, :, :3], rtol=0, atol=0)
    assert (a[:, :, 3] - b[:, :, 3]).abs().max() > 0


def test_model_bad_input():
    with pytest.raises(ValueError, match="kind must be one of"):
        RecallModels("mamba")
    with pytest.raises(ValueError, match="task must be one of"):
        RecallModels("delta", "copy")
    with pytest.raises(TypeError, match="query_writes must be a bool"):
        RecallModels("delta", query_writes="no")
    with pytest.raises(ValueError, match="seeds"):
        RecallModels("delta", seeds=())


def test_train_recall_is_deterministic_and_learns():
    """Same seeds, same curve; the loss on fixed sequences falls within 40 steps; eval_at's steps come back."""
    curves = [train_recall(RecallModels("delta", "pairs", (0, 1), head_dim=8), 4, 3, eval_at=(0, 2), eval_size=64)
              for _ in range(2)]
    assert curves[0] == curves[1] and set(curves[0]) == {0, 2, 3}
    assert all(len(a) == 2 and all(0.0 <= x <= 1.0 for x in a) for a in curves[0].values())
    m = RecallModels("additive", "mqar", (0,), head_dim=8)
    tokens, target = mqar_batch(128, 4, 2, torch.Generator().manual_seed(9))

    def loss() -> float:
        with torch.no_grad():
            return F.cross_entropy(m(tokens, 2).reshape(-1, VALUES), target.reshape(-1)).item()

    before = loss()
    train_recall(m, 4, 40, num_queries=2, eval_size=16)
    assert loss() < before


def test_train_recall_bad_input():
    with pytest.raises(TypeError, match="RecallModels"):
        train_recall(torch.nn.Linear(2, 2), 4, 1)  # type: ignore[arg-type]
    m = RecallModels("linear", head_dim=4)
    with pytest.raises(ValueError, match="lr"):
        train_recall(m, 4, 1, lr=0.0)
    with pytest.raises(ValueError, match="num_pairs"):
        train_recall(m, 0, 1)
    with pytest.raises(ValueError, match="eval_at"):
        train_recall(m, 4, 2, eval_at=(3,))


def test_recall_curves_keys_threads_and_global_generator():
    before_threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    curve = recall_curves("delta", 3, 2, seeds=(0, 1), eval_at=(0,), head_dim=4, eval_size=16)
    assert set(curve) == {0, 2} and all(set(c) == {0, 1} for c in curve.values())
    assert torch.get_num_threads() == before_threads
    assert torch.equal(torch.rand(3), expected_next)  # the caller's generator was left alone
    with pytest.raises(ValueError, match="threads"):
        recall_curves("delta", 3, 1, threads=0)


def _least_squares_one_by_one(num_pairs, head_dim, num_heads, eval_size, seed):
    """The solved memory again, sequence by sequence and head by head, through numpy's own least squares."""
    import numpy as np

    gen = torch.Generator().manual_seed(seed)
    codes = F.normalize(torch.randn(KEYS, num_heads, head_dim, generator=gen, dtype=torch.float64), dim=-1).numpy()
    keys, values, query, target = pairs_batch(eval_size, num_pairs, torch.Generator().manual_seed(_EVAL_SEED))
    hits = 0
    for b in range(eval_size):
        y = np.eye(VALUES)[values[b].numpy()]  # (Np, VALUES)
        read = np.zeros(VALUES)
        for h in range(num_heads):
            k = codes[keys[b].numpy(), h]  # (Np, D)
            m = np.linalg.lstsq(k, y, rcond=None)[0]  # (D, VALUES): least squares, least norm when Np <= D
            read += codes[int(query[b]), h] @ m
        hits += int(read.argmax() == int(target[b]))
    return hits / eval_size


@pytest.mark.parametrize("num_pairs, head_dim, num_heads", [(5, 8, 1), (8, 8, 2), (24, 8, 2), (40, 16, 2), (64, 16, 1)])
def test_least_squares_recall_is_the_solved_memory(num_pairs, head_dim, num_heads):
    got = least_squares_recall(num_pairs, head_dim, num_heads, eval_size=200, seed=3)
    assert got == pytest.approx(_least_squares_one_by_one(num_pairs, head_dim, num_heads, 200, 3), abs=1e-12)


def test_least_squares_recall_keeps_what_fits_and_loses_past_it():
    for n, d in [(4, 8), (8, 8), (16, 16), (16, 32)]:  # no more pairs than dimensions: every pair kept exactly
        assert least_squares_recall(n, d, eval_size=300) == 1.0
    falling = [least_squares_recall(n, 8, eval_size=300) for n in (8, 16, 32, 64)]
    assert falling[0] == 1.0 and all(a > b for a, b in zip(falling, falling[1:])), falling
    assert falling[-1] > 1 / VALUES  # still above chance
    assert least_squares_recall(32, 8, 2, eval_size=300) > least_squares_recall(32, 8, 1, eval_size=300)  # heads add


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_pairs": 0}, ValueError, "num_pairs"),
    ({"num_pairs": KEYS + 1}, ValueError, "num_pairs"),
    ({"num_pairs": 4, "head_dim": 2.0}, TypeError, "head_dim"),
    ({"num_pairs": 4, "num_heads": 0}, ValueError, "num_heads"),
    ({"num_pairs": 4, "eval_size": 0}, ValueError, "eval_size"),
    ({"num_pairs": 4, "seed": -1}, ValueError, "seed"),
])
def test_least_squares_recall_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        least_squares_recall(**kwargs)
