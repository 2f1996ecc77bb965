"""Problem 33: count the parameters of a Llama / Qwen2 / Qwen3 decoder from its config."""

from __future__ import annotations

from typing import Any


def count_parameters(hf: dict[str, Any]) -> int:
    """Parameters of the decoder described by a Hugging Face config.json dict."""
    architecture = (hf.get("architectures") or [hf.get("model_type", "")])[0]
    hidden, vocab, inter = hf["hidden_size"], hf["vocab_size"], hf["intermediate_size"]
    num_heads = hf["num_attention_heads"]
    num_kv_heads = hf.get("num_key_value_heads", num_heads)
    head_dim = hf.get("head_dim") or hidden // num_heads
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    attention_bias = bool(hf.get("attention_bias", False))
    qkv_bias = architecture == "Qwen2ForCausalLM" or attention_bias
    o_bias = architecture != "Qwen2ForCausalLM" and attention_bias

    attention = hidden * (q + 2 * kv) + q * hidden
    attention += (q + 2 * kv if qkv_bias else 0) + (hidden if o_bias else 0)
    mlp = 3 * hidden * inter
    norms = 2 * hidden + (2 * head_dim if architecture == "Qwen3ForCausalLM" else 0)
    layer = attention + mlp + norms

    embedding = vocab * hidden
    lm_head = 0 if hf.get("tie_word_embeddings", False) else vocab * hidden
    return embedding + hf["num_hidden_layers"] * layer + hidden + lm_head
