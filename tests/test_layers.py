"""attnbook.layers against torch.nn.Transformer{Encoder,Decoder}Layer with copied weights."""

import pytest
import torch
import torch.nn as nn

from attnbook import causal_mask, padding_mask
from attnbook.layers import (
    FeedForward,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from attnbook.masks import to_additive

E, H, F_DIM = 16, 4, 32
ATOL = 1e-5


def _torch_enc(norm_first, activation="relu", bias=True):
    return nn.TransformerEncoderLayer(
        E, H, F_DIM, dropout=0.1, activation=activation, batch_first=True, norm_first=norm_first, bias=bias
    ).eval()


def _torch_dec(norm_first, activation="relu"):
    return nn.TransformerDecoderLayer(
        E, H, F_DIM, dropout=0.1, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()


def _randomize_norms(layer):
    # LayerNorms start at weight 1, bias 0: perturb them so a swapped norm would show
    with torch.no_grad():
        for m in layer.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(0.3 * torch.randn_like(m.weight))
                if m.bias is not None:
                    m.bias.add_(0.3 * torch.randn_like(m.bias))
    return layer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch_without_mask(norm_first, activation):
    torch.manual_seed(0)
    ref = _randomize_norms(_torch_enc(norm_first, activation))
    ours = TransformerEncoderLayer.from_torch(ref).eval()
    x = torch.randn(3, 7, E)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch_with_masks(norm_first):
    torch.manual_seed(1)
    ref = _randomize_norms(_torch_enc(norm_first))
    ours = TransformerEncoderLayer.from_torch(ref).eval()
    x = torch.randn(3, 6, E)
    causal = causal_mask(6)  # (T, T) True = may attend
    with torch.no_grad():
        # bool: torch's src_mask is True = blocked
        torch.testing.assert_close(ours(x, causal), ref(x, src_mask=~causal), atol=ATOL, rtol=1e-5)
        # float (additive) masks mean the same thing in both. Compared with torch's
        # reference path: with grad enabled torch skips its eval-mode fused kernel,
        # which returns NaN for an arbitrary float src_mask (torch 2.13).
        for bias in (torch.randn(6, 6), to_additive(causal)):
            with torch.enable_grad():
                expected = ref(x, src_mask=bias).detach()
            torch.testing.assert_close(ours(x, bias), expected, atol=ATOL, rtol=1e-5)
        # padding: our (B, 1, 1, S) True = real token vs torch's key_padding_mask True = padding
        pad = padding_mask([6, 4, 2])
        out, expected = ours(x, pad), ref(x, src_key_padding_mask=~pad[:, 0, 0])
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=1e-5)


def test_encoder_layer_without_bias_matches_torch():
    torch.manual_seed(2)
    ref = _torch_enc(norm_first=True, bias=False)
    ours = TransformerEncoderLayer.from_torch(ref).eval()
    assert ours.ff.linear1.bias is None and ours.norm1.bias is None
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=1e-5)


def test_encoder_layer_from_torch_not_batch_first():
    torch.manual_seed(3)
    ref = nn.TransformerEncoderLayer(E, H, F_DIM, batch_first=False).eval()
    ours = TransformerEncoderLayer.from_torch(ref).eval()
    x = torch.randn(2, 5, E)  # (B, T, E)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x.transpose(0, 1)).transpose(0, 1), atol=ATOL, rtol=1e-5)


def test_from_torch_keeps_training_flag_and_dropout():
    ref = _torch_enc(False).train()
    ours = TransformerEncoderLayer.from_torch(ref)
    assert ours.training
    assert ours.self_attn.dropout == pytest.approx(0.1) and ours.dropout1.p == pytest.approx(0.1)
    assert not TransformerEncoderLayer.from_torch(ref.eval()).training


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_matches_torch(norm_first, activation):
    torch.manual_seed(4)
    ref = _randomize_norms(_torch_dec(norm_first, activation))
    ours = TransformerDecoderLayer.from_torch(ref).eval()
    tgt, memory = torch.randn(3, 5, E), torch.randn(3, 7, E)
    causal = causal_mask(5)
    mem_mask = torch.rand(5, 7) > 0.4
    mem_mask[:, 0] = True
    with torch.no_grad():
        torch.testing.assert_close(ours(tgt, memory), ref(tgt, memory), atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(
            ours(tgt, memory, causal, mem_mask),
            ref(tgt, memory, tgt_mask=~causal, memory_mask=~mem_mask),
            atol=ATOL,
            rtol=1e-5,
        )
        pad = padding_mask([7, 3, 5])  # memory padding (B, 1, 1, S)
        torch.testing.assert_close(
            ours(tgt, memory, causal, pad),
            ref(tgt, memory, tgt_mask=~causal, memory_key_padding_mask=~pad[:, 0, 0]),
            atol=ATOL,
            rtol=1e-5,
        )


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_match_torch(norm_first):
    torch.manual_seed(5)
    final = nn.LayerNorm(E) if norm_first else None
    ref_enc = nn.TransformerEncoder(_torch_enc(norm_first), 2, norm=final, enable_nested_tensor=False).eval()
    ref_dec = nn.TransformerDecoder(_torch_dec(norm_first), 2, norm=nn.LayerNorm(E) if norm_first else None).eval()
    for m in (ref_enc, ref_dec):
        _randomize_norms(m)
    enc, dec = TransformerEncoder.from_torch(ref_enc).eval(), TransformerDecoder.from_torch(ref_dec).eval()
    assert len(enc.layers) == 2 and (enc.norm is None) == (not norm_first)
    src, tgt = torch.randn(2, 6, E), torch.randn(2, 4, E)
    causal = causal_mask(4)
    with torch.no_grad():
        memory = enc(src)
        torch.testing.assert_close(memory, ref_enc(src), atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(
            dec(tgt, memory, causal), ref_dec(tgt, memory, tgt_mask=~causal), atol=ATOL, rtol=1e-5
        )


def test_need_weights_returns_weights_and_same_output():
    torch.manual_seed(6)
    layer = TransformerEncoderLayer(E, H, F_DIM, dropout=0.0).eval()
    x = torch.randn(2, 5, E)
    out, w = layer(x, causal_mask(5), need_weights=True)
    assert w.shape == (2, H, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 5))
    assert torch.all(w.triu(diagonal=1) == 0)  # the causal mask holds
    torch.testing.assert_close(out, layer(x, causal_mask(5)), atol=1e-6, rtol=1e-5)

    dec = TransformerDecoderLayer(E, H, F_DIM, dropout=0.0).eval()
    tgt, mem = torch.randn(2, 3, E), torch.randn(2, 6, E)
    out, w_self, w_cross = dec(tgt, mem, causal_mask(3), need_weights=True)
    assert out.shape == (2, 3, E) and w_self.shape == (2, H, 3, 3) and w_cross.shape == (2, H, 3, 6)
    torch.testing.assert_close(out, dec(tgt, mem, causal_mask(3)), atol=1e-6, rtol=1e-5)

    stack = TransformerDecoder(dec, 3)
    out, ws, wc = stack(tgt, mem, need_weights=True)
    assert len(ws) == len(wc) == 3 and wc[0].shape == (2, H, 3, 6)
    enc_stack = TransformerEncoder(layer, 2)
    out, ws = enc_stack(x, need_weights=True)
    assert out.shape == x.shape and len(ws) == 2


def test_stack_layers_are_independent_copies():
    layer = TransformerEncoderLayer(E, H, F_DIM)
    stack = TransformerEncoder(layer, 2)
    assert stack.layers[0].ff.linear1.weight is not stack.layers[1].ff.linear1.weight
    with torch.no_grad():
        stack.layers[0].ff.linear1.weight.zero_()
    assert stack.layers[1].ff.linear1.weight.abs().sum() > 0


def test_unbatched_input_matches_batched():
    torch.manual_seed(7)
    layer = TransformerEncoderLayer(E, H, F_DIM, dropout=0.0).eval()
    x = torch.randn(5, E)
    torch.testing.assert_close(layer(x), layer(x[None])[0])
    dec = TransformerDecoderLayer(E, H, F_DIM, dropout=0.0).eval()
    tgt, mem = torch.randn(4, E), torch.randn(6, E)
    torch.testing.assert_close(dec(tgt, mem), dec(tgt[None], mem[None])[0])


def test_feedforward():
    torch.manual_seed(8)
    ff = FeedForward(E, F_DIM, activation="gelu")
    x = torch.randn(2, 3, E)
    expected = ff.linear2(torch.nn.functional.gelu(ff.linear1(x)))
    torch.testing.assert_close(ff(x), expected)
    assert ff(x).shape == (2, 3, E)


def test_gradients_flow_through_every_parameter():
    layer = TransformerDecoderLayer(E, H, F_DIM, dropout=0.0, norm_first=True)
    tgt, mem = torch.randn(2, 3, E), torch.randn(2, 4, E)
    layer(tgt, mem, causal_mask(3)).sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


def test_errors():
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(E, F_DIM, activation="tanh")
    with pytest.raises(ValueError, match="dropout"):
        TransformerEncoderLayer(E, H, dropout=1.5)
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        TransformerEncoderLayer(E, 3)
    with pytest.raises(ValueError, match="dim_feedforward"):
        FeedForward(E, 0)
    layer = TransformerEncoderLayer(E, H, F_DIM)
    with pytest.raises(ValueError, match=r"src must be \(B, length, E=16\).*\(2, 5, 8\)"):
        layer(torch.randn(2, 5, 8))
    with pytest.raises(TypeError, match="src must be a torch.Tensor"):
        layer([[0.0] * E])
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(torch.randn(2, 5, E), causal_mask(4))
    dec = TransformerDecoderLayer(E, H, F_DIM)
    with pytest.raises(ValueError, match=r"tgt \(2, 3, 16\) and memory \(3, 4, 16\) must share the batch size"):
        dec(torch.randn(2, 3, E), torch.randn(3, 4, E))
    with pytest.raises(ValueError, match=r"memory must be \(B, length, E=16\)"):
        dec(torch.randn(2, 3, E), torch.randn(2, 4, 5))
    with pytest.raises(TypeError, match="expected torch.nn.TransformerEncoderLayer"):
        TransformerEncoderLayer.from_torch(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="expected torch.nn.TransformerDecoderLayer"):
        TransformerDecoderLayer.from_torch(_torch_enc(False))
    with pytest.raises(ValueError, match="num_layers"):
        TransformerEncoder(layer, 0)
    with pytest.raises(TypeError, match="encoder_layer must be a TransformerEncoderLayer"):
        TransformerEncoder(dec, 2)
