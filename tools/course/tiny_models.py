"""The tiny random checkpoints of the course, in one place: their configs (tools/provision.py
builds them with transformers) and the dense ones that the tests' `tiny_model_dir` fixture and
practice's torch problems load."""

from __future__ import annotations

# Small enough to build in a second, large enough that RoPE, GQA and q/k norm all matter.
TINY_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    initializer_range=0.2,  # peaked logits: greedy choices are not near-ties
    bos_token_id=1,
    eos_token_id=2,
)
TINY_MODELS = {
    "tiny-qwen3": ("Qwen3Config", dict(rope_theta=1_000_000.0, tie_word_embeddings=True)),
    "tiny-qwen2": ("Qwen2Config", dict(rope_theta=1_000_000.0, tie_word_embeddings=False)),
    "tiny-llama": (
        "LlamaConfig",
        dict(
            rope_theta=500_000.0,
            tie_word_embeddings=False,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    # Qwen3-30B-A3B's routing (softmax, top-k, renormalized) on 8 small experts, top 2; layer 0
    # stays dense (mlp_only_layers) so both kinds of MLP are exercised. save_pretrained writes
    # each expert's projections apart, as the hub's Qwen3-MoE checkpoints store them.
    "tiny-qwen3-moe": (
        "Qwen3MoeConfig",
        dict(
            rope_theta=1_000_000.0,
            tie_word_embeddings=False,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[0],
        ),
    ),
}
# The dense ones: what the tests' tiny_model_dir fixture and practice's torch problems load.
DENSE_TINY_MODELS = tuple(name for name, (config, _) in TINY_MODELS.items() if "Moe" not in config)
