"""attnbook.testing.check_attention: every invariant holds on the course's own attention, on PyTorch's and on
correct tiled (online-softmax) attention, and each bug of the zoo, the thirteen of appendix A1's first
exercises and the blind spots of the short, order-one, contiguous inputs (a forgotten rescale, no row maximum,
a window left on, code that needs contiguous inputs, values of another width), violates exactly the
invariants that name it. Also the mask converters it relies on."""

import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import attnbook
from attnbook import causal_mask, masks, padding_mask
from attnbook.efficient import flash_attention
from attnbook.testing import CONVENTIONS, INVARIANTS, MASK_CONVENTIONS, AttentionReport, check_attention, tolerance

ALL = [name for name, _ in INVARIANTS]


def run(fn, **kw):
    return check_attention(fn, verbose=False, **kw)


# ---------------------------------------------------------------------------
# Correct implementations: every applicable invariant holds
# ---------------------------------------------------------------------------


def attention(q, k, v, mask=None, bias=None):
    """Written out, the course's convention: bool mask, True = may attend; empty rows give zeros."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ v, weights  # (B, H, T, D)


def test_the_course_scaled_dot_product_attention_holds_every_invariant():
    r = run(attnbook.scaled_dot_product_attention)
    assert r.ok and r.violated == []
    assert r.held == ["sdpa", "weights", "permutation", "causal_leak", "padding", "low_precision", "empty_rows",
                      "scale", "heads", "deterministic", "long_keys", "large_logits", "layout", "value_dim"]
    assert set(r.not_applicable) == {"causal_alignment", "cross_attention", "kv_cache", "rope", "alibi"}
    assert r["sdpa"].measured < 1e-10 and r["scale"].measured == 1.0
    assert "values and gradients" in r["sdpa"].detail


NEW = ["long_keys", "large_logits", "layout", "value_dim"]


def online_softmax_attention(q, k, v, mask=None, block_size=16, rescale=True, acc_like_q=False):
    """Chapter 8's tiling, written out: the keys in blocks of ``block_size``, a running max m, sum l and
    unnormalised output acc per query, rescaled by exp(m - m_new) whenever the max grows. The course's mask
    convention; a query with no key at all gets l = 0 and so zeros. The two flags make the blind-spot bugs."""
    scale = 1 / math.sqrt(q.shape[-1])
    lowest = torch.finfo(q.dtype).min
    B, H, T, _ = q.shape
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # (B, H, S, D)
    m = torch.full((B, H, T, 1), lowest, dtype=q.dtype)  # (B, H, T, 1) running max
    l = torch.zeros(B, H, T, 1, dtype=q.dtype)  # (B, H, T, 1) running sum of exp(score - m)
    acc = torch.zeros_like(q) if acc_like_q else torch.zeros(B, H, T, v.shape[-1], dtype=q.dtype)  # (B, H, T, Dv)
    for c in range(0, k.shape[-2], block_size):
        s = q @ k[:, :, c:c + block_size].transpose(-2, -1) * scale  # (B, H, T, Bk) one tile of scores
        allowed = None if mask is None else mask[..., c:c + block_size]
        if allowed is not None:
            s = s.masked_fill(~allowed, lowest)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - m_new)  # (B, H, T, Bk)
        if allowed is not None:
            p = p.masked_fill(~allowed, 0.0)
        alpha = torch.exp(m - m_new) if rescale else torch.ones_like(m)  # what was summed against the old max
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, c:c + block_size]
        m = m_new
    return acc / l.clamp_min(torch.finfo(q.dtype).tiny)  # (B, H, T, Dv)


def flash_causal(q, k, v):
    """attnbook's FlashAttention-2 (its own backward pass) with blocks of 16 keys and 16 queries."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    return flash_attention(q, k, v, causal=True, block_size=16, query_block_size=16)


def test_correct_tiled_attention_holds_every_invariant():
    r = run(online_softmax_attention)
    assert r.ok, str(r)
    assert set(NEW) <= set(r.held) and {"sdpa", "causal_leak", "padding", "empty_rows"} <= set(r.held)
    assert "3 cases, values and gradients" in r["long_keys"].detail
    assert run(lambda q, k, v, mask=None: online_softmax_attention(q, k, v, mask, block_size=4)).ok
    assert run(online_softmax_attention, groups=2).ok
    assert run(online_softmax_attention, dtype=torch.float32).ok


@pytest.mark.parametrize("alignment", ["top-left", True])
def test_flash_attention_with_small_blocks_holds_every_invariant(alignment):
    r = run(flash_causal, causal=alignment)
    assert r.ok, str(r)
    assert set(NEW) <= set(r.held) and "top-left" in r["causal_alignment"].detail
    assert run(flash_causal, causal="top-left", groups=2).ok


def test_pytorch_and_the_course_hold_the_new_invariants():
    sdpa = run(F.scaled_dot_product_attention, call=lambda fn, q, k, v, mask: fn(q, k, v, attn_mask=mask))
    assert sdpa.ok and set(NEW) <= set(sdpa.held)
    assert "(B, T, H, D) transposed and slices of a fused qkv projection" in sdpa["layout"].detail
    assert "D = 8, Dv = 3 and D = 6, Dv = 12" in sdpa["value_dim"].detail
    assert sdpa["large_logits"].measured < sdpa["large_logits"].tolerance == 1e-3
    ours = run(attnbook.scaled_dot_product_attention)
    assert ours.ok and set(NEW) <= set(ours.held)
    torch.manual_seed(0)
    module = run(attnbook.MultiHeadAttention(32, 8, num_kv_heads=2))
    assert module.ok and {"long_keys", "large_logits", "layout"} <= set(module.held)
    assert "value_dim" in module.not_applicable  # a module's value width is its own
    assert "decoding after 199 cached tokens" in module["long_keys"].detail
    assert "largest score is 300" in module["large_logits"].detail


def test_conventions_are_tagged_and_properties_are_not():
    assert set(CONVENTIONS) == {"empty_rows", "scale"} and set(CONVENTIONS) <= set(ALL)
    r = run(attention)
    for res in r:
        assert res.convention == (res.name in CONVENTIONS)
        if res.status != "n/a":
            assert res.line().endswith("[convention]") == res.convention


def test_a_written_out_attention_holds_in_float32_too():
    r = run(attention, dtype=torch.float32)
    assert r.ok and r["sdpa"].tolerance == tolerance(torch.float32) == 1e-5


@pytest.mark.parametrize("kv_heads", [None, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_the_course_module_holds_every_invariant(kv_heads):
    torch.manual_seed(0)
    module = attnbook.MultiHeadAttention(32, 4, num_kv_heads=kv_heads)
    r = run(module)
    assert r.ok, str(r)
    assert {"heads", "cross_attention", "kv_cache", "sdpa", "scale"} <= set(r.held)
    if kv_heads == 2:
        assert "query head h reads key/value head h // 2" in r["heads"].detail
    assert module.training  # the caller's module is not touched (the checker works on an eval copy)


def test_the_course_module_in_float32():
    torch.manual_seed(0)
    r = run(attnbook.MultiHeadAttention(24, 3), dtype=torch.float32)
    assert r.ok and "cross_attention" in r.held and r["cross_attention"].tolerance == 1e-5


def test_a_cross_attention_only_module_is_refused_with_the_shapes():
    # the battery runs self-attention; a module whose keys have another width cannot take that
    with pytest.raises(ValueError, match=r"raised ValueError: key must be \(B, length, 10\).*got \(1, 4, 24\)"):
        check_attention(attnbook.MultiHeadAttention(24, 3, kdim=10, vdim=10))


def test_torch_multihead_attention_through_a_call_adapter_shows_its_nan_rows():
    torch.manual_seed(0)
    H = 4

    def call(module, x, key, value, mask, cache):
        key = x if key is None else key
        value = key if value is None else value
        if mask is not None:  # ours (B, 1, T, S), True = may attend -> (B * H, T, S), True = blocked
            B, _, T, S = mask.shape
            mask = masks.to_blocked(mask).expand(B, H, T, S).reshape(B * H, T, S)
        return module(x, key, value, attn_mask=mask, average_attn_weights=False)

    r = run(nn.MultiheadAttention(32, H, batch_first=True), call=call)
    assert r.violated == ["empty_rows"] and "NaN" in r["empty_rows"].detail
    assert {"sdpa", "heads", "cross_attention", "scale"} <= set(r.held)


class CausalByItself(attnbook.MultiHeadAttention):
    """A decoder layer that builds its own bottom-right causal mask, cache or not."""

    def forward(self, query, key=None, value=None, mask=None, *, need_weights=True, cache=None):
        T = query.shape[1]
        S = T + (len(cache) if cache is not None else 0)
        own = attnbook.causal_mask(T, S, offset=S - T)  # (T, S)
        return super().forward(query, key, value, own, need_weights=need_weights, cache=cache)


def test_a_module_that_masks_by_itself():
    torch.manual_seed(0)
    r = run(CausalByItself(32, 4), causal=True)
    assert r.ok, str(r)
    assert {"sdpa", "causal_leak", "kv_cache", "heads"} <= set(r.held)
    assert {"permutation", "cross_attention", "empty_rows", "causal_alignment"} <= set(r.not_applicable)
    # without causal=True the checker passes masks that the module ignores
    assert "sdpa" in run(CausalByItself(32, 4)).violated


def test_cache_option():
    torch.manual_seed(0)
    module = attnbook.MultiHeadAttention(16, 2)
    assert "kv_cache" in run(module, cache=False).not_applicable
    assert "kv_cache" in run(module, cache=attnbook.KVCache).held
    with pytest.raises(TypeError, match="cache must be None, True, False or a callable"):
        check_attention(module, cache="yes")
    with pytest.raises(ValueError, match="takes no `cache` argument"):
        check_attention(nn.MultiheadAttention(16, 2, batch_first=True), cache=True)


def test_call_adapts_a_function_with_another_signature():
    r = run(F.scaled_dot_product_attention, call=lambda fn, q, k, v, mask: fn(q, k, v, attn_mask=mask))
    assert r.ok and "sdpa" in r.held


def test_pytorch_sdpa_itself():
    r = run(lambda q, k, v, mask=None: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert "weights" in r.not_applicable  # it returns no weights
    assert {"sdpa", "causal_leak", "padding", "scale", "heads", "low_precision"} <= set(r.held)


@pytest.mark.parametrize("convention", ["blocked", "additive", "key_padding", "hf"])
def test_other_mask_conventions_hold_when_declared(convention):
    def in_convention(q, k, v, mask=None):
        if mask is None:
            return attention(q, k, v)
        if convention == "blocked":
            return attention(q, k, v, ~mask)
        if convention == "additive":
            return attnbook.scaled_dot_product_attention(q, k, v, mask)
        if convention == "key_padding":
            return attention(q, k, v, masks.from_key_padding_mask(mask))
        return attention(q, k, v, masks.from_hf_attention_mask(mask))

    r = run(in_convention, mask_convention=convention)
    assert r.ok, str(r)
    if convention in ("key_padding", "hf"):  # padding only: no causal mask can be expressed
        assert "causal_leak" in r.not_applicable and "padding" in r.held


def test_a_callable_mask_convention_gets_the_mask_expanded_to_b_1_t_s():
    shapes = []

    def convert(mask):
        shapes.append(tuple(mask.shape))
        return mask.float()  # 1.0 = may attend, a made-up convention

    r = run(lambda q, k, v, mask=None: attention(q, k, v, None if mask is None else mask > 0.5),
            mask_convention=convert)
    assert r.ok and shapes and all(len(s) == 4 and s[1] == 1 for s in shapes)


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_causal_functions_and_their_alignment_are_found(alignment):
    def causal(q, k, v):
        T, S = q.shape[-2], k.shape[-2]
        return attention(q, k, v, causal_mask(T, S, offset=S - T if alignment == "bottom-right" else 0))

    r = run(causal, causal=alignment)
    assert r.ok and alignment in r["causal_alignment"].detail
    either = run(causal, causal=True)
    assert either.ok and alignment in either["causal_alignment"].detail
    other = "top-left" if alignment == "bottom-right" else "bottom-right"
    wrong = run(causal, causal=other)
    assert wrong.violated == ["sdpa", "causal_alignment"]
    assert f"declared {other}" in wrong["causal_alignment"].detail


def test_is_causal_is_top_left_like_causal_upper_left():
    r = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), causal=True)
    assert "top-left" in r["causal_alignment"].detail and "causal_leak" in r.held


def test_grouped_query_attention_done_right():
    def gqa(q, k, v, mask=None):
        G = q.shape[1] // k.shape[1]
        return attention(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1), mask)

    r = run(gqa, groups=3)
    assert r.ok and "h // 3" in r["heads"].detail


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_functions_hold_with_their_pairing_and_fail_with_the_other(interleaved):
    def rope(q, k, v, mask=None):
        q, k = (attnbook.apply_rotary(t, interleaved=interleaved) for t in (q, k))
        return attention(q, k, v, mask)

    mine, other = ("interleaved", "half-split") if interleaved else ("half-split", "interleaved")
    assert run(rope, rope=mine).ok
    wrong = run(rope, rope=other)
    assert wrong.violated == ["sdpa", "rope"] and f"{mine}; the weights are {other}" in wrong["rope"].detail


def test_alibi_with_the_reference_slopes_holds():
    def alibi(q, k, v, mask=None):
        H, T, S = q.shape[1], q.shape[-2], k.shape[-2]
        return attention(q, k, v, mask, bias=attnbook.alibi_bias(H, T, S, causal=False, dtype=q.dtype))

    r = run(alibi, alibi=True)
    assert r.ok and r["alibi"].measured < 1e-6


# ---------------------------------------------------------------------------
# The bug zoo: each bug violates the invariants that name it, and only those
# ---------------------------------------------------------------------------


class WidthScaled(attnbook.MultiHeadAttention):
    def attend(self, q, k, v, mask=None, need_weights=True):
        out, w = attnbook.scaled_dot_product_attention(q, k, v, mask, scale=1 / math.sqrt(self.d_model))
        return self.out_proj(attnbook.merge_heads(out)), w


class ViewSplit(attnbook.MultiHeadAttention):
    def project(self, query, key=None, value=None):
        key = query if key is None else key
        value = key if value is None else value
        shape = (query.shape[0], self.num_heads, -1, self.head_dim)  # view without transpose
        return self.q_proj(query).view(shape), self.k_proj(key).view(shape), self.v_proj(value).view(shape)


class QueryLengthReshape(attnbook.MultiHeadAttention):
    def project(self, query, key=None, value=None):
        key = query if key is None else key
        value = key if value is None else value
        B, T, _ = query.shape
        split = (B, T, self.num_heads, self.head_dim)  # T, the query's length, also for keys and values
        return tuple(p(x).view(split).transpose(1, 2) for p, x in
                     ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))


def inverted(q, k, v, mask=None):
    return attention(q, k, v, None if mask is None else ~mask)


def fill_1e9(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    w = torch.softmax(scores, dim=-1)
    return w @ v, w


def fill_inf(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return w @ v, w


def softmax_axis(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    w = torch.softmax(scores, dim=2)  # the query axis of (B, H, T, S)
    if mask is not None:
        w = w.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return w @ v, w


def top_left(q, k, v):
    return attention(q, k, v, torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril())


def gqa_repeat(q, k, v, mask=None):
    G = q.shape[1] // k.shape[1]
    return attention(q, k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1), mask)


def padding_over_queries(q, k, v, mask=None):
    return attention(q, k, v, None if mask is None else mask.bool()[:, None, :, None])


def rope_half_split(q, k, v, mask=None):
    q, k = (attnbook.apply_rotary(t, interleaved=False) for t in (q, k))
    return attention(q, k, v, mask)


def alibi_naive(q, k, v, mask=None):
    H, T, S = q.shape[1], q.shape[-2], k.shape[-2]
    slopes = 2.0 ** (-8 * torch.arange(1, H + 1, dtype=torch.float64) / H)
    distance = (torch.arange(T)[:, None] + S - T - torch.arange(S)[None, :]).abs()
    return attention(q, k, v, mask, bias=(-slopes[:, None, None] * distance).to(q.dtype))


def dropout_on(q, k, v, mask=None):
    out, w = attention(q, k, v, mask)
    w = F.dropout(w, p=0.1)  # F.dropout's training defaults to True
    return w @ v, w


def forgotten_rescale(q, k, v, mask=None):
    """A tiled kernel with tiles of 64 keys that never rescales what it summed against an older max."""
    return online_softmax_attention(q, k, v, mask, block_size=64, rescale=False)


def no_row_max(q, k, v, mask=None):
    """softmax written as exp / sum without subtracting the row's maximum: exp(89) is inf in float32."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    e = scores.exp()
    if mask is not None:
        e = e.masked_fill(~mask, 0.0)
    w = e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return w @ v, w


def global_max(q, k, v, mask=None):
    """Subtracts one maximum over the whole tensor instead of each row's: rows far below it underflow."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = (scores - scores.max()).exp()
    if mask is not None:
        e = e.masked_fill(~mask, 0.0)
    w = e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return w @ v, w


def last_64_keys(q, k, v, mask=None):
    """A sliding window left on: only the last 64 keys (a rolling 64-entry cache) are attended."""
    k, v = k[:, :, -64:], v[:, :, -64:]
    return attention(q, k, v, None if mask is None else mask[..., -64:])


def view_on_transposed(q, k, v, mask=None):
    """Flattens (B, H) with .view, which needs contiguous inputs: raises on a transposed view."""
    B, H, T, D = q.shape
    S = k.shape[-2]
    out, _ = attention(q.view(B * H, T, D), k.view(B * H, S, D), v.view(B * H, S, v.shape[-1]),
                       None if mask is None else mask.expand(B, H, T, S).reshape(B * H, T, S))
    return out.view(B, H, T, -1)


def raw_memory(q, k, v, mask=None):
    """Reads each tensor's memory as if it were contiguous, as a C kernel that takes data_ptr() does:
    silently wrong on a transposed view."""
    def as_if_contiguous(t):
        return t.as_strided(t.shape, torch.empty(t.shape).stride())
    return attention(as_if_contiguous(q), as_if_contiguous(k), as_if_contiguous(v), mask)


def acc_like_q(q, k, v, mask=None):
    """Allocates the output like q: fine while Dv == D."""
    return online_softmax_attention(q, k, v, mask, acc_like_q=True)


def scale_of_v(q, k, v, mask=None):
    """Takes the scale from the values' width: right while Dv == D."""
    return attnbook.scaled_dot_product_attention(q, k, v, mask, scale=v.shape[-1] ** -0.5)


class SlidingWindow(attnbook.MultiHeadAttention):
    """A module with a sliding window of 64 left on (|i - j| <= 64, as a config's sliding_window would)."""

    def attend(self, q, k, v, mask=None, need_weights=True):
        T, S = q.shape[-2], k.shape[-2]
        window = attnbook.sliding_window_mask(T, 64, S)  # (T, S)
        return super().attend(q, k, v, window if mask is None else mask & window, need_weights)


class RollingKVCache(attnbook.KVCache):
    """Mistral's rolling buffer without a sliding window in the model: keeps only the last 64 tokens."""

    def append(self, k, v):
        k, v = super().append(k, v)
        self.k, self.v = k[:, :, -64:], v[:, :, -64:]
        return k, v


class NoRowMaxModule(attnbook.MultiHeadAttention):
    def attend(self, q, k, v, mask=None, need_weights=True):
        out, w = no_row_max(q, k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1),
                            v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1), mask)
        return self.out_proj(attnbook.merge_heads(out)), w


class FlattensWithView(attnbook.MultiHeadAttention):
    """Projects x.view(B * T, E): needs a contiguous x."""

    def project(self, query, key=None, value=None):
        B, T, E = query.shape
        flat = query.view(B * T, E)  # (B T, E)
        return super().project(flat.view(B, T, E), key, value)


def tile_loop_off_by_one(q, k, v, mask=None):
    """A tiled loop bounded by S - 1 instead of S (tiles of 512 keys): every length has its keys in the one tile
    it runs, except a single key, for which it runs none and returns zeros."""
    S = k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    for c in range(0, S - 1, 512):
        tile = mask if mask is None else mask[..., c:c + 512]
        out = out + attnbook.scaled_dot_product_attention(q, k[:, :, c:c + 512], v[:, :, c:c + 512], tile,
                                                          scale=scale)[0]
    return out


class MaskDroppedForOneQuery(attnbook.MultiHeadAttention):
    """A decoding shortcut: "one new token may see every key", so the mask is dropped when T = 1. Right for a
    causal cache, wrong for a padded memory in cross-attention (the first token an encoder-decoder writes)."""

    def attend(self, q, k, v, mask=None, need_weights=True):
        return super().attend(q, k, v, None if q.shape[2] == 1 else mask, need_weights)


def _module(cls):
    torch.manual_seed(0)
    return cls(32, 4)


BUGS = {
    "scale by sqrt(d_model)": (lambda: _module(WidthScaled), {}, ["sdpa", "scale"]),
    "view without transpose": (lambda: _module(ViewSplit), {},
                               ["sdpa", "permutation", "causal_leak", "padding", "heads", "cross_attention",
                                "kv_cache"]),
    "inverted bool mask": (lambda: inverted, {}, ["sdpa", "causal_leak", "padding", "empty_rows"]),
    "-1e9 fill": (lambda: fill_1e9, {}, ["low_precision", "empty_rows"]),
    "-inf fill": (lambda: fill_inf, {}, ["empty_rows"]),
    "softmax over the query axis": (lambda: softmax_axis, {}, ["sdpa", "weights", "causal_leak", "padding"]),
    "top-left causal mask with a cache": (lambda: top_left, {"causal": "bottom-right"}, ["sdpa", "causal_alignment"]),
    "GQA with repeat": (lambda: gqa_repeat, {"groups": 4}, ["sdpa", "heads"]),
    "padding broadcast over queries": (lambda: padding_over_queries, {"mask_convention": "hf"},
                                       ["sdpa", "weights", "padding"]),
    "RoPE pairing": (lambda: rope_half_split, {"rope": "interleaved"}, ["sdpa", "rope"]),
    "ALiBi slopes": (lambda: alibi_naive, {"alibi": True}, ["sdpa", "alibi"]),
    "dropout left on": (lambda: dropout_on, {},
                        ["sdpa", "weights", "permutation", "low_precision", "heads", "deterministic"]),
    "query length for keys": (lambda: _module(QueryLengthReshape), {}, ["cross_attention"]),
    # the blind spots of short, order-one, contiguous inputs: each one only on its new line
    "forgotten rescale": (lambda: forgotten_rescale, {}, ["long_keys"]),
    "forgotten rescale, causal": (lambda: lambda q, k, v: forgotten_rescale(q, k, v, causal_mask(q.shape[-2], k.shape[-2])),
                                  {"causal": "top-left"}, ["long_keys"]),
    "no row max": (lambda: no_row_max, {}, ["large_logits"]),
    "one max for the whole tensor": (lambda: global_max, {}, ["large_logits"]),
    "no row max in a module": (lambda: _module(NoRowMaxModule), {}, ["large_logits"]),
    "last 64 keys": (lambda: last_64_keys, {}, ["long_keys"]),
    "sliding window module": (lambda: _module(SlidingWindow), {}, ["long_keys"]),
    "rolling 64-entry cache": (lambda: _module(attnbook.MultiHeadAttention), {"cache": RollingKVCache},
                               ["long_keys"]),
    ".view on a transposed tensor": (lambda: view_on_transposed, {}, ["layout"]),
    "raw memory as contiguous": (lambda: raw_memory, {}, ["layout"]),
    # the cache line feeds it slices x[:, 3:5] of the sequence, views too
    "module flattens x with .view": (lambda: _module(FlattensWithView), {}, ["kv_cache", "layout"]),
    # a single query or key: decoding, one-token inputs, one memory token
    "tile loop to S - 1": (lambda: tile_loop_off_by_one, {}, ["sdpa"]),
    "mask dropped for one query": (lambda: _module(MaskDroppedForOneQuery), {}, ["cross_attention"]),
    "output allocated like q": (lambda: acc_like_q, {}, ["value_dim"]),
    "scale from the values' width": (lambda: scale_of_v, {}, ["value_dim"]),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_each_bug_violates_exactly_its_invariants(bug):
    make, kw, expected = BUGS[bug]
    r = run(make(), **kw)
    assert r.violated == expected, str(r)
    for name in expected:
        assert "violated" in r[name].line()


def test_the_diagnoses_say_what_went_wrong():
    r = run(_module(WidthScaled))
    assert r["scale"].measured == pytest.approx(0.5, abs=1e-6) and "1/sqrt(d_model)" in r["scale"].detail
    r = run(fill_1e9)
    assert "float16: raised RuntimeError" in r["low_precision"].detail
    assert "max |output| on empty rows = " in r["empty_rows"].detail
    assert "NaN in 2 of 2 empty rows" in run(fill_inf)["empty_rows"].detail
    assert "h % 4, not h // 4" in run(gqa_repeat, groups=4)["heads"].detail
    assert "top-left" in run(top_left, causal="bottom-right")["causal_alignment"].detail
    assert "8 heads right; 12 heads:" in run(alibi_naive, alibi=True)["alibi"].detail
    assert "differ" in run(dropout_on)["deterministic"].detail
    assert "raised RuntimeError" in run(_module(QueryLengthReshape))["cross_attention"].detail
    assert re.search(r"\(worst on q \(B=\d, H=\d, T=\d, D=\d\), S=1\)", run(tile_loop_off_by_one)["sdpa"].detail)
    assert "at T = 1, S = 7, key padding" in run(_module(MaskDroppedForOneQuery))["cross_attention"].detail


def test_the_short_lines_reach_a_single_query_and_a_single_key():
    r = run(attnbook.scaled_dot_product_attention)
    assert "8 cases" in r["sdpa"].detail or "16 cases" in r["sdpa"].detail, r["sdpa"].detail
    m = run(_module(attnbook.MultiHeadAttention))
    assert "T = 1, S = 7; T = 4, S = 1" in m["cross_attention"].detail
    assert "from one token" in m["kv_cache"].detail


def test_the_blind_spot_diagnoses_say_what_went_wrong():
    r = run(forgotten_rescale)["long_keys"]
    assert re.fullmatch(r"max \|diff\| = [\d.]+ at T = \d+, S = \d+", r.detail) and r.measured > 0.1
    assert "not finite (NaN or inf)" in run(no_row_max)["large_logits"].detail
    assert "max |diff| to the float64 reference ~ " in run(global_max)["large_logits"].detail
    assert "at decoding after 199 cached tokens" in run(_module(attnbook.MultiHeadAttention),
                                                        cache=RollingKVCache)["long_keys"].detail
    r = run(view_on_transposed)["layout"]
    assert "raised RuntimeError: view size is not compatible" in r.detail and "(B, T, H, D) transposed" in r.detail
    assert "max |diff| to contiguous copies = " in run(raw_memory)["layout"].detail
    assert "raised RuntimeError" in run(acc_like_q)["value_dim"].detail
    # without the flags, the same code is right on every line
    assert run(lambda q, k, v, mask=None: online_softmax_attention(q, k, v, mask, block_size=64)).ok


def test_the_new_lines_wait_for_the_first_line():
    r = run(dropout_on)  # wrong on short inputs already, and different at every call
    for name in ("long_keys", "large_logits", "value_dim"):
        assert r[name].status == "n/a" and "see the first line" in r[name].detail
    assert r["layout"].status == "n/a" and "see deterministic" in r["layout"].detail
    r = run(gqa_repeat, groups=4)
    assert r.violated == ["sdpa", "heads"] and r["long_keys"].status == "n/a"
    r = run(F.scaled_dot_product_attention)  # takes attn_mask=, not mask=: the masked calls raise
    assert "sdpa" in r.violated and r["layout"].status == "n/a" and "contiguous inputs too" in r["layout"].detail
    # a module whose short cached decoding already fails is the cache line's, not the long line's
    r = run(_module(FlattensWithView))
    assert r["kv_cache"].violated and "decoding after" not in r["long_keys"].detail


def test_fixing_the_declaration_fixes_the_inverted_mask():
    assert run(inverted, mask_convention="blocked").ok


def test_the_report_prints_one_line_per_invariant_with_its_words(capsys):
    r = check_attention(fill_inf)
    printed = capsys.readouterr().out
    assert printed.strip() == str(r)
    for res in r:
        if res.status != "n/a":
            assert res.title in printed and res.status in ("held", "violated")
    assert printed.count(" held (") == len(r.held) and printed.count(" violated (") == 1
    assert "=> 1 of 14 violated: empty_rows" in printed
    assert printed.count("[convention]") == 2 and "NaN in 2 of 2 empty rows)  [convention]" in printed
    assert isinstance(r, AttentionReport) and not r.ok
    assert printed.startswith("check_attention(fill_inf)")
    assert str(run(fill_inf, name="fill with -inf")).startswith("check_attention(fill with -inf)")
    with pytest.raises(KeyError, match="no invariant 'nope'"):
        r["nope"]


def test_the_report_is_reproducible_and_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b = str(run(dropout_on)), str(run(dropout_on))
    assert a == b
    assert torch.equal(torch.get_rng_state(), state)


def test_tolerances_are_dtype_aware():
    assert [tolerance(d) for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)] == \
        [1e-10, 1e-5, 1e-2, 5e-2]
    with pytest.raises(TypeError, match="int64"):
        tolerance(torch.int64)
    loose = run(lambda q, k, v, mask=None: attention(q.float(), k.float(), v.float(), mask)[0].double(),
                tolerance=1e-5)
    assert "sdpa" in loose.held
    tight = run(lambda q, k, v, mask=None: attention(q.float(), k.float(), v.float(), mask)[0].double())
    assert "sdpa" in tight.violated  # float32 rounding is more than float64's 1e-10
    assert tight["scale"].held and "fitted" in tight["scale"].detail  # but the scale is the right one


# ---------------------------------------------------------------------------
# Bad input: clear errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, words", [
    # the right type, a value that makes no sense: ValueError
    ({"causal": "diagonal"}, ValueError, "'diagonal'"),
    ({"mask_convention": "ones"}, ValueError, "'ones'"),
    ({"groups": 0}, ValueError, "groups (query heads per key/value head) must be an int >= 1, got 0"),
    ({"rope": "neox"}, ValueError, "'neox'"),
    ({"rope_base": 1}, ValueError, "rope_base must be > 1, got 1"),
    ({"dtype": torch.float16}, ValueError, "torch.float16"),
    ({"tolerance": -1.0}, ValueError, "tolerance must be positive, got -1.0"),
    ({"tolerance": 0}, ValueError, "tolerance must be positive, got 0"),
    ({"seed": -2}, ValueError, "seed must be an int >= 0, got -2"),
    # the wrong type: TypeError
    ({"groups": 2.0}, TypeError, "groups (query heads per key/value head) must be an int, got float 2.0"),
    ({"groups": True}, TypeError, "groups (query heads per key/value head) must be an int, got bool"),
    ({"rope_base": "10000"}, TypeError, "rope_base must be a number, got '10000'"),
    ({"rope_base": True}, TypeError, "rope_base must be a number, got True"),
    ({"dtype": "float64"}, TypeError, "dtype must be a torch.dtype, got 'float64'"),
    ({"dtype": float}, TypeError, "dtype must be a torch.dtype"),
    ({"tolerance": "1e-6"}, TypeError, "tolerance must be a number, got '1e-6'"),
    ({"tolerance": True}, TypeError, "tolerance must be a number, got True"),
    ({"seed": 1.5}, TypeError, "seed must be an int, got float 1.5"),
    ({"seed": "0"}, TypeError, "seed must be an int, got str"),
    ({"call": 3}, TypeError, "int"),
])
def test_bad_options_raise_clear_errors(kwargs, error, words):
    with pytest.raises(error, match=re.escape(words)):
        check_attention(attention, verbose=False, **kwargs)
    assert set(MASK_CONVENTIONS) >= {"allowed", "blocked", "additive", "key_padding", "hf"}


def test_not_a_function_is_a_type_error():
    with pytest.raises(TypeError, match="got Tensor"):
        check_attention(torch.ones(3))


def test_module_options_that_describe_functions_are_refused():
    with pytest.raises(ValueError, match="rope="):
        check_attention(attnbook.MultiHeadAttention(8, 2), rope="interleaved")
    with pytest.raises(ValueError, match="groups="):
        check_attention(attnbook.MultiHeadAttention(8, 2), groups=2)


def test_wrong_outputs_and_conventions_are_named():
    with pytest.raises(ValueError, match=r"output \(1, 2, 4\) for q \(1, 2, 4, 8\).*expected \(B, H, T, D\)"):
        check_attention(lambda q, k, v, mask=None: q.sum(-1), verbose=False)
    with pytest.raises(TypeError, match="must return the output tensor or .output, weights., got str"):
        check_attention(lambda q, k, v, mask=None: "out", verbose=False)
    with pytest.raises(ValueError, match="calling convention"):
        check_attention(lambda q, k: q, verbose=False)
    with pytest.raises(ValueError, match="cannot tell the module's width"):
        check_attention(nn.Linear(4, 4), verbose=False)


# ---------------------------------------------------------------------------
# The converters in attnbook.masks that the conventions appendix uses
# ---------------------------------------------------------------------------


def test_hf_attention_mask_round_trip_and_shapes():
    hf = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    ours = masks.from_hf_attention_mask(hf)
    assert ours.shape == (2, 1, 1, 4) and torch.equal(ours, padding_mask([3, 2], 4))
    assert torch.equal(masks.to_hf_attention_mask(ours), hf) and masks.to_hf_attention_mask(ours).dtype == torch.int64
    assert torch.equal(masks.to_hf_attention_mask(ours[:, 0, 0]), hf)
    assert torch.equal(masks.from_hf_attention_mask(hf.bool()), ours)


def test_hf_causal_mask_is_bottom_right_and_padded():
    hf = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # left padding
    m = masks.from_hf_attention_mask(hf, 2, causal=True)  # the last 2 of 5 positions
    assert m.shape == (2, 1, 2, 5)
    assert torch.equal(m[0, 0], causal_mask(2, 5, offset=3))
    assert torch.equal(m[1, 0], causal_mask(2, 5, offset=3) & hf[1].bool())


def test_hf_causal_mask_equals_transformers_eager_mask():
    masking_utils = pytest.importorskip("transformers.masking_utils")
    hf = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    for T in (6, 2, 1):
        theirs = masking_utils.eager_mask(batch_size=2, q_length=T, kv_length=6, q_offset=6 - T,
                                          attention_mask=hf.bool(), dtype=torch.float16)
        ours = masks.to_additive(masks.from_hf_attention_mask(hf, T, causal=True), torch.float16)
        assert torch.equal(theirs, ours)


def test_hf_mask_errors_name_the_problem():
    with pytest.raises(TypeError, match="float32"):
        masks.from_hf_attention_mask(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"only 0 and 1, got values \[0, 1, 2\]"):
        masks.from_hf_attention_mask(torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match=r"\(B, S\), got shape \(3,\)"):
        masks.from_hf_attention_mask(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="T=4 queries cannot be the last T of S=3"):
        masks.from_hf_attention_mask(torch.ones(1, 3, dtype=torch.long), 4, causal=True)
    with pytest.raises(ValueError, match="T is only used with causal=True"):
        masks.from_hf_attention_mask(torch.ones(1, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"got shape \(1, 2, 3, 3\)"):
        masks.to_hf_attention_mask(torch.ones(1, 2, 3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="int64"):
        masks.to_hf_attention_mask(torch.ones(1, 3, dtype=torch.long))


@pytest.mark.parametrize("T, S", [(3, 7), (4, 4), (1, 5), (5, 2)])
def test_from_causal_bias_matches_pytorch(T, S):
    with pytest.warns(UserWarning) if T > S else _no_warning():
        lower = causal_lower_right(T, S)
    assert torch.equal(masks.from_causal_bias(causal_upper_left(T, S)), causal_upper_left(T, S)._materialize())
    assert torch.equal(masks.from_causal_bias(lower), lower._materialize())
    assert torch.equal(masks.from_causal_bias(lower), causal_mask(T, S, offset=S - T))
    with pytest.raises(TypeError, match="CausalBias, got Tensor"):
        masks.from_causal_bias(causal_mask(T, S))


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
