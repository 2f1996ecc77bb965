"""Tests of problem 14 (forward_batch), alone and inside the real engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import minisgl.core as core
from minisgl.core import Batch, Context, SamplingParams, get_global_ctx
from submission import forward_batch

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it


def make_ctx() -> Context:
    return Context(page_size=1, kv_cache=None, page_table=None, attn_backend=None)


@pytest.fixture(autouse=True)
def clean_state():
    """Every test starts (and leaves) with no active context, whatever the submission did."""
    core._ACTIVE_CTX = None
    yield
    core._ACTIVE_CTX = None


def no_active_context() -> bool:
    try:
        get_global_ctx()
    except RuntimeError:
        return True
    return False


def test_example_active_inside_only():
    ctx, batch = make_ctx(), Batch([], "decode")
    with forward_batch(ctx, batch) as got:
        assert got is batch, "the with block must receive the batch"
        assert get_global_ctx() is ctx, "inside the block get_global_ctx() must be the context"
        assert ctx.batch is batch, "inside the block ctx.batch must be the batch"
    assert no_active_context() and ctx._batch is None, (
        "after the block no context may be active and ctx._batch must be None"
    )


def test_reset_even_when_the_block_raises():
    ctx = make_ctx()
    with pytest.raises(ZeroDivisionError):
        with forward_batch(ctx, Batch([], "prefill")):
            1 / 0
    assert no_active_context() and ctx._batch is None, (
        "an exception inside the block must still reset core._ACTIVE_CTX and ctx._batch"
    )
    with forward_batch(ctx, Batch([], "decode")):  # and the context works again
        assert get_global_ctx() is ctx


def test_nesting_the_same_context_raises():
    ctx = make_ctx()
    with forward_batch(ctx, Batch([], "decode")):
        try:
            with forward_batch(ctx, Batch([], "decode")):
                pass
        except RuntimeError:
            pass
        else:
            raise AssertionError(
                "a nested forward_batch on the same context must raise RuntimeError"
            )
        assert get_global_ctx() is ctx, "a refused nested call must leave the outer one active"


def test_nesting_another_context_raises():
    outer, inner = make_ctx(), make_ctx()
    with forward_batch(outer, Batch([], "decode")):
        try:
            with forward_batch(inner, Batch([], "decode")):
                pass
        except RuntimeError:
            pass
        else:
            raise AssertionError(
                "forward_batch while another context is active must raise RuntimeError"
            )
        assert get_global_ctx() is outer and inner._batch is None, (
            "a refused call must change neither context"
        )


def test_the_engine_runs_inside_your_context(monkeypatch):
    from minisgl.llm import LLM

    llm = LLM(
        str(MODELS / "tiny-qwen3"),
        num_pages=256,
        max_running_req=2,
        max_seq_len=64,
        cache_type="naive",
        show_progress=False,
    )
    prompts, params = [[1, 2, 3, 4, 5], [7, 8, 9]], SamplingParams(max_tokens=5, ignore_eos=True)
    want = [o["token_ids"] for o in llm.generate(prompts, params)]
    monkeypatch.setattr(Context, "forward_batch", forward_batch)
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    assert got == want, (
        f"LLM.generate on tiny-qwen3 with your forward_batch:\nexpected {want}\ngot      {got}"
    )
    assert no_active_context(), "after generate no context may be active"
