"""The checkpoints the benchmarks run: the course's SmolLM2 on a CPU, and Qwen3-0.6B's shape with
random weights on a GPU (no download: built from a transformers config, once, under build/)."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
RANDOM_MODEL = "random-qwen3-0.6b"
TOKENIZER = ROOT / "models" / "tiny-qwen3"  # the random checkpoints' tokenizer files


def build_random_model(path: Path, dtype: torch.dtype) -> Path:
    """Qwen3-0.6B's architecture with random weights, saved once as a checkpoint at `path`."""
    if (path / "config.json").is_file():
        return path
    from transformers import Qwen3Config

    # Imported here: the stage 3 milestone runs the online benchmark in snapshots before
    # chapter 21, which brings minisgl.benchmark.
    from minisgl.benchmark.offline import save_random_checkpoint

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    # Initialised on the CPU, as when the committed H200 results were measured.
    return save_random_checkpoint(config, path, TOKENIZER, init_device="cpu", dtype=dtype)


def resolve_model(name: str, dtype: torch.dtype) -> Path:
    """A checkpoint directory, or the random Qwen3-0.6B (built under build/ on first use)."""
    return (
        build_random_model(ROOT / "build" / RANDOM_MODEL, dtype)
        if name == RANDOM_MODEL
        else Path(name)
    )
