"""The offline benchmark's warm-up (chapter 21's minisgl/benchmark/offline.py): given code, not a
stub, so its test lives outside the chapter's tests."""

from __future__ import annotations

from conftest import TINY_MODELS, require_model

from minisgl.benchmark import WorkloadSpec, make_workload
from minisgl.benchmark.offline import greedy_params, warmup_workload
from minisgl.llm import LLM

MODEL = TINY_MODELS["qwen3"]


def test_the_warm_up_has_the_timed_runs_shapes_and_leaves_it_no_prefix_to_reuse() -> None:
    """warmup_workload rotates every prompt by one token and asks two tokens of each; an engine
    that ran it still computes every prompt token of the timed run, where running the timed
    prompts themselves first would have left their pages in the prefix cache."""
    work = make_workload(WorkloadSpec(6, (8, 40), (4, 20)), 1)
    warm = warmup_workload(work)
    assert warm.prompts == [p[1:] + p[:1] for p in work.prompts]
    assert warm.output_lens == [2] * len(work.prompts)
    with LLM(str(require_model(MODEL)), show_progress=False, page_size=4) as llm:
        stats = llm.scheduler.stats
        llm.generate(warm.prompts, greedy_params(warm))
        before = stats.computed_prompt_tokens
        outputs = llm.generate(work.prompts, greedy_params(work))
        assert stats.computed_prompt_tokens - before == work.input_tokens
        assert [len(o["token_ids"]) for o in outputs] == work.output_lens
        before = stats.computed_prompt_tokens
        llm.generate(work.prompts, greedy_params(work))
        assert stats.computed_prompt_tokens - before < work.input_tokens, "the cache does hit"
