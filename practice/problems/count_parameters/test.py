"""Tests of problem 33 (count_parameters). Each expected count is what minisgl's own model
gives for that config (sum of numel over its parameters); the provisioned checkpoints agree."""

import pytest

from submission import count_parameters

SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
}
TINY = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def check(name, hf, expected):
    got = count_parameters(dict(hf))
    assert got == expected, (
        f"count_parameters({name}: {hf}):\nexpected {expected:,}\n"
        f"got      {got:,} (off by {got - expected:+,})"
    )


def test_example_smollm2():
    check("SmolLM2-135M", SMOLLM2, 134_515_008)


def test_tiny_llama_has_an_untied_head():
    check(
        "tiny-llama",
        {**TINY, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False},
        6_365_504,
    )


def test_tiny_qwen2_adds_qkv_biases():
    check(
        "tiny-qwen2",
        {**TINY, "architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": False},
        6_365_760,
    )


def test_tiny_qwen3_adds_head_norms_and_ties():
    check(
        "tiny-qwen3",
        {**TINY, "architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": True},
        3_219_840,
    )


@pytest.mark.parametrize(
    "name, hf, expected",
    [
        (
            "Qwen3-0.6B",
            {
                "architectures": ["Qwen3ForCausalLM"],
                "vocab_size": 151936,
                "hidden_size": 1024,
                "intermediate_size": 3072,
                "num_hidden_layers": 28,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "tie_word_embeddings": True,
            },
            596_049_920,
        ),
        (
            "Qwen2-0.5B",
            {
                "architectures": ["Qwen2ForCausalLM"],
                "vocab_size": 151936,
                "hidden_size": 896,
                "intermediate_size": 4864,
                "num_hidden_layers": 24,
                "num_attention_heads": 14,
                "num_key_value_heads": 2,
                "tie_word_embeddings": True,
            },
            494_032_768,
        ),
        (
            "Llama-3.2-1B",
            {
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": 128256,
                "hidden_size": 2048,
                "intermediate_size": 8192,
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "tie_word_embeddings": True,
            },
            1_235_814_400,
        ),
    ],
)
def test_real_model_sizes(name, hf, expected):
    check(name, hf, expected)


def test_llama_with_attention_bias_and_defaults():
    # No num_key_value_heads (multi-head), no head_dim, no tie_word_embeddings key.
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "attention_bias": True,
    }
    check("a Llama with attention_bias", hf, 235_968)
