"""attnbook.shared_kv: Gemma 4's cross-layer KV sharing equal to transformers' Gemma4TextModel with copied weights
(tiny random configs, eager, CPU): every attention layer, fed the input the model's own attention layer saw, gives
its output, in a prefill below, at and past the sliding window, with left padding, and decoding after a prefix
through the caches (the sharing layers reading their source layer's cache); the sources; the errors."""

import pytest
import torch

from attnbook import KVCache
from attnbook.configs import GEMMA_4_E4B
from attnbook.shared_kv import (
    SharedKVAttention,
    SharedKVCache,
    SharedKVStack,
    kv_sharing_sources,
    proportional_rope_frequencies,
)

T_ = pytest.importorskip("transformers", reason="transformers (test-only) is the reference")
G4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4", reason="this transformers has no gemma4")

TYPES = ["sliding_attention", "full_attention"] * 3
WINDOW = 4


def _model(layer_types=TYPES, num_kv_shared_layers=3, seed=0, **extra):
    torch.manual_seed(seed)
    cfg = T_.Gemma4TextConfig(vocab_size=32, hidden_size=32, intermediate_size=16,
                              num_hidden_layers=len(layer_types), num_attention_heads=4, num_key_value_heads=2,
                              head_dim=8, global_head_dim=16, sliding_window=WINDOW, layer_types=list(layer_types),
                              num_kv_shared_layers=num_kv_shared_layers, hidden_size_per_layer_input=4,
                              vocab_size_per_layer_input=32, max_position_embeddings=64, **extra)
    cfg._attn_implementation = "eager"
    model = G4.Gemma4TextModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # transformers leaves the norms at 1: randomise every weight
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return model


class _Recorder:
    """Each call's input and output of every attention layer of a Gemma4TextModel."""

    def __init__(self, model):
        self.calls = {}
        for i, layer in enumerate(model.layers):
            layer.self_attn.register_forward_hook(self._hook(i), with_kwargs=True)

    def _hook(self, i):
        def record(module, args, kwargs, out):
            self.calls.setdefault(i, []).append((kwargs["hidden_states"].detach(), out[0].detach()))
        return record

    def step(self, k):
        """The inputs and outputs of the k-th call of every layer."""
        n = len(self.calls)
        return [self.calls[i][k][0] for i in range(n)], [self.calls[i][k][1] for i in range(n)]


def _run(ours, inputs, **kw):
    with torch.no_grad():
        return ours(inputs[0], next_input=lambda i, h, out: inputs[i + 1], **kw)


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_sources_match_transformers_kv_sharing_modes():
    model = _model()
    modes = model.config.kv_sharing_modes
    sources = kv_sharing_sources(TYPES, 3)
    assert sources == [None, None, None, 1, 2, 1]
    assert modes == [None, "store", "store", "reuse", "reuse", "reuse"]
    assert sorted({s for s in sources if s is not None}) == [i for i, m in enumerate(modes) if m == "store"]
    # Gemma 4 E4B: 42 layers, five local to one global, the last 18 sharing layers 22 (local) and 23 (global)
    e4b = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(42)]
    got = kv_sharing_sources(e4b, 18)
    assert got[:24] == [None] * 24
    assert got[24:] == [23 if e4b[i] == "full_attention" else 22 for i in range(24, 42)]
    assert sum(s is not None for s in got) == GEMMA_4_E4B.count("shared") == 18


def test_copied_weights_match_state_dict():
    model = _model()
    ours = SharedKVStack.from_hf(model)
    for i, layer in enumerate(model.layers):
        theirs = {k: v for k, v in layer.self_attn.state_dict().items()}
        mine = ours.layers[i].state_dict()
        assert set(mine) == set(theirs), i  # a sharing layer has no k_proj, v_proj, k_norm
        for k in theirs:
            assert torch.equal(mine[k], theirs[k])
    assert [layer.kv_shared for layer in ours.layers] == [False] * 3 + [True] * 3


@pytest.mark.parametrize("T", [3, WINDOW, 9])
def test_equals_transformers_prefill(T):
    """Below, at and past the sliding window: every layer's output, sharing layers included."""
    model = _model()
    rec = _Recorder(model)
    ours = SharedKVStack.from_hf(model)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 32, (2, T)))
    inputs, expected = rec.step(0)
    got = _run(ours, inputs)
    for i in range(6):
        torch.testing.assert_close(got[i], expected[i], atol=1e-5, rtol=1e-5)


def test_sharing_layers_read_their_source():
    """The control: a sharing layer handed another layer's keys and values (or its own input's) gives another
    output, so the equality above rests on reading the right layer."""
    model = _model()
    rec = _Recorder(model)
    ours = SharedKVStack.from_hf(model)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 32, (1, 9)))
    inputs, expected = rec.step(0)
    with torch.no_grad():
        kv = {i: ours.layers[i](inputs[i])[2] for i in (0, 1, 2)}
        right, _, _ = ours.layers[4](inputs[4], shared_kv=kv[2])  # layer 4 (sliding) reads layer 2
        wrong, _, _ = ours.layers[4](inputs[4], shared_kv=kv[0])  # the first sliding layer instead
    torch.testing.assert_close(right, expected[4], atol=1e-5, rtol=1e-5)
    assert _rel(wrong, expected[4]) > 1e-2


def test_equals_transformers_with_left_padding():
    model = _model()
    rec = _Recorder(model)
    ours = SharedKVStack.from_hf(model)
    T = 9
    keep = torch.ones(2, T, dtype=torch.long)
    keep[1, :3] = 0  # the second sequence is left-padded by 3
    with torch.no_grad():
        model(input_ids=torch.randint(0, 32, (2, T)), attention_mask=keep)
    inputs, expected = rec.step(0)
    got = _run(ours, inputs, mask=keep.bool()[:, None, None, :])
    for i in range(6):
        torch.testing.assert_close(got[i][0], expected[i][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[i][1, 3:], expected[i][1, 3:], atol=1e-5, rtol=1e-5)  # the real tokens


@pytest.mark.parametrize("prefix", [3, 6])
def test_decoding_after_a_prefix(prefix):
    """A prefix, then three tokens one at a time through transformers' DynamicCache and our SharedKVCache
    (positions offset by the cache's length, the sliding layers past their window): every layer's output of
    every step equal; only the three layers that compute keys and values cache them."""
    model = _model()
    rec = _Recorder(model)
    ours = SharedKVStack.from_hf(model)
    ids = torch.randint(0, 32, (2, prefix + 3))
    hf_cache = T_.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :prefix], cache=hf_cache, use_cache=True)
        for t in range(prefix, prefix + 3):
            model(input_ids=ids[:, t : t + 1], cache=hf_cache, use_cache=True)
    cache = ours.new_cache()
    for k in range(4):
        inputs, expected = rec.step(k)
        got = _run(ours, inputs, cache=cache)
        for i in range(6):
            torch.testing.assert_close(got[i], expected[i], atol=1e-5, rtol=1e-5)
    assert len(cache) == prefix + 3
    assert [c is None for c in cache.layers] == [False] * 3 + [True] * 3
    # (B, Hkv, S, D) keys and values: two sliding layers of D 8, one full layer of D 16, 4 bytes a number
    assert cache.nbytes == 2 * 2 * (prefix + 3) * 2 * (8 + 16 + 8) * 4


def test_decoding_equals_prefill():
    """Our own consistency: decoding token by token gives the prefill's outputs (attention-only stack)."""
    ours = SharedKVStack.from_hf(_model())
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        whole = ours(x)
        cache = ours.new_cache()
        steps = [ours(x[:, :5], cache=cache)] + [ours(x[:, t : t + 1], cache=cache) for t in range(5, 9)]
    for i in range(6):
        torch.testing.assert_close(torch.cat([s[i] for s in steps], dim=1), whole[i], atol=1e-5, rtol=1e-5)


def test_keys_as_values_equals_transformers():
    """attention_k_eq_v (Gemma 4 31B's global layers): the values are the key projection, its own KV heads."""
    model = _model(num_kv_shared_layers=0, attention_k_eq_v=True, num_global_key_value_heads=1)
    rec = _Recorder(model)
    ours = SharedKVStack.from_hf(model)
    assert [layer.values_from_keys for layer in ours.layers] == [False, True] * 3
    assert ours.layers[1].num_kv_heads == 1 and not hasattr(ours.layers[1], "v_proj")
    with torch.no_grad():
        model(input_ids=torch.randint(0, 32, (2, 7)))
    inputs, expected = rec.step(0)
    got = _run(ours, inputs)
    for i in range(6):
        torch.testing.assert_close(got[i], expected[i], atol=1e-5, rtol=1e-5)


def test_proportional_rope_equals_transformers():
    model = _model()
    hf_freq = model.rotary_emb.full_attention_inv_freq
    ours = proportional_rope_frequencies(16, 1e6, 0.25)
    torch.testing.assert_close(ours.float(), hf_freq, atol=0, rtol=1e-6)
    assert ours.tolist()[2:] == [0.0] * 6  # 2 of 8 pairs rotate


def test_errors():
    ours = SharedKVStack.from_hf(_model())
    x = torch.randn(1, 3, 32)
    with pytest.raises(ValueError, match="pass shared_kv"):
        ours.layers[3](x)
    with pytest.raises(ValueError, match="caches nothing"):
        ours.layers[3](x, cache=KVCache(), shared_kv=ours.layers[1](x)[2])
    with pytest.raises(ValueError, match="shared_kv is for a kv_shared layer"):
        ours.layers[1](x, shared_kv=ours.layers[1](x)[2])
    with pytest.raises(ValueError, match=r"shared_kv's k must be \(B, Hkv, S, D\) = \(1, 2, S >= 3, 16\)"):
        ours.layers[3](x, shared_kv=ours.layers[0](x)[2])  # a sliding layer's keys (D 8) for a full layer (D 16)
    with pytest.raises(TypeError, match="shared_kv must be a \\(k, v\\) tuple"):
        ours.layers[3](x, shared_kv=[1, 2])
    with pytest.raises(TypeError, match="mask must be bool"):
        ours.layers[0](x, torch.zeros(3, 3))
    with pytest.raises(TypeError, match="cache must be a SharedKVCache"):
        ours(x, cache=KVCache())
    with pytest.raises(ValueError, match="cache was made for sources"):
        ours(x, cache=SharedKVCache([None] * 6))
    with pytest.raises(ValueError, match="no layer before layer 2 is a full_attention layer"):
        kv_sharing_sources(["sliding_attention", "sliding_attention", "full_attention"], 1)
    with pytest.raises(ValueError, match=r"num_kv_shared_layers must be an int in \[0, 5\]"):
        kv_sharing_sources(TYPES, 6)
    with pytest.raises(TypeError, match="num_kv_shared_layers must be an int"):
        kv_sharing_sources(TYPES, 2.0)
    with pytest.raises(ValueError, match="is not a layer type"):
        kv_sharing_sources(["global"], 0)
    with pytest.raises(ValueError, match="layer 3 reads layer 0, whose keys differ"):
        SharedKVStack(list(ours.layers), [None, None, None, 0, 2, 1])
    with pytest.raises(ValueError, match="layer 3: kv_shared=True but its source is None"):
        SharedKVStack(list(ours.layers), [None] * 6)
    with pytest.raises(ValueError, match="rope_proportion must be in"):
        proportional_rope_frequencies(16, 1e6, 0.0)
    with pytest.raises(TypeError, match="kv_shared must be a bool"):
        SharedKVAttention(32, 4, kv_shared=1)
    with pytest.raises(ValueError, match="has no sinks"):
        SharedKVAttention(32, 4, sinks=True)
    with pytest.raises(TypeError, match="expects a transformers Gemma4TextAttention"):
        SharedKVAttention.from_hf(torch.nn.Linear(2, 2))
