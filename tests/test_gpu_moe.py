"""The fused MoE Triton kernel on a GPU, against the torch path; Qwen3-MoE greedy parity on CUDA.

The chapter tests run the kernel in Triton's interpreter on tiny shapes; here it is compiled
for the GPU and runs at Qwen3-30B-A3B's layer shape (hidden 2048, 128 experts of intermediate
768, top 8) in bf16, the dtype it serves in, and in float32. The reference is the torch path
(`moe_forward_torch`) in float32 on the same bf16 weights. Skipped without CUDA, and when
TRITON_INTERPRET is set (the chapter 20 tests set it for their own process).
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import MODELS, hf_greedy, require_model

from minisgl.core import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        bool(os.environ.get("TRITON_INTERPRET")), reason="Triton's interpreter is on"
    ),
]

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 2048, 768, 128, 8  # Qwen3-30B-A3B's MoE layer
# bf16 inputs and outputs, float32 accumulation: the kernel's error is the rounding of its
# bf16 intermediate and output, a few parts in a thousand of the output's scale.
BF16_RELATIVE_ERROR = 1e-2


def layer_inputs(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    from minisgl.layers.moe import route

    g = torch.Generator(device="cuda").manual_seed(tokens)
    hidden = torch.randn(tokens, HIDDEN, device="cuda", generator=g).to(dtype)
    gate_up = (
        torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5
    ).to(dtype)
    down = (
        torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, device="cuda", generator=g) / INTERMEDIATE**0.5
    ).to(dtype)
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=g)
    weights, expert_ids = route(logits, TOP_K, True)
    return hidden, gate_up, down, weights, expert_ids


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("tokens", [1, 7, 64, 1000])
def test_fused_moe_matches_the_torch_path_in_bf16(tokens):
    from minisgl.kernels.fused_moe import fused_moe
    from minisgl.layers.moe import moe_forward_torch

    hidden, gate_up, down, weights, expert_ids = layer_inputs(tokens, torch.bfloat16)
    expected = moe_forward_torch(hidden.float(), gate_up.float(), down.float(), weights, expert_ids)
    got = fused_moe(hidden, gate_up, down, weights, expert_ids)
    assert got.dtype == torch.bfloat16 and got.shape == hidden.shape
    assert relative_error(got, expected) < BF16_RELATIVE_ERROR
    # The torch path in bf16 makes errors of the same size: the kernel is no worse.
    torch_bf16 = moe_forward_torch(hidden, gate_up, down, weights, expert_ids)
    assert relative_error(got, expected) < 2 * relative_error(torch_bf16, expected) + 1e-3


@pytest.mark.parametrize("tokens", [1, 33])
def test_fused_moe_matches_the_torch_path_in_float32(tokens):
    from minisgl.kernels.fused_moe import fused_moe
    from minisgl.layers.moe import moe_forward_torch

    hidden, gate_up, down, weights, expert_ids = layer_inputs(tokens, torch.float32)
    expected = moe_forward_torch(hidden, gate_up, down, weights, expert_ids)
    got = fused_moe(hidden, gate_up, down, weights, expert_ids)
    assert relative_error(got, expected) < 1e-5


def test_fused_moe_is_captured_by_a_cuda_graph():
    """No host synchronization in the fused path: a CUDA graph replays it exactly."""
    from minisgl.kernels.fused_moe import fused_moe

    hidden, gate_up, down, weights, expert_ids = layer_inputs(16, torch.bfloat16)
    eager = fused_moe(hidden, gate_up, down, weights, expert_ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fused_moe(hidden, gate_up, down, weights, expert_ids)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_tiny_qwen3_moe_greedy_tokens_on_cuda_match_transformers():
    """The whole engine on CUDA in float32 (fused experts, CUDA graphs for decode)."""
    from minisgl.llm import LLM

    model = require_model(MODELS / "tiny-qwen3-moe")
    prompts = [[1, 15, 27, 300, 4] * 3, [1, 99, 7], list(range(100, 160))]
    with LLM(str(model), device="cuda", dtype=torch.float32, show_progress=False) as llm:
        outputs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    assert [o["token_ids"] for o in outputs] == [hf_greedy(model, p, 16) for p in prompts]
