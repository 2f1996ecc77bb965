"""Tests of problem 1 (rms_norm), alone and inside the chapter 0 tiny engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import minisgl.tiny_engine as tiny
from submission import rms_norm

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

PROMPT = [1, 17, 404, 9, 2024, 31, 77]


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def check(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    got = rms_norm(x, weight, eps)
    want = reference(x, weight, eps)
    assert isinstance(got, torch.Tensor) and got.shape == x.shape, (
        f"rms_norm(x of shape {tuple(x.shape)}): expected shape {tuple(x.shape)}, got "
        f"{getattr(got, 'shape', type(got).__name__)}"
    )
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (
        f"rms_norm(x={x.tolist() if x.numel() <= 8 else tuple(x.shape)}, eps={eps}):\n"
        f"expected {want.flatten()[:6].tolist()}...\ngot      {got.flatten()[:6].tolist()}..."
    )


@pytest.fixture(scope="module")
def engine() -> tiny.TinyEngine:
    return tiny.TinyEngine(MODELS / "tiny-qwen3")


def test_example_three_four():
    check(torch.tensor([[3.0, 4.0]]), torch.ones(2), 0.0)


def test_each_row_is_normalized_on_its_own():
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [100.0, -100.0, 100.0, -100.0]])
    check(x, torch.ones(4), 1e-6)


def test_weight_scales_each_channel():
    check(
        torch.randn(3, 8, generator=torch.Generator().manual_seed(0)), torch.arange(1.0, 9.0), 1e-6
    )


def test_any_leading_shape():
    # Qwen3 normalizes each attention head: [heads, seq, head_dim].
    check(
        torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(1)),
        torch.rand(16, generator=torch.Generator().manual_seed(2)),
        1e-6,
    )


def test_eps_is_inside_the_square_root():
    check(torch.tensor([[0.3, -0.4]]), torch.ones(2), 1.0)
    got = rms_norm(torch.zeros(1, 4), torch.ones(4), 1e-6)
    assert not got.isnan().any(), f"rms_norm(zeros, eps=1e-6) must be zeros, got {got.tolist()}"


def test_the_tiny_engine_gives_the_same_logits(engine, monkeypatch):
    kv, ids = tiny.KVCache(engine.model.config), torch.tensor(PROMPT)
    want = engine.model.forward(ids, torch.arange(len(PROMPT)), kv)
    monkeypatch.setattr(tiny, "rms_norm", rms_norm)
    kv = tiny.KVCache(engine.model.config)
    got = engine.model.forward(ids, torch.arange(len(PROMPT)), kv)
    diff = (got - want).abs().max().item()
    assert diff < 1e-4, (
        f"TinyModel.forward({PROMPT}) on tiny-qwen3 with your rms_norm: "
        f"logits differ from the reference by up to {diff:.3g}"
    )


def test_the_tiny_engine_generates_the_same_tokens(engine, monkeypatch):
    want = engine.generate_ids(PROMPT, 8, ignore_eos=True)
    monkeypatch.setattr(tiny, "rms_norm", rms_norm)
    got = engine.generate_ids(PROMPT, 8, ignore_eos=True)
    assert got == want, (
        f"TinyEngine.generate_ids({PROMPT}, 8) on tiny-qwen3 with your rms_norm:"
        f"\nexpected {want}\ngot      {got}"
    )
