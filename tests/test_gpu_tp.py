"""Tensor parallelism on two GPUs (chapter 16): TP=2 over NCCL generates, greedily and in
float32 with the torch backend, exactly the tokens of TP=1, for each tiny checkpoint, with the
radix cache and chunked prefill on. Skipped unless two GPUs are visible.

    NCCL_NVLS_ENABLE=0 python -m pytest tests/test_gpu_tp.py -v -s
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import TINY_MODELS, require_model, shared_prefix_prompts

from minisgl.core import SamplingParams
from minisgl.llm import LLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (the ranks inherit it)
MAX_TOKENS = 24
MODES = {"default": {}, "chunked": {"max_extend_tokens": 24}, "page-16": {"page_size": 16}}


def prompts() -> list[list[int]]:
    return shared_prefix_prompts(16)


def generate(model: str, tp_size: int, mode: str) -> list[list[int]]:
    with LLM(
        model,
        device="cuda",
        dtype=torch.float32,
        attention_backend="torch",
        num_pages=4096,
        max_running_req=16,
        show_progress=False,
        tp_size=tp_size,
        **MODES[mode],
    ) as llm:
        outs = llm.generate(prompts(), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    return [out["token_ids"] for out in outs]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_tp2_greedy_tokens_equal_tp1_on_cuda_in_float32(name: str, mode: str) -> None:
    model = str(require_model(TINY_MODELS[name]))
    one, two = generate(model, 1, mode), generate(model, 2, mode)
    matched = sum(a == b for a, b in zip(one, two))
    print(f"{name} {mode}: {matched}/{len(one)} prompts equal at TP=2 and TP=1")
    assert two == one
