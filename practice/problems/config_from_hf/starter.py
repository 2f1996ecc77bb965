"""Problem 32: the numbers and switches of a model, from its config.json."""

from __future__ import annotations

from typing import Any


def parse_config(hf: dict[str, Any]) -> dict[str, Any]:
    """architecture, num_layers, num_heads, num_kv_heads, head_dim, rope_theta, rope_scaling,
    tie_word_embeddings, qkv_bias, qk_norm and eos_token_ids, from a Hugging Face config."""
    raise NotImplementedError("read each field with its default")
