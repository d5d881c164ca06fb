"""attnbook.core.softmax_stats: entropy, largest weight and the norm of the softmax's Jacobian, averaged over
a batch of logit rows, against their definitions (chapter 2's saturation explorer plots them).

(Kept apart from test_core.py while that file is edited on another branch; it can join it later.)

Dimension legend: B rows of logits, T keys.
"""

import math

import pytest
import torch

from attnbook.core import softmax_stats
from tests.helpers import randn


def test_softmax_stats_matches_autograd_jacobian():
    z = randn(3, 5)
    stats = softmax_stats(z)
    norms = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), row).norm() for row in z]
    assert abs(stats["grad_norm"] - torch.stack(norms).mean().item()) < 1e-10


def test_entropy_and_largest_weight_are_their_definitions_averaged_over_rows():
    z = randn(4, 7, seed=1, scale=3.0)
    p = torch.softmax(z, dim=-1)
    stats = softmax_stats(z)
    assert set(stats) == {"entropy", "max_weight", "grad_norm"} and all(type(v) is float for v in stats.values())
    assert stats["entropy"] == pytest.approx(float(-(p * p.log()).sum(-1).mean()), abs=1e-12)
    assert stats["max_weight"] == pytest.approx(float(p.max(-1).values.mean()), abs=1e-12)
    per_row = [softmax_stats(row[None]) for row in z]
    for key in stats:
        assert stats[key] == pytest.approx(sum(r[key] for r in per_row) / len(per_row), abs=1e-12)


def test_uniform_and_saturated_ends():
    T = 4
    flat = softmax_stats(torch.zeros(2, T))
    assert flat["entropy"] == pytest.approx(math.log(T)) and flat["max_weight"] == pytest.approx(1 / T)
    # diag(p) - p p^T with p = 1/T: T diagonal entries 1/T - 1/T^2 and T^2 - T entries -1/T^2
    assert flat["grad_norm"] == pytest.approx(math.sqrt(T * (1 / T - 1 / T**2) ** 2 + (T * T - T) / T**4))
    peaked = softmax_stats(torch.tensor([[1000.0, 0.0, 0.0, 0.0]]))  # float32 logits: computed in float64
    assert peaked["entropy"] == pytest.approx(0.0, abs=1e-12) and peaked["max_weight"] == 1.0
    assert peaked["grad_norm"] == pytest.approx(0.0, abs=1e-12)  # saturated: the weights cannot move


def test_shifting_every_logit_changes_nothing():
    z = randn(3, 6, seed=2)
    a, b = softmax_stats(z), softmax_stats(z + 123.0)
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-9)
