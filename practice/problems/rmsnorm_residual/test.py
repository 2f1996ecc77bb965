"""Tests of problem 23 (RMSNorm.forward / forward_residual), against transformers and inside
the real model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.layers.norm import RMSNorm
from submission import forward, forward_residual

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it


def make_norm(weight: list[float] | torch.Tensor, eps: float, dtype=torch.float32) -> RMSNorm:
    weight = torch.as_tensor(weight, dtype=torch.float32)
    norm = RMSNorm(weight.numel(), eps)
    norm.weight.data = weight.to(dtype)
    return norm


def hf_norm(norm: RMSNorm):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(norm.weight.numel(), eps=norm.eps)
    hf.weight.data = norm.weight.data.clone()
    return hf


def test_example_forward():
    norm = make_norm([1.0, 2.0], 0.0)
    got = forward(norm, torch.tensor([[3.0, 4.0]]))
    want = torch.tensor([[0.8485, 2.2627]])
    assert torch.allclose(got, want, atol=1e-4), (
        f"forward(RMSNorm(weight=[1, 2], eps=0), [[3, 4]]): expected {want.tolist()}, "
        f"got {got.tolist()}"
    )


def test_example_forward_residual():
    norm = make_norm([1.0, 2.0], 0.0)
    x, r = torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 3.0]])
    normed, residual = forward_residual(norm, x, r)
    assert torch.equal(residual, torch.tensor([[3.0, 4.0]])), (
        f"forward_residual(x=[[1, 1]], residual=[[2, 3]]): the new residual must be x + residual "
        f"= [[3, 4]], got {residual.tolist()}"
    )
    assert torch.allclose(normed, torch.tensor([[0.8485, 2.2627]]), atol=1e-4), (
        f"forward_residual: the normed output must be forward(x + residual), got {normed.tolist()}"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_transformers_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(0)
    norm = make_norm(torch.rand(64, generator=gen) + 0.5, 1e-6, dtype)
    x = (torch.randn(7, 64, generator=gen) * 3).to(dtype)
    want = hf_norm(norm)(x)
    got = forward(norm, x)
    assert got.dtype == dtype and got.shape == x.shape, (
        f"forward on {dtype} input of shape {tuple(x.shape)}: expected {dtype} of the same shape, "
        f"got {got.dtype} {tuple(got.shape)}"
    )
    # float32: up to rounding; bfloat16: exactly, which only the right order of casts gives.
    if dtype == torch.float32:
        mismatches = (~torch.isclose(got, want, rtol=1e-6, atol=1e-6)).sum().item()
    else:
        mismatches = (got != want).sum().item()
    assert mismatches == 0, (
        f"forward on {dtype} input: {mismatches} of {x.numel()} values differ from transformers' "
        f"LlamaRMSNorm (max diff {(got.float() - want.float()).abs().max().item():.3g}); "
        "compute in float32, cast back to the input dtype, then multiply by the weight"
    )


def test_per_head_shape():
    norm = make_norm(torch.linspace(0.5, 1.5, 16), 1e-6)
    x = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(1))
    got, want = forward(norm, x), hf_norm(norm)(x)
    assert got.shape == x.shape and torch.allclose(got, want, atol=1e-6), (
        f"forward on a [tokens, heads, head_dim] = {tuple(x.shape)} input must normalize each "
        "head over head_dim"
    )


def test_forward_residual_leaves_its_inputs_alone():
    norm = make_norm(torch.ones(8), 1e-6, torch.bfloat16)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    r = torch.randn(3, 8, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x0, r0 = x.clone(), r.clone()
    normed, residual = forward_residual(norm, x, r)
    assert torch.equal(x, x0) and torch.equal(r, r0), (
        "forward_residual changed x or residual in place"
    )
    assert torch.equal(residual, x0 + r0), "the new residual must be x + residual"
    assert torch.equal(normed, hf_norm(norm)(x0 + r0)), "normed must be forward(x + residual)"


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
    monkeypatch.setattr(RMSNorm, "forward", forward)
    monkeypatch.setattr(RMSNorm, "forward_residual", forward_residual)
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    assert got == want, (
        f"LLM.generate({prompts}) on tiny-qwen3 with your RMSNorm:\nexpected {want}\ngot      {got}"
    )
