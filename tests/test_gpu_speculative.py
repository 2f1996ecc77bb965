"""Chapter 24 on a GPU: speculative decoding gives plain decoding's tokens, graphs on and off.

In float32 with the torch backend a spec run must give exactly transformers' tokens, as on the
CPU (`test_gpu_parity.py`'s prompts and reference). FlashInfer runs 16-bit only: there a verify
step goes through the prefill wrapper, whose rounding differs from the decode wrapper's, so
spec and plain runs of a random model may part after a while; their first tokens must agree,
and a spec run with CUDA graphs must give the same tokens as one without (its verify steps run
eagerly either way; the plain steps it still has replay the decode graphs). The bf16 smoke
prints both throughputs and the acceptance. Skipped without CUDA (and, for FlashInfer,
without flashinfer).
"""

from __future__ import annotations

import time

import pytest
import torch
from test_gpu_attention import HAS_GPU, qwen3_h128  # noqa: F401
from test_gpu_parity import MAX_TOKENS, hf_tokens, prompts

from conftest import TINY_MODELS, require_model
from minisgl.core import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def copy_prompts(count: int) -> list[list[int]]:
    """Prompts that repeat a phrase: n-gram drafts find their continuations."""
    return [[10 + i, 20 + i, 30 + i, 40 + i, 50 + i] * 6 + [10 + i] for i in range(count)]


def run(model, prompts_, max_tokens: int, **config):
    from minisgl.llm import LLM

    with LLM(str(model), show_progress=False, max_running_req=16, **config) as llm:
        start = time.perf_counter()
        outs = llm.generate(prompts_, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        stats = getattr(llm.scheduler.pick_batch, "stats", None)
        assert llm.scheduler.status().integrity_ok
    return [out["token_ids"] for out in outs], seconds, stats


@pytest.mark.parametrize("k", [1, 4])
def test_spec_gives_transformers_tokens_on_cuda_in_float32(k):
    path = require_model(TINY_MODELS["qwen3"])
    tokens, _, stats = run(
        path,
        prompts(),
        MAX_TOKENS,
        device="cuda",
        dtype=torch.float32,
        attention_backend="torch",
        speculative_tokens=k,
        page_size=4,
    )
    print(f"k={k}: {stats.accepted} of {stats.drafted} drafts accepted")
    assert stats.drafted > 0
    assert tuple(map(tuple, tokens)) == hf_tokens()


@pytest.mark.skipif(not HAS_GPU, reason="needs CUDA and flashinfer")
def test_flashinfer_spec_with_and_without_graphs_agree_and_start_like_plain(qwen3_h128):  # noqa: F811
    common = dict(dtype=torch.bfloat16, attention_backend="flashinfer", page_size=16)
    prompts_ = copy_prompts(8)
    plain, _, _ = run(qwen3_h128, prompts_, 32, **common)
    graphs, _, stats = run(qwen3_h128, prompts_, 32, speculative_tokens=4, **common)
    eager, _, _ = run(qwen3_h128, prompts_, 32, speculative_tokens=4, cuda_graph_max_bs=0, **common)
    same = sum(a == b for ta, tb in zip(plain, graphs) for a, b in zip(ta, tb))
    print(
        f"spec vs plain (bf16): {same} of {8 * 32} tokens equal; "
        f"{stats.accepted} of {stats.drafted} drafts accepted"
    )
    assert [len(t) for t in graphs] == [32] * 8
    assert graphs == eager
    assert sum(ta[0] == tb[0] for ta, tb in zip(plain, graphs)) >= 7


@pytest.mark.skipif(not HAS_GPU, reason="needs CUDA and flashinfer")
def test_bf16_spec_speed_smoke(qwen3_h128):  # noqa: F811
    common = dict(dtype=torch.bfloat16, attention_backend="flashinfer", page_size=16)
    prompts_ = copy_prompts(16)
    run(qwen3_h128, prompts_[:1], 8, **common)  # compile and warm up
    plain, plain_s, _ = run(qwen3_h128, prompts_, 128, **common)
    spec, spec_s, stats = run(qwen3_h128, prompts_, 128, speculative_tokens=4, **common)
    print(
        f"batch 16 x 128 tokens: plain {16 * 128 / plain_s:.0f} tok/s, spec k=4 "
        f"{16 * 128 / spec_s:.0f} tok/s, acceptance "
        f"{stats.acceptance_rate:.2f}"
    )
    assert [len(t) for t in spec] == [128] * 16
