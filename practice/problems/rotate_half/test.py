"""Tests of problem 21 (rotate_half), alone and inside the real model."""

from __future__ import annotations

import os
from pathlib import Path

import torch

import minisgl.layers.rotary as rotary
from minisgl.core import SamplingParams
from submission import rotate_half

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it


def check(x: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    want = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    got = rotate_half(x)
    assert isinstance(got, torch.Tensor) and got.shape == x.shape, (
        f"rotate_half(x of shape {tuple(x.shape)}): expected the same shape, got "
        f"{getattr(got, 'shape', type(got).__name__)}"
    )
    assert torch.equal(got, want), (
        f"rotate_half({x.tolist() if x.numel() <= 8 else tuple(x.shape)}):\n"
        f"expected {want.flatten()[:8].tolist()}\ngot      {got.flatten()[:8].tolist()}"
    )


def test_example_four_dims():
    check(torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_pairs_are_halves_not_neighbours():
    check(torch.arange(8.0))


def test_queries_of_many_tokens_and_heads():
    check(torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(0)))


def test_does_not_change_its_input():
    x = torch.arange(6.0)
    rotate_half(x)
    assert torch.equal(x, torch.arange(6.0)), f"rotate_half changed its input to {x.tolist()}"


def test_twice_is_minus_identity():
    x = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    got = rotate_half(rotate_half(x))
    assert torch.equal(got, -x), "rotate_half(rotate_half(x)) must be -x (two 90° rotations)"


def test_attention_scores_depend_only_on_distance(monkeypatch):
    monkeypatch.setattr(rotary, "rotate_half", rotate_half)
    rope = rotary.RotaryEmbedding(head_dim=16, base=10000.0, max_position=64)
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 1, 16, generator=gen), torch.randn(1, 1, 16, generator=gen)

    def score(m: int, n: int) -> float:
        qm, _ = rope(torch.tensor([m]), q, k)
        _, kn = rope(torch.tensor([n]), q, k)
        return float((qm * kn).sum())

    pairs = [(3, 1), (10, 8), (40, 38)]  # the same distance 2
    scores = [score(m, n) for m, n in pairs]
    assert max(scores) - min(scores) < 1e-4, (
        f"with your rotate_half, q·k at positions {pairs} (distance 2 each) gives {scores}: "
        "RoPE scores must depend only on the distance"
    )


def test_the_model_generates_the_same_tokens(monkeypatch):
    from minisgl.llm import LLM

    llm = LLM(
        str(MODELS / "tiny-qwen3"),
        num_pages=256,
        max_running_req=2,
        max_seq_len=64,
        cache_type="naive",
        show_progress=False,
    )
    prompts, params = [[1, 2, 3, 4, 5, 6, 7], [9, 8]], SamplingParams(max_tokens=6, ignore_eos=True)
    want = [o["token_ids"] for o in llm.generate(prompts, params)]
    monkeypatch.setattr(rotary, "rotate_half", rotate_half)
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    assert got == want, (
        f"LLM.generate({prompts}) on tiny-qwen3 with your rotate_half:\n"
        f"expected {want}\ngot      {got}"
    )
