"""What several test files build the same way: seeded random tensors, q/k/v triples, tiny toy models, and
deterministic stand-ins for the timings and costs the explorers would otherwise measure.

Every random tensor comes from its own ``torch.Generator`` seeded with ``seed``: the same call gives the same
numbers, whatever ran before, and the global generator is left alone. (The model builders are the exception:
``nn.Module`` initialisation draws from the global generator, so they seed it, as the tests always did.)

Dimension legend: B batch, H heads, Hkv key/value heads, T query length, S key length, D head dim, Dv value
head dim, L target length (EOS included), K key length of one kind of attention.
"""

from __future__ import annotations

from typing import Any

import torch

from attnbook.efficient import REGISTRY, cost_key
from attnbook.kvcache import BENCH_DIVISOR, decode_key
from attnbook.mha import valid_kv_heads
from attnbook.tasks import DecoderOnlyTransformer, Seq2SeqTransformer, Task
from attnbook.train import predict

F64 = torch.float64


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = F64, scale: float = 1.0) -> torch.Tensor:
    """Standard normal numbers of ``shape`` (times ``scale``) from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def qkv(B: int, H: int, T: int, D: int, *, S: int | None = None, Dv: int | None = None, seed: int = 0,
        dtype: torch.dtype = F64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``(B, H, T, D)``, k ``(B, H, S, D)`` and v ``(B, H, S, Dv)`` (S = T and Dv = D unless given), drawn
    with seeds ``seed``, ``seed + 1`` and ``seed + 2``."""
    S = T if S is None else S
    Dv = D if Dv is None else Dv
    return (randn(B, H, T, D, seed=seed, dtype=dtype), randn(B, H, S, D, seed=seed + 1, dtype=dtype),
            randn(B, H, S, Dv, seed=seed + 2, dtype=dtype))


# ----------------------------------------------------------------------------- tiny toy models


def tiny_seq2seq(task: Task, *, d_model: int = 32, num_heads: int = 2, dim_feedforward: int | None = 64,
                 seed: int = 0, **kwargs: Any) -> Seq2SeqTransformer:
    """A small, untrained :class:`attnbook.tasks.Seq2SeqTransformer` for ``task``, its weights drawn after
    ``torch.manual_seed(seed)`` (other arguments go to the model; ``dim_feedforward=None`` is the model's
    own default, 4 * d_model)."""
    torch.manual_seed(seed)
    return Seq2SeqTransformer(task.vocab, d_model=d_model, num_heads=num_heads, dim_feedforward=dim_feedforward,
                              **kwargs)


def tiny_decoder_only(task: Task, *, d_model: int = 32, num_heads: int = 2, num_layers: int = 2,
                      dim_feedforward: int | None = 64, seed: int = 0, **kwargs: Any) -> DecoderOnlyTransformer:
    """A small, untrained :class:`attnbook.tasks.DecoderOnlyTransformer` for ``task``, its weights drawn after
    ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return DecoderOnlyTransformer(task.vocab, d_model=d_model, num_heads=num_heads, num_layers=num_layers,
                                  dim_feedforward=dim_feedforward, **kwargs)


def seq2seq_attention(model: Seq2SeqTransformer, task: Task, text: str) -> tuple[torch.Tensor, dict]:
    """A reference for what a trained seq2seq model shows on ``text``, built by hand: what it writes
    (greedy, :func:`attnbook.train.predict`, ``(1, L)``) and its own attention maps while its decoder reads
    BOS and then that output, ``{"encoder" | "decoder_self" | "decoder_cross": [(1, H, T, K) per layer]}``."""
    src = task.encode(text)  # (1, S)
    out = predict(model, task, src)  # (1, L)
    tgt_in = torch.cat([torch.full_like(out[:, :1], task.vocab.bos_id), out[:, :-1]], dim=1)  # (1, L)
    with torch.no_grad():
        _, attn = model(src, tgt_in, need_weights=True)
    return out, attn


# ----------------------------------------------------------------------------- stand-in measurements


def fake_decode_timings(heads: tuple[int, ...] | list[int], seq_lens: tuple[int, ...] | list[int],
                        device: str = "cpu") -> dict[tuple, float]:
    """Deterministic stand-ins for :func:`attnbook.kvcache.measure_decode`: one timing for every (H, Hkv, S)
    with Hkv any valid number of key/value heads, proportional to the bytes read (``1e-6 * Hkv * S`` s)."""
    return {decode_key(H, hkv, S // BENCH_DIVISOR, device): 1e-6 * hkv * S
            for H in heads for S in seq_lens for hkv in valid_kv_heads(H)}


def fake_efficient_costs(t_values: tuple[int, ...] | list[int], window: int) -> dict[tuple, dict[str, float]]:
    """Deterministic stand-ins for :func:`attnbook.efficient.measure_costs`, for every variant of the
    registry: different per variant (the n-th gets ``(n + 1)`` times the first's), so every bar moves."""
    return {cost_key(name, T, window): {"time_s": 1e-5 * (n + 1) * T, "peak_bytes": 2000 * (n + 1) * T}
            for n, name in enumerate(REGISTRY) for T in t_values}



# ----------------------------------------------------------------------------- tolerances


def max_rel_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|``: the largest error relative to the reference's largest
    entry. A tolerance on it holds for outputs of any size, where an absolute one (``1e-5``) fails correct
    float32 code as soon as the outputs pass ~100 (one float32 step at 100 is 7.6e-6)."""
    expected = expected.detach()
    return float((actual.detach() - expected).abs().max() / expected.abs().max())
