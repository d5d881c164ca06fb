"""attnbook.mha.valid_kv_heads: exactly the numbers of key/value heads attnbook.MultiHeadAttention accepts.

(Kept apart from test_mha.py while that file is edited on another branch; it can join it later.)"""

import pytest

import attnbook
from attnbook.mha import valid_kv_heads


def test_valid_kv_heads_are_exactly_what_multihead_attention_accepts():
    assert valid_kv_heads(12) == [1, 2, 3, 4, 6, 12]
    assert valid_kv_heads(1) == [1] and valid_kv_heads(7) == [1, 7]
    for h in range(1, 13):
        if h in valid_kv_heads(12):
            attnbook.MultiHeadAttention(24, 12, num_kv_heads=h)
        else:
            with pytest.raises(ValueError, match="divisor"):
                attnbook.MultiHeadAttention(24, 12, num_kv_heads=h)


def test_bad_head_counts_are_named():
    with pytest.raises(ValueError, match="num_heads must be an int >= 1, got 0"):
        valid_kv_heads(0)
    with pytest.raises(TypeError, match="num_heads must be an int, got float"):
        valid_kv_heads(8.0)
