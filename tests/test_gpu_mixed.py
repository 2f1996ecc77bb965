"""Chapter 23 on a GPU: mixed batches and optimistic admission with preemption.

In float32 with the torch backend every mode must give exactly transformers' tokens, as on the
CPU (`test_gpu_parity.py`'s prompts and reference). With FlashInfer in bf16 a mixed step runs
the decode rows through the prefill wrapper, whose rounding differs from the decode wrapper's,
and a random model's flat logits let free-running sequences split early: there the run must
finish cleanly and each request's first token (from its own prompt) must agree. Skipped
without CUDA (and, for FlashInfer, without flashinfer).
"""

from __future__ import annotations

import pytest
import torch
from test_gpu_attention import HAS_GPU, greedy_tokens, long_prompts, qwen3_h128  # noqa: F401
from test_gpu_parity import MAX_TOKENS, float32_llm, hf_tokens, prompts

from minisgl.core import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MODES = {
    "mixed": {"mixed_batches": True, "max_extend_tokens": 24},
    "optimistic": {"admission": "optimistic"},
    "mixed-optimistic": {"mixed_batches": True, "admission": "optimistic", "max_extend_tokens": 32},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_mixed_and_optimistic_give_transformers_tokens_on_cuda_in_float32(mode):
    # 200 pages: well under the nine requests' worst cases, so optimistic runs preempt
    with float32_llm(num_pages=200, **MODES[mode]) as llm:
        outs = llm.generate(prompts(), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        preemptor = getattr(llm.scheduler.policy, "preemptor", None)
        preemptions = preemptor.preemptions if preemptor else 0
        assert llm.scheduler.status().integrity_ok
    print(f"{mode}: {preemptions} preemptions")
    if preemptor is not None:
        assert preemptions > 0
    assert tuple(tuple(out["token_ids"]) for out in outs) == hf_tokens()


# 120 pages hold the largest request's worst case (79 + 24 tokens and a page) and little more:
# optimistic admission fills them with prompts, and 5 of the 9 requests are preempted, each once
# (the same on the CPU, where float32 gives the same tokens; the count is asserted and printed).
TIGHT_PAGES = 120


@pytest.mark.parametrize("overlap", [False, True])
def test_a_pool_that_preempts_most_requests_still_gives_transformers_tokens(overlap):
    with float32_llm(num_pages=TIGHT_PAGES, admission="optimistic", enable_overlap=overlap) as llm:
        outs = llm.generate(prompts(), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        preemptions = llm.scheduler.policy.preemptor.preemptions
        assert llm.scheduler.status().integrity_ok
    print(
        f"tight pool of {TIGHT_PAGES} pages, overlap {overlap}: {preemptions} preemptions "
        f"of {len(prompts())} requests"
    )
    assert preemptions > len(prompts()) // 2, "most requests must be preempted"
    assert tuple(tuple(out["token_ids"]) for out in outs) == hf_tokens()


@pytest.mark.skipif(not HAS_GPU, reason="needs CUDA and flashinfer")
def test_flashinfer_runs_mixed_optimistic_batches_to_the_end(qwen3_h128):  # noqa: F811
    prompts_ = long_prompts(12, seed=5)
    max_tokens = [32] * 12
    plain = greedy_tokens(qwen3_h128, prompts_, max_tokens, attention_backend="flashinfer")
    mixed = greedy_tokens(
        qwen3_h128,
        prompts_,
        max_tokens,
        attention_backend="flashinfer",
        mixed_batches=True,
        admission="optimistic",
        max_extend_tokens=256,
    )
    same = sum(a == b for ta, tb in zip(plain, mixed) for a, b in zip(ta, tb))
    print(f"mixed+optimistic vs plain (bf16): {same} of {sum(max_tokens)} tokens equal")
    assert [len(t) for t in mixed] == max_tokens
    first = sum(ta[0] == tb[0] for ta, tb in zip(plain, mixed))
    assert first >= 11, f"only {first} of 12 first tokens agree"
