"""An input of another dtype than a module's parameters is a TypeError that names the input, its dtype and the
module's (torch's own error, "mat1 and mat2 must have the same dtype" or LayerNorm's "mixed dtype", names
neither), for the modules with parameters that a learner calls directly; the right dtype still runs."""

from __future__ import annotations

import pytest
import torch

from attnbook import LearnedPositionalEmbedding
from attnbook.latent import MultiHeadLatentAttention
from attnbook.layers import TransformerDecoderLayer, TransformerEncoderLayer
from attnbook.llm_attention import LLMAttention

E = 16


def _modules():
    return {
        "MultiHeadLatentAttention": (MultiHeadLatentAttention(E, 2, kv_lora_rank=8, qk_nope_head_dim=8,
                                                              qk_rope_head_dim=4, v_head_dim=8), ("x",)),
        "LLMAttention": (LLMAttention(E, 2), ("x",)),
        "TransformerEncoderLayer": (TransformerEncoderLayer(E, 2, dim_feedforward=32, dropout=0.0,
                                                            norm_first=True), ("src",)),
        "TransformerDecoderLayer": (TransformerDecoderLayer(E, 2, dim_feedforward=32, dropout=0.0), ("tgt", "memory")),
        "LearnedPositionalEmbedding": (LearnedPositionalEmbedding(E, max_len=8), ("x",)),
    }


@pytest.mark.parametrize("name", list(_modules()))
@pytest.mark.parametrize("wrong", [torch.float64, torch.bfloat16])
def test_an_input_of_another_dtype_is_named(name, wrong):
    module, args = _modules()[name]
    module.eval()
    inputs = [torch.randn(2, 5, E) for _ in args]
    with torch.no_grad():
        out = module(*inputs)  # the module's own dtype runs
    out = out[0] if isinstance(out, tuple) else out
    assert out.dtype == torch.float32
    bad = [inputs[0].to(wrong), *inputs[1:]]
    with pytest.raises(TypeError) as err:
        module(*bad)
    message = str(err.value)
    assert f"{args[0]} is {wrong}" in message and "torch.float32" in message and name in message
