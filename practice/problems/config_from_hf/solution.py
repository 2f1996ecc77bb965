"""Problem 32: the numbers and switches of a model, from its config.json."""

from __future__ import annotations

from typing import Any


def parse_config(hf: dict[str, Any]) -> dict[str, Any]:
    """architecture, num_layers, num_heads, num_kv_heads, head_dim, rope_theta, rope_scaling,
    tie_word_embeddings, qkv_bias, qk_norm and eos_token_ids, from a Hugging Face config."""
    architecture = (hf.get("architectures") or [hf.get("model_type", "unknown")])[0]
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    eos = hf.get("eos_token_id")
    num_heads = hf["num_attention_heads"]
    return {
        "architecture": architecture,
        "num_layers": hf["num_hidden_layers"],
        "num_heads": num_heads,
        "num_kv_heads": hf.get("num_key_value_heads", num_heads),
        "head_dim": hf.get("head_dim") or hf["hidden_size"] // num_heads,
        "rope_theta": rope_theta,
        "rope_scaling": None if rope_type == "default" else {**rope, "rope_type": rope_type},
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "qkv_bias": architecture == "Qwen2ForCausalLM" or bool(hf.get("attention_bias", False)),
        "qk_norm": architecture == "Qwen3ForCausalLM",
        "eos_token_ids": tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
    }
