"""Chapter 24 on a GPU: speculative decoding gives plain decoding's tokens, graphs on and off.

With CUDA graphs a verify step that fits the largest graph runs as decode rows, one per token
(`DraftRow`), replayed by chapter 18's graphs; otherwise, and without graphs, as an eager
extend. In float32 both layouts must give exactly transformers' tokens (`test_gpu_parity.py`'s
prompts and reference): the torch backend (no graphs) and chapter 22's Triton backend, with
its graphs. FlashInfer runs 16-bit only, where its decode and prefill kernels round
differently and a random model's sequences part after a while: there the run must finish, lay
verify steps out as graph rows, and start like plain decoding. The bf16 smoke prints
throughput, plain and speculative, at a batch of 1 and 16 (`python -m benchmark speculative`, which
the same run_gpu.sh stage runs, times the steps).

The n-gram drafter finds little to propose on these random models (1 of 197 drafts accepted),
so verify and rollback would hardly run. The oracle tests draft with a drafter that knows the
answer (`oracle_drafter`: the reference continuation, as long as the sequence follows it) and
assert the accepted share: every draft in float32, most of them in bf16.
Skipped without CUDA (and, for FlashInfer, without flashinfer).
"""

from __future__ import annotations

import time

import pytest
import torch
from test_gpu_attention import HAS_GPU, qwen3_h128  # noqa: F401
from test_gpu_parity import MAX_TOKENS, hf_tokens, prompts

from conftest import TINY_MODELS, require_model
from minisgl.core import SamplingParams
from minisgl.speculative import policy as policy_module
from minisgl.speculative.policy import SpeculativeDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def copy_prompts(count: int) -> list[list[int]]:
    """Prompts that repeat a phrase: n-gram drafts find their continuations."""
    return [[10 + i, 20 + i, 30 + i, 40 + i, 50 + i] * 6 + [10 + i] for i in range(count)]


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The phase of every verify batch made from now on ("decode": graph rows)."""
    seen: list[str] = []
    draft = SpeculativeDecoder.draft

    def spy(self: SpeculativeDecoder, reqs: list) -> object:
        batch = draft(self, reqs)
        if batch is not None:
            seen.append(batch.phase)
        return batch

    monkeypatch.setattr(SpeculativeDecoder, "draft", spy)
    return seen


def run(model, prompts_, max_tokens: int, **config):
    """Tokens, seconds of the generate, and the speculative stats (None when off)."""
    from minisgl.llm import LLM

    with LLM(str(model), show_progress=False, **({"max_running_req": 16} | config)) as llm:
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = llm.generate(prompts_, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        policy = llm.scheduler.policy
        stats = policy.stats if isinstance(policy, SpeculativeDecoder) else None
        assert llm.scheduler.status().integrity_ok
    return [out["token_ids"] for out in outs], seconds, stats


def float32_spec_run(backend: str, k: int):  # noqa: ANN201 - (tokens, SpeculativeStats)
    """The parity prompts on the tiny Qwen3 in float32 with k drafts: tokens and stats."""
    tokens, _, stats = run(
        require_model(TINY_MODELS["qwen3"]),
        prompts(),
        MAX_TOKENS,
        device="cuda",
        dtype=torch.float32,
        attention_backend=backend,
        speculative_tokens=k,
        page_size=4,
        # graphs go up to max_running_req rows: room for 9 requests' verify steps as rows
        max_running_req=64,
    )
    return tokens, stats


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("k", [1, 4])
def test_spec_gives_transformers_tokens_on_cuda_in_float32(backend, k, layouts):
    tokens, stats = float32_spec_run(backend, k)
    print(
        f"{backend} k={k}: {stats.accepted} of {stats.drafted} drafts accepted; layouts "
        f"{layouts.count('decode')} as graph rows, {layouts.count('prefill')} as extends"
    )
    assert stats.drafted > 0
    if backend == "triton":  # its graphs replay verify steps of up to 16 rows
        assert layouts.count("decode") > 0
    assert tuple(map(tuple, tokens)) == hf_tokens()


@pytest.mark.skipif(not HAS_GPU, reason="needs CUDA and flashinfer")
def test_flashinfer_spec_runs_verify_steps_as_graph_rows_and_starts_like_plain(
    qwen3_h128,  # noqa: F811
    layouts,
):
    common = dict(dtype=torch.bfloat16, attention_backend="flashinfer", page_size=16)
    prompts_ = copy_prompts(4)  # 4 x (4 + 1) rows: within the largest graph (16)
    plain, _, _ = run(qwen3_h128, prompts_, 32, **common)
    graphs, _, stats = run(qwen3_h128, prompts_, 32, speculative_tokens=4, **common)
    graph_layouts = list(layouts)
    eager, _, _ = run(qwen3_h128, prompts_, 32, speculative_tokens=4, cuda_graph_max_bs=0, **common)
    same = sum(a == b for ta, tb in zip(plain, graphs) for a, b in zip(ta, tb))
    same_eager = sum(a == b for ta, tb in zip(eager, graphs) for a, b in zip(ta, tb))
    print(
        f"spec with graphs vs plain (bf16): {same} of {4 * 32} tokens equal; vs spec without "
        f"graphs: {same_eager}; {stats.accepted} of {stats.drafted} drafts accepted; "
        f"{graph_layouts.count('decode')} verify steps as graph rows"
    )
    assert [len(t) for t in graphs] == [32] * 4 and [len(t) for t in eager] == [32] * 4
    assert graph_layouts.count("decode") > 0 and "decode" not in layouts[len(graph_layouts) :]
    assert all(ta[0] == tb[0] for ta, tb in zip(plain, graphs))


@pytest.mark.skipif(not HAS_GPU, reason="needs CUDA and flashinfer")
@pytest.mark.parametrize("batch", [1, 16])
def test_bf16_spec_speed_smoke(qwen3_h128, batch):  # noqa: F811
    common = dict(
        dtype=torch.bfloat16, attention_backend="flashinfer", page_size=16, max_seq_len=1024
    )
    prompts_ = copy_prompts(batch)
    for k in (0, 2, 4):
        # graphs up to max_running_req rows: room for a verify step of every request
        config = dict(common, speculative_tokens=k, max_running_req=max(16, batch * (k + 1)))
        run(qwen3_h128, prompts_[:1], 8, **config)  # compile and warm up
        tokens, seconds, stats = run(qwen3_h128, prompts_, 128, **config)
        assert [len(t) for t in tokens] == [128] * batch
        rate = stats.acceptance_rate if stats else 0.0
        print(
            f"batch {batch}, k={k}: {batch * 128 / seconds:.0f} tok/s, acceptance {rate:.2f} "
            "(python -m benchmark speculative times the steps)"
        )


def oracle_drafter(prompts_: list[list[int]], tokens: list[list[int]]):  # noqa: ANN201
    """A drafter with propose_drafts' contract (exactly k drafts for a sequence) that knows
    the answer: while a sequence is one of `prompts_` followed by the start of its `tokens`,
    the next k of those; otherwise k copies of the last token (a guess, mostly rejected)."""
    references = [list(p) + list(t) for p, t in zip(prompts_, tokens)]

    def propose(sequence: torch.Tensor, k: int, max_n: int, min_n: int) -> list[int]:
        seq = sequence.tolist()
        for prompt, full in zip(prompts_, references):
            if len(prompt) <= len(seq) and full[: len(seq)] == seq:
                drafts = full[len(seq) : len(seq) + k]
                return drafts + [seq[-1]] * (k - len(drafts))
        return [seq[-1]] * k

    return propose


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_oracle_drafts_are_all_accepted_in_float32(backend, layouts, monkeypatch):
    """Every verify step accepts all its drafts, so verify, the token pool's newest token and
    the rollback of the drafts' pages run on every step, and the tokens stay transformers'."""
    monkeypatch.setattr(policy_module, "propose_drafts", oracle_drafter(prompts(), hf_tokens()))
    tokens, stats = float32_spec_run(backend, 4)
    share = stats.accepted / stats.drafted
    print(
        f"oracle, {backend} float32 k=4: {stats.accepted} of {stats.drafted} drafts accepted "
        f"({share:.3f}) in {stats.verify_steps} verify steps; layouts "
        f"{layouts.count('decode')} as graph rows, {layouts.count('prefill')} as extends"
    )
    assert tuple(map(tuple, tokens)) == hf_tokens()
    assert stats.drafted >= 9 * (MAX_TOKENS // 2), "the oracle drafted on most steps"
    assert share == 1.0, "a draft equal to the model's greedy choice was rejected"
    # k + 1 tokens per verify step: about MAX_TOKENS / 5 steps per request, not MAX_TOKENS
    assert stats.verify_steps <= MAX_TOKENS // 2


@pytest.mark.skipif(not HAS_GPU, reason="needs CUDA and flashinfer")
def test_oracle_drafts_are_mostly_accepted_in_bf16_on_flashinfer(
    qwen3_h128,  # noqa: F811
    layouts,
    monkeypatch,
):
    """The reference is plain bf16 decoding of the same engine. A verify step computes its rows
    in another batch shape than a decode step, so bf16 rounding may part a sequence from the
    reference; from there the oracle only guesses. Most drafts must still be accepted."""
    common = dict(dtype=torch.bfloat16, attention_backend="flashinfer", page_size=16)
    prompts_ = copy_prompts(4)
    plain, _, _ = run(qwen3_h128, prompts_, 32, **common)
    monkeypatch.setattr(policy_module, "propose_drafts", oracle_drafter(prompts_, plain))
    tokens, _, stats = run(qwen3_h128, prompts_, 32, speculative_tokens=4, **common)
    share = stats.accepted / stats.drafted
    same = sum(a == b for ta, tb in zip(plain, tokens) for a, b in zip(ta, tb))
    print(
        f"oracle, flashinfer bf16 k=4: {stats.accepted} of {stats.drafted} drafts accepted "
        f"({share:.3f}) in {stats.verify_steps} verify steps, {layouts.count('decode')} as "
        f"graph rows; {same} of {4 * 32} tokens equal plain decoding's"
    )
    assert [len(t) for t in tokens] == [32] * 4
    assert share >= 0.5, "most drafts of the plain run's own tokens must be accepted"
    assert layouts.count("decode") > 0
