"""attnbook.compressed_attention: DeepSeek-V4's three kinds of attention layer (sliding window, compressed sparse,
heavily compressed) equal to transformers' DeepseekV4Attention inside a tiny random DeepseekV4Model (eager, CPU):
each layer, fed the input the model's own attention layer saw, gives its output, in a prefill below, at and past
the window and the compression rates, and decoding token by token through the caches; the indexer's selection;
the errors."""

import pytest
import torch

from attnbook.compressed_attention import CompressedAttention, CompressedKVCache

T_ = pytest.importorskip("transformers", reason="transformers (test-only) is the reference")
V4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4",
                         reason="this transformers has no deepseek_v4")

KINDS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
WINDOW, CSA_RATE, HCA_RATE, TOPK = 4, 2, 4, 2


def _model(seed=0, index_topk=TOPK):
    torch.manual_seed(seed)
    cfg = T_.DeepseekV4Config(
        vocab_size=32, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
        head_dim=16, q_lora_rank=12, partial_rotary_factor=0.25, layer_types=KINDS,
        compress_rates={"compressed_sparse_attention": CSA_RATE, "heavily_compressed_attention": HCA_RATE},
        sliding_window=WINDOW, o_groups=2, o_lora_rank=6, index_n_heads=4, index_head_dim=8, index_topk=index_topk,
        n_routed_experts=4, num_experts_per_tok=2, hc_mult=2, mlp_layer_types=["moe"] * 3, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    model = V4.DeepseekV4Model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # transformers leaves some at init values: randomise the attention
            if "self_attn" in name:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 and "norm" in name else 0.0))
    calls = {i: [] for i in range(3)}
    for i, layer in enumerate(model.layers):
        layer.self_attn.register_forward_hook(
            lambda mod, args, kwargs, out, i=i: calls[i].append(
                ((args[0] if args else kwargs["hidden_states"]), out[0])), with_kwargs=True)
    return model, calls


@pytest.fixture(scope="module")
def pair():
    model, calls = _model()
    return model, calls, [CompressedAttention.from_hf(layer.self_attn) for layer in model.layers]


def _no_boundary_ties(layer, x):
    """ReLU index scores tie at exactly 0; where a tie straddles the top-k boundary the kept entry is arbitrary."""
    with torch.no_grad():
        indexer = layer.compressor.indexer
        keys = indexer(x)
        T = x.shape[1]
        pos = torch.arange(T)
        scores = indexer.scores(x, layer.q_a_norm(layer.q_a_proj(x)), keys, pos)
    closed = torch.arange(keys.shape[1])[None, :] < ((pos + 1) // CSA_RATE)[:, None]
    if keys.shape[1] <= TOPK:
        return True
    top = scores.masked_fill(~closed, float("-inf")).topk(TOPK + 1, -1).values
    many = closed.sum(-1) > TOPK
    return not bool(((top[..., TOPK - 1] == top[..., TOPK]) & many).any())


def test_copies_every_weight(pair):
    model, _, ours = pair
    for layer, mine in zip(model.layers, ours, strict=True):
        theirs = layer.self_attn.state_dict()
        assert set(mine.state_dict()) == set(theirs)
        for k, v in theirs.items():
            assert torch.equal(mine.state_dict()[k], v)
    assert [m.kind for m in ours] == ["sliding", "csa", "hca"]


@pytest.mark.parametrize("T", [1, 3, WINDOW, 13])
def test_equals_transformers_prefill(pair, T):
    model, calls, ours = pair
    with torch.no_grad():
        model(input_ids=torch.randint(0, 32, (2, T)))
        for i in range(3):
            x, expected = calls[i][-1]
            if i == 1:
                assert _no_boundary_ties(ours[1], x)
            got, _ = ours[i](x)
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prefix", [3, 6])
def test_decoding_after_a_prefix(pair, prefix):
    """A prefix, then 8 tokens one at a time through transformers' cache and ours (past the window, several
    windows of each rate closing): every step's output equal; the window keeps W - 1 tokens, the compressors one
    entry per closed window."""
    model, calls, ours = pair
    ids = torch.randint(0, 32, (2, prefix + 8))
    first = len(calls[0])
    cache = T_.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :prefix], cache=cache, use_cache=True)
        for t in range(prefix, prefix + 8):
            model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
        for i in range(3):
            mine = CompressedKVCache()
            for x, expected in calls[i][first:]:
                got, _ = ours[i](x, cache=mine)
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            total = prefix + 8
            assert len(mine) == total and mine.window.shape[2] == WINDOW - 1
            rate = {1: CSA_RATE, 2: HCA_RATE}.get(i)
            entries = mine.compressor.entries
            assert (entries is None) if rate is None else entries.shape[1] == total // rate


def test_decoding_equals_prefill(pair):
    _, _, ours = pair
    x = torch.randn(2, 11, 32)
    for layer in ours:
        with torch.no_grad():
            whole, _ = layer(x)
            cache = CompressedKVCache()
            parts = [layer(x[:, :3], cache=cache)[0]] + [layer(x[:, t : t + 1], cache=cache)[0] for t in range(3, 11)]
        torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)


def test_keys_read_and_controls(pair):
    """What each kind reads: the window, plus the closed entries (HCA) or the top k of them (CSA); and the
    controls: the compressed entries and the selection change the output."""
    _, _, ours = pair
    x = torch.randn(1, 13, 32)
    with torch.no_grad():
        reads = {}
        for layer in ours:
            _, w = layer(x, need_weights=True)
            reads[layer.kind] = (w[0, 0] > 0).sum(-1).tolist()
        window = [min(t + 1, WINDOW) for t in range(13)]
        assert reads["sliding"] == window
        assert reads["hca"] == [window[t] + (t + 1) // HCA_RATE for t in range(13)]
        assert reads["csa"] == [window[t] + min(TOPK, (t + 1) // CSA_RATE) for t in range(13)]
        csa = ours[1]
        sparse, _ = csa(x)
        csa.index_topk = 64
        dense, _ = csa(x)
        csa.index_topk = TOPK
    assert torch.allclose(sparse[:, : 2 * TOPK + 1], dense[:, : 2 * TOPK + 1], atol=1e-6)  # at most TOPK closed
    assert (sparse - dense).abs().max() > 1e-3


def test_weights_leave_room_for_the_sink(pair):
    _, _, ours = pair
    with torch.no_grad():
        _, w = ours[2](torch.randn(1, 9, 32), need_weights=True)
    sums = w.sum(-1)
    assert bool((sums < 1).all()) and bool((sums > 0).all())


def test_errors(pair):
    _, _, ours = pair
    with pytest.raises(ValueError, match="kind must be one of sliding, csa, hca"):
        CompressedAttention(32, 4, 16, q_lora_rank=12, rope_dim=4, o_groups=2, o_lora_rank=6, sliding_window=4,
                            kind="dense")
    with pytest.raises(ValueError, match="a csa layer needs index_num_heads"):
        CompressedAttention(32, 4, 16, q_lora_rank=12, rope_dim=4, o_groups=2, o_lora_rank=6, sliding_window=4,
                            kind="csa", compress_rate=4)
    with pytest.raises(TypeError, match="compress_rate must be an int"):
        CompressedAttention(32, 4, 16, q_lora_rank=12, rope_dim=4, o_groups=2, o_lora_rank=6, sliding_window=4,
                            kind="hca")
    with pytest.raises(ValueError, match="o_groups=3 must divide num_heads \\* head_dim = 64"):
        CompressedAttention(32, 4, 16, q_lora_rank=12, rope_dim=4, o_groups=3, o_lora_rank=6, sliding_window=4)
    with pytest.raises(ValueError, match="rope_dim must be even"):
        CompressedAttention(32, 4, 16, q_lora_rank=12, rope_dim=3, o_groups=2, o_lora_rank=6, sliding_window=4)
    with pytest.raises(ValueError, match="x must be \\(B, T, 32\\)"):
        ours[0](torch.randn(3, 32))
    with pytest.raises(TypeError, match="cache must be a CompressedKVCache"):
        ours[0](torch.randn(1, 3, 32), cache={})
    with pytest.raises(TypeError, match="expects a transformers DeepseekV4Attention"):
        CompressedAttention.from_hf(torch.nn.Linear(2, 2))
