"""The fused layers of minisgl.kernels.fused_layers against chapter 2's torch layers, and what
chapter 19's engine extension hands an engine on the kernel path.

They run here in Triton's interpreter, on CPU tensors in float32 (TRITON_INTERPRET=1 must be set
before triton is imported); tests/test_gpu_attention.py compares them in bfloat16 on a GPU
(`test_fused_layers_stay_within_bf16_tolerance_of_the_torch_layers`).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before minisgl.kernels.fused_layers imports triton

import pytest
import torch
from conftest import TINY_MODELS, greedy, hf_greedy_cached, require_model, run_until_idle
from test_ch17_gpu_attention import FakeFlashInfer, hand_engine

from minisgl.attention import fi
from minisgl.kernels import step_inputs
from minisgl.kernels.fused_layers import (
    FusedAttentionLayer,
    FusedMLP,
    FusedRMSNorm,
    fuse_layers,
    norm_rope,
    rmsnorm,
    silu_and_mul,
    store_column_major,
)
from minisgl.layers import RMSNorm, RotaryEmbedding
from minisgl.layers import silu_and_mul as torch_silu_and_mul
from minisgl.scheduler import Scheduler, SchedulerConfig

# float32 arithmetic in another order; in bfloat16, where both round in the same places, a
# rounding step or two of bfloat16 (8 bits of mantissa) where float32's order differs
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}
DTYPES = pytest.mark.parametrize("dtype", list(TOLERANCES), ids=["float32", "bfloat16"])


def random_norm(size: int, seed: int, dtype: torch.dtype = torch.float32) -> RMSNorm:
    norm = RMSNorm(size, 1e-6)
    norm.weight.data = torch.randn(size, generator=torch.Generator().manual_seed(seed))
    return norm.to(dtype)


@DTYPES
@pytest.mark.parametrize("size", [8, 40, 64])
def test_rmsnorm_matches_the_torch_layer_on_strided_rows(size: int, dtype: torch.dtype) -> None:
    norm = random_norm(size, seed=size, dtype=dtype)
    wide = torch.randn(5, 2 * size, dtype=dtype)
    x = wide[:, :size]  # rows strided, like a view of a wider tensor
    out, summed = rmsnorm(x, norm.weight, norm.eps)
    assert summed is None and out.is_contiguous() and out.dtype == dtype
    torch.testing.assert_close(out, norm(x), **TOLERANCES[dtype])


@DTYPES
@pytest.mark.parametrize("size", [8, 40])
def test_add_rmsnorm_returns_the_normed_sum_and_the_sum(size: int, dtype: torch.dtype) -> None:
    norm = random_norm(size, seed=size, dtype=dtype)
    x, residual = torch.randn(7, size, dtype=dtype), torch.randn(7, size, dtype=dtype)
    out, summed = rmsnorm(x, norm.weight, norm.eps, residual)
    expected_out, expected_sum = norm.forward_residual(x, residual)
    torch.testing.assert_close(summed, expected_sum, **TOLERANCES[dtype])
    torch.testing.assert_close(out, expected_out, **TOLERANCES[dtype])


@DTYPES
@pytest.mark.parametrize("head_dim", [8, 12, 16])
@pytest.mark.parametrize("with_norm", [True, False])
def test_norm_rope_matches_norms_then_rotary_on_views_of_qkv(
    head_dim: int, with_norm: bool, dtype: torch.dtype
) -> None:
    heads, kv_heads, tokens = 6, 2, 6  # one program per token's q or k: padded, masked rows
    rotary = RotaryEmbedding(head_dim, 10_000.0, 64)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    positions = torch.tensor([0, 3, 4, 17, 40, 63])
    q_norm, k_norm = random_norm(head_dim, 1, dtype), random_norm(head_dim, 2, dtype)
    expected_q, expected_k = (q_norm(q), k_norm(k)) if with_norm else (q, k)
    expected_q, expected_k = rotary(positions, expected_q, expected_k)
    weights = (q_norm.weight, k_norm.weight, q_norm.eps) if with_norm else (None, None, 0.0)
    out_q, out_k = norm_rope(q, k, positions, rotary.cos_cache, rotary.sin_cache, *weights)
    torch.testing.assert_close(out_q, expected_q, **TOLERANCES[dtype])
    torch.testing.assert_close(out_k, expected_k, **TOLERANCES[dtype])


@DTYPES
def test_silu_and_mul_matches_the_torch_function_past_one_block(dtype: torch.dtype) -> None:
    gate_up = torch.randn(3, 2 * 1500, dtype=dtype)  # two blocks of 1,024, the second masked
    expected = torch_silu_and_mul(gate_up)
    torch.testing.assert_close(silu_and_mul(gate_up), expected, **TOLERANCES[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_a_fused_model_gives_transformers_greedy_tokens(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = require_model(TINY_MODELS[name])
    monkeypatch.setenv("MINISGL_CPU_LAYOUT", "row")  # the layout of a GPU engine's weights
    scheduler = Scheduler(
        SchedulerConfig(str(model), device="cpu", num_pages=128, page_size=4, show_progress=False)
    )
    engine = scheduler.engine
    changed = fuse_layers(engine.model)
    layers = engine.model_config.num_layers
    # per layer two norms, the attention layer and the MLP (and q/k norms); the final norm
    assert changed == 4 * layers + 1 + (2 * layers if engine.model_config.qk_norm else 0)
    kinds = {type(m) for m in engine.model.modules()}
    assert {FusedRMSNorm, FusedAttentionLayer, FusedMLP} <= kinds
    named = dict(engine.model.named_modules())
    outputs = {n: m for n, m in named.items() if n.endswith(("self_attn.o_proj", "mlp.down_proj"))}
    before = {n: m.weight.detach().clone() for n, m in outputs.items()}
    assert store_column_major(engine.model) == 2 * layers == len(outputs)
    for name, projection in outputs.items():
        weight = projection.weight
        assert weight.t().is_contiguous(), f"{name}: W^T must be the contiguous layout"
        assert torch.equal(weight, before[name]), f"{name}: the same matrix, laid out anew"
    prompts = [[1, 15, 27, 300, 4, 99, 7], [1, 8, 8, 8, 2000]]
    uids = [scheduler.add_request(ids, greedy(6)) for ids in prompts]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    for outputs in run_until_idle(scheduler):
        for out in outputs:
            tokens[out.uid].append(out.token)
    for uid, ids in zip(uids, prompts):
        assert tokens[uid] == hf_greedy_cached(model, ids, 6), f"prompt {ids}"


def test_the_kernel_path_gathers_flashinfers_pages_with_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the kernels on, the extension gives a FlashInfer backend chapter 19's page gather;
    without them, it keeps chapter 17's."""
    monkeypatch.setenv("MINISGL_KERNELS", "triton")
    engine = hand_engine(monkeypatch, FakeFlashInfer(), "flashinfer", page_size=4)
    assert engine.attn_backend.gather_pages is step_inputs.gather_page_indices
    monkeypatch.setenv("MINISGL_KERNELS", "torch")
    engine = hand_engine(monkeypatch, FakeFlashInfer(), "flashinfer", page_size=4)
    assert engine.attn_backend.gather_pages is fi.gather_page_indices
