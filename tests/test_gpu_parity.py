"""Greedy parity with transformers on a GPU, in float32, with the torch backend.

On the CPU the chapter tests check this; here the same engine runs on CUDA, where the device
copies, events and overlap really are asynchronous. Every scheduler mode must give exactly the
tokens transformers gives (also on CUDA, in float32). Skipped without CUDA.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import pytest
import torch

from conftest import TINY_MODELS, require_model, shared_prefix_prompts
from minisgl.core import SamplingParams

if TYPE_CHECKING:
    from minisgl.llm import LLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MODES = {
    "default": {},
    "naive-cache": {"cache_type": "naive"},
    "chunked": {"max_extend_tokens": 24},
    "overlap-off": {"enable_overlap": False},
    "page-16": {"page_size": 16},
}
MAX_TOKENS = 24


def prompts() -> list[list[int]]:
    return shared_prefix_prompts(7)


@lru_cache(maxsize=1)
def hf_tokens() -> tuple[tuple[int, ...], ...]:
    from transformers import AutoModelForCausalLM

    path = require_model(TINY_MODELS["qwen3"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    out = []
    with torch.inference_mode():
        for ids in prompts():
            gen = model.generate(
                torch.tensor([ids], device="cuda"),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            out.append(tuple(gen[0, len(ids) :].tolist()))
    return tuple(out)


def float32_llm(**config: object) -> LLM:
    """The tiny Qwen3 on CUDA in float32 with the torch backend, where every scheduler mode
    (and every later chapter's) must give exactly transformers' tokens; `config` adds to or
    overrides these settings."""
    from minisgl.llm import LLM

    settings: dict[str, object] = dict(
        device="cuda",
        dtype=torch.float32,
        attention_backend="torch",
        num_pages=4096,
        max_running_req=16,
        show_progress=False,
    )
    return LLM(str(require_model(TINY_MODELS["qwen3"])), **(settings | config))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_greedy_tokens_equal_transformers_on_cuda_in_float32(mode):
    with float32_llm(**MODES[mode]) as llm:
        outs = llm.generate(prompts(), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    ours = tuple(tuple(out["token_ids"]) for out in outs)
    matched = sum(a == b for a, b in zip(ours, hf_tokens()))
    print(f"{mode}: {matched}/{len(ours)} prompts equal transformers")
    assert ours == hf_tokens()
