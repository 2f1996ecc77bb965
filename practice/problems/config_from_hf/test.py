"""Tests of problem 32 (parse_config). The expected dicts agree with the engine's
ModelConfig.from_hf on the same inputs."""

import copy

from submission import parse_config

SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}


def base(**overrides):
    return {
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "qkv_bias": False,
        "qk_norm": False,
        "eos_token_ids": (),
        **overrides,
    }


def check(hf, expected):
    original = copy.deepcopy(hf)
    got = parse_config(hf)
    assert hf == original, "parse_config must not modify its input dict"
    assert isinstance(got, dict) and set(got) == set(expected), (
        f"parse_config: expected exactly the keys {sorted(expected)}, got "
        f"{sorted(got) if isinstance(got, dict) else type(got).__name__}"
    )
    wrong = {
        k: (expected[k], got[k])
        for k in expected
        if got[k] != expected[k] or type(got[k]) is not type(expected[k])
    }
    assert not wrong, (
        "parse_config("
        + repr(hf)
        + "):\n"
        + "\n".join(f"  {k}: expected {want!r}, got {have!r}" for k, (want, have) in wrong.items())
    )


def test_example_smollm2():
    check(
        SMOLLM2,
        {
            "architecture": "LlamaForCausalLM",
            "num_layers": 30,
            "num_heads": 9,
            "num_kv_heads": 3,
            "head_dim": 64,
            "rope_theta": 100000.0,
            "rope_scaling": None,
            "tie_word_embeddings": True,
            "qkv_bias": False,
            "qk_norm": False,
            "eos_token_ids": (2,),
        },
    )


def test_qwen3_new_style_rope_and_explicit_head_dim():
    hf = {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "tie_word_embeddings": True,
        "eos_token_id": [151645, 151643],
    }
    check(
        hf,
        base(
            architecture="Qwen3ForCausalLM",
            num_layers=28,
            num_heads=16,
            num_kv_heads=8,
            head_dim=128,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            qk_norm=True,
            eos_token_ids=(151645, 151643),
        ),
    )


def test_qwen2_has_qkv_bias():
    hf = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
        "eos_token_id": 2,
    }
    check(
        hf,
        base(
            architecture="Qwen2ForCausalLM", rope_theta=1000000.0, qkv_bias=True, eos_token_ids=(2,)
        ),
    )


def test_llama3_scaling_new_style():
    rope = {
        "rope_theta": 500000.0,
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_parameters": rope,
        "rope_theta": None,
    }
    check(
        hf,
        base(
            architecture="LlamaForCausalLM",
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    )


def test_llama3_scaling_old_style_type_key():
    scaling = {
        "type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "rope_theta": 500000.0,
        "rope_scaling": scaling,
        "attention_bias": False,
    }
    check(
        hf,
        base(
            architecture="LlamaForCausalLM",
            num_kv_heads=4,
            rope_theta=500000.0,
            rope_scaling={**scaling, "rope_type": "llama3"},
        ),
    )


def test_defaults_when_keys_are_missing():
    hf = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "head_dim": None,
    }
    check(hf, base(architecture="llama", num_kv_heads=4))


def test_empty_architectures_and_attention_bias():
    hf = {
        "architectures": [],
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "attention_bias": True,
        "eos_token_id": None,
        "rope_scaling": {"rope_type": "default"},
    }
    check(hf, base(architecture="llama", num_kv_heads=1, qkv_bias=True))
