"""attnbook.testing.check_attention: every invariant holds on the course's own attention, and each of the bug
zoo's twelve bugs violates exactly the invariants that name it. Also the mask converters it relies on."""

import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import attnbook
from attnbook import causal_mask, masks, padding_mask
from attnbook.testing import INVARIANTS, MASK_CONVENTIONS, AttentionReport, check_attention, tolerance

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
