"""Tests of problem 22 (llama3_inv_freq), against the engine's and inside tiny-llama."""

from __future__ import annotations

import os
from pathlib import Path

import torch

import minisgl.layers.rotary as rotary
from minisgl.core import SamplingParams
from submission import llama3_inv_freq

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

REFERENCE = rotary.llama3_inv_freq  # the engine's own, kept before any patching
LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def check(head_dim: int, base: float, scaling: dict) -> None:
    want = REFERENCE(head_dim, base, scaling)
    got = llama3_inv_freq(head_dim, base, dict(scaling))
    assert isinstance(got, torch.Tensor) and got.shape == want.shape, (
        f"llama3_inv_freq({head_dim}, {base}, ...): expected shape {tuple(want.shape)}, got "
        f"{getattr(got, 'shape', type(got).__name__)}"
    )
    assert got.dtype == torch.float32, f"expected float32, got {got.dtype}"
    bad = (~torch.isclose(got, want, rtol=1e-5, atol=0)).nonzero().flatten().tolist()
    assert not bad, (
        f"llama3_inv_freq({head_dim}, {base}, {scaling}): pairs {bad[:5]} differ, "
        f"e.g. pair {bad[0]}: expected {want[bad[0]].item():.6g}, "
        f"got {got[bad[0]].item():.6g}"
    )


def test_example_llama3_8b():
    got = llama3_inv_freq(64, 500000.0, LLAMA3)
    assert abs(got[0].item() - 1.0) < 1e-6, f"the fastest pair must be kept: got {got[0].item()}"
    want_last = (1.0 / 500000.0 ** (62 / 64)) / 8
    assert abs(got[-1].item() - want_last) < 1e-6 * want_last + 1e-12, (
        f"the slowest pair must be divided by factor 8: expected {want_last:.6g}, "
        f"got {got[-1].item():.6g}"
    )
    check(64, 500000.0, LLAMA3)


def test_llama3_128_dims():
    check(128, 500000.0, LLAMA3)


def test_all_three_bands_with_a_short_original_context():
    # old = 64 puts pairs in every band for head_dim 16: kept, interpolated and scaled.
    check(16, 500000.0, {**LLAMA3, "original_max_position_embeddings": 64})
    check(
        32,
        10000.0,
        {
            "factor": 4.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 256,
        },
    )


def test_small_bases_and_factors():
    scaling = {
        "factor": 2.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    check(8, 10000.0, scaling)
    check(64, 2.0, scaling)


def test_extra_keys_are_ignored():
    check(64, 500000.0, {**LLAMA3, "rope_type": "llama3"})


def test_tiny_llama_builds_the_same_rotary_tables(monkeypatch):
    from minisgl.models import ModelConfig

    config = ModelConfig.from_dir(MODELS / "tiny-llama")
    args = (config.head_dim, config.rope_theta, config.max_position_embeddings, config.rope_scaling)
    want = rotary.RotaryEmbedding(*args)
    monkeypatch.setattr(rotary, "llama3_inv_freq", llama3_inv_freq)
    got = rotary.RotaryEmbedding(*args)
    for name in ("cos_cache", "sin_cache"):
        diff = (getattr(got, name) - getattr(want, name)).abs().max().item()
        assert diff < 1e-5, (
            f"tiny-llama's RotaryEmbedding built with your function: {name} "
            f"differs from the engine's by up to {diff:.3g}"
        )


def test_tiny_llama_generates_the_same_tokens(monkeypatch):
    from minisgl.llm import LLM

    path = str(MODELS / "tiny-llama")
    kwargs = dict(
        num_pages=512, max_running_req=2, max_seq_len=256, cache_type="naive", show_progress=False
    )
    prompt = [(7 * i) % 1000 + 3 for i in range(150)]  # long: past old = 64
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = LLM(path, **kwargs).generate([prompt], params)[0]["token_ids"]
    monkeypatch.setattr(rotary, "llama3_inv_freq", llama3_inv_freq)
    got = LLM(path, **kwargs).generate([prompt], params)[0]["token_ids"]
    assert got == want, (
        f"tiny-llama built with your llama3_inv_freq, a 150-token prompt:\n"
        f"expected {want}\ngot      {got}"
    )
