"""Attention dimensions of a transformers config, read the one way transformers reads them."""

from __future__ import annotations


def attention_dims(config) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim), with the defaults transformers applies when a
    config leaves the last two out (no GQA; hidden_size split evenly over the heads)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return heads, kv_heads, getattr(config, "head_dim", None) or config.hidden_size // heads
