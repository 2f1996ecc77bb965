"""Chapter 24 tests: speculative decoding by prompt lookup (minisgl/speculative/).

The pieces first, each against its whole contract: the drafter (longest n first, the most
recent match, padding to exactly k, never past the sequence; against a brute-force
reference), acceptance (all, none, a prefix), the rollback of ledger and pages, how many
drafts a request may take, the verify batch a decode batch becomes, the forward that keeps
every token's logits. Then whole runs with a drafter that knows transformers' answer (all,
none or some drafts right): the tokens, the ledger, the pages, the token pool and the radix
tree after every step, and a request that stops at EOS or max_tokens inside a run of accepted
drafts. Then every scheduler mode gives transformers' greedy tokens with drafts on, the
n-gram drafter gets drafts accepted on text that repeats, and (slow) SmolLM2 and two
tensor-parallel ranks.
"""

from __future__ import annotations

import copy
import itertools
import random
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    SMOLLM2,
    TINY_MODELS,
    assert_same_trace,
    greedy,
    hf_greedy_cached,
    load_tokenizer,
    require_model,
    random_prompts,
    run_prompts,
    scheduler_trace,
)
from course.differential import assert_same_call, call_differences, reference_function
from course.differential import use_reference_stubs
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import ForwardOutput
from minisgl.engine.graph import GraphRunner
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.cache import CacheManager, create_prefix_cache
from minisgl.scheduler.scheduler import ForwardInput, PolicyLayer, StepPolicy
from minisgl.scheduler.utils import TokenOutput
from minisgl.speculative import policy as policy_module
from minisgl.speculative.ngram import propose_drafts
from minisgl.speculative import verify as verify_module
from minisgl.speculative.policy import SpeculativeDecoder, VerifyBatch, verifiable
from minisgl.speculative.verify import accepted_length, roll_back
from minisgl.utils import div_ceil

QWEN3 = TINY_MODELS["qwen3"]


def make_scheduler(model: Path = QWEN3, **overrides: Any) -> Scheduler:
    config: dict[str, Any] = dict(
        device="cpu",
        show_progress=False,
        cache_type="naive",
        enable_overlap=False,
        max_running_req=8,
        num_pages=256,
        max_extend_tokens=64,
        speculative_tokens=4,
    )
    return Scheduler(SchedulerConfig(str(model), **(config | overrides)))


def decoder(scheduler: Scheduler) -> SpeculativeDecoder:
    assert isinstance(scheduler.policy, SpeculativeDecoder)
    return scheduler.policy


# ----- the drafter -------------------------------------------------------------------------


def reference_drafts(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """The drafter's contract, written out the slow way."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                return follow + [tokens[-1]] * (k - len(follow))
    return [tokens[-1]] * k


def test_the_longest_n_wins_over_a_more_recent_shorter_match() -> None:
    tokens = torch.tensor([1, 2, 3, 7, 8, 9, 3, 5, 6, 1, 2, 3])
    # [1, 2, 3] matched at 0 (followed by 7 8 9 3); [3] alone matches later (followed by 5).
    assert propose_drafts(tokens, 4, 3, 1) == [7, 8, 9, 3]
    assert propose_drafts(tokens, 2, 1, 1) == [5, 6]


def test_the_most_recent_match_of_n_is_taken() -> None:
    tokens = torch.tensor([4, 5, 1, 4, 5, 2, 9, 4, 5])
    assert propose_drafts(tokens, 3, 2, 2) == [2, 9, 4]


def test_a_match_near_the_end_is_padded_with_its_last_token_never_read_past() -> None:
    tokens = torch.tensor([3, 3, 3])
    # [3, 3] at 0 is followed by the last token only: one real draft, then padding.
    assert propose_drafts(tokens, 4, 2, 1) == [3, 3, 3, 3]
    tokens = torch.tensor([6, 1, 2, 6, 1])
    assert propose_drafts(tokens, 5, 2, 1) == [2, 6, 1, 1, 1]


def test_no_match_repeats_the_last_token_and_min_n_is_respected() -> None:
    tokens = torch.tensor([1, 2, 3, 4, 9, 4])
    assert propose_drafts(tokens, 3, 3, 2) == [4, 4, 4]  # [4] matches, but n >= 2 is asked
    assert propose_drafts(tokens, 3, 3, 1) == [9, 4, 4]
    assert propose_drafts(torch.tensor([8]), 2, 3, 1) == [8, 8]
    assert propose_drafts(torch.tensor([8, 9]), 0, 3, 1) == []


@pytest.mark.parametrize("seed", range(6))
def test_the_drafter_matches_the_brute_force_reference(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        tokens = [rng.randrange(4) for _ in range(rng.randint(1, 24))]
        k, min_n = rng.randint(1, 6), rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        got = propose_drafts(torch.tensor(tokens, dtype=torch.int32), k, max_n, min_n)
        assert got == reference_drafts(tokens, k, max_n, min_n), (tokens, k, max_n, min_n)
        assert all(isinstance(t, int) for t in got)


# ----- acceptance and rollback ---------------------------------------------------------------


def test_accepted_length_counts_the_leading_agreeing_drafts_only() -> None:
    assert accepted_length([5, 6, 7], [5, 6, 7, 8]) == 3
    assert accepted_length([5, 6, 7], [4, 6, 7, 8]) == 0
    assert accepted_length([5, 6, 7], [5, 1, 7, 8]) == 1  # the 7 after a miss does not count
    assert accepted_length([5, 6, 7], [5, 6, 1, 8]) == 2
    assert accepted_length([], [3]) == 0


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seq_len", [9, 10, 12, 14])
def test_roll_back_sets_the_ledger_and_frees_exactly_the_pages_beyond(
    page_size: int, seq_len: int
) -> None:
    table = torch.zeros(2, 64, dtype=torch.int32)
    cache = CacheManager(
        16, page_size, table, create_prefix_cache("naive", torch.device("cpu"), page_size)
    )
    req = Req(torch.arange(8, dtype=torch.int32), 1, 0, 20, 0, SamplingParams())
    req.device_len = 14  # the last token at 7 and six drafts, as a verify step leaves it
    cache.allocate_paged([req])
    free_before = cache.num_free_pages
    row = table[1].clone()
    roll_back(cache, req, seq_len)
    assert (req.device_len, req.cached_len) == (seq_len, seq_len - 1)
    kept = div_ceil(seq_len - 1, page_size)
    freed = div_ceil(14, page_size) - kept
    assert cache.num_free_pages == free_before + freed
    assert (
        cache.free_slots[free_before:].tolist()
        == row[kept * page_size : div_ceil(14, page_size) * page_size : page_size].tolist()
    )
    with cache.lazy_free_region():  # inside a region the pages wait for its end
        req.device_len = 14
        cache.allocate_paged([req])
        free_inside = cache.num_free_pages
        roll_back(cache, req, seq_len)
        assert cache.num_free_pages == free_inside
    assert cache.num_free_pages == free_before + freed


# ----- how many drafts, and the verify batch --------------------------------------------------


def test_draft_counts_cap_at_remain_len_minus_one_and_fall_back_when_no_room() -> None:
    scheduler = make_scheduler(page_size=4, speculative_tokens=4)
    spec = decoder(scheduler)
    reqs = [
        Req(torch.arange(5, dtype=torch.int32), 0, 4, 10, 0, greedy(10)),  # remain 10
        Req(torch.arange(5, dtype=torch.int32), 1, 4, 3, 1, greedy(3)),  # remain 3
        Req(torch.arange(5, dtype=torch.int32), 2, 4, 1, 2, greedy(1)),  # remain 1
    ]
    assert spec.draft_counts(reqs) == [4, 2, 0]
    assert spec.draft_counts(reqs[2:]) is None  # nobody can take a draft
    cache = scheduler.cache_manager
    # The step computes positions 4..8, 4..6 and 4: pages from ceil(4 / 4) = 1 up to
    # ceil(9 / 4) = 3, ceil(7 / 4) = 2 and ceil(5 / 4) = 2: 2 + 1 + 1 = 4 pages.
    cache.free_slots = cache.free_slots[:4]
    assert spec.draft_counts(reqs) == [4, 2, 0]
    cache.free_slots = cache.free_slots[:3]
    assert spec.draft_counts(reqs) is None


def test_a_decode_batch_becomes_a_verify_batch_with_drafts_in_the_token_pool() -> None:
    scheduler = make_scheduler(page_size=2, speculative_tokens=3)
    spec = decoder(scheduler)
    table_manager = scheduler.table_manager
    ids = [
        torch.tensor([5, 6, 7, 5, 6], dtype=torch.int32),
        torch.tensor([9, 8], dtype=torch.int32),
    ]
    reqs = [Req(ids[0], 3, 4, 10, 0, greedy(10)), Req(ids[1], 5, 1, 2, 1, greedy(2))]
    for req in reqs:
        table_manager.write_prompt(req)
    batch = spec.draft(reqs)
    assert isinstance(batch, VerifyBatch) and batch.phase == "prefill" and batch.reqs == reqs
    assert batch.requests == reqs
    assert batch.drafts == [[7, 5, 6], [8]]
    assert [(r.cached_len, r.device_len) for r in reqs] == [(4, 8), (1, 3)]
    assert table_manager.token_pool[3, :8].tolist() == [5, 6, 7, 5, 6, 7, 5, 6]
    assert table_manager.token_pool[5, :3].tolist() == [9, 8, 8]
    assert len(reqs[0].input_ids) == 5, "the host sequence holds only real tokens"


class Picks(PolicyLayer):
    """A policy whose next batch is given: what the speculative policy wraps, in a test."""

    def __init__(self, inner: StepPolicy, batch: Batch | None) -> None:
        super().__init__(inner)
        self.batch = batch

    def pick_batch(self) -> Batch | None:
        return self.batch


def test_the_picker_drafts_only_for_greedy_plain_decode_batches() -> None:
    scheduler = make_scheduler()
    spec = decoder(scheduler)
    req = Req(torch.tensor([1, 2, 1, 2], dtype=torch.int32), 0, 3, 8, 0, greedy(8))
    scheduler.table_manager.write_prompt(req)
    plain = spec.inner

    def inner_picks(batch: Batch | None) -> None:
        spec.inner = Picks(plain, batch)

    inner_picks(Batch([req], "prefill"))
    assert spec.pick_batch().phase == "prefill" and not isinstance(spec.pick_batch(), VerifyBatch)
    inner_picks(None)
    assert spec.pick_batch() is None
    sampled = Req(
        torch.tensor([1, 2], dtype=torch.int32), 1, 1, 8, 1, SamplingParams(temperature=1.0)
    )
    inner_picks(Batch([req, sampled], "decode"))
    assert not isinstance(spec.pick_batch(), VerifyBatch)

    class OtherParams(SamplingParams):  # a later chapter's rules
        pass

    ruled = Req(torch.tensor([1, 2], dtype=torch.int32), 1, 1, 8, 1, OtherParams())
    inner_picks(Batch([req, ruled], "decode"))
    assert not isinstance(spec.pick_batch(), VerifyBatch)
    inner_picks(Batch([req], "decode"))
    batch = spec.pick_batch()
    assert isinstance(batch, VerifyBatch) and batch.drafts == [[1, 2, 2, 2]]


# ----- whole runs with a drafter that knows the answer ---------------------------------------


def oracle(
    monkeypatch: pytest.MonkeyPatch, prompt: list[int], truth: list[int], right: int
) -> None:
    """Drafts whose first `right` tokens are transformers' next tokens, the rest wrong."""

    def drafts(tokens: torch.Tensor, k: int, max_n: int, min_n: int) -> list[int]:
        done = len(tokens) - len(prompt)
        nexts = (truth[done:] + [0] * k)[:k]
        return [t if i < right else (t + 1) % 400 for i, t in enumerate(nexts)]

    monkeypatch.setattr(policy_module, "propose_drafts", drafts)


@pytest.mark.parametrize(
    "right,page_size,cache_type",
    [(4, 1, "naive"), (0, 4, "naive"), (2, 4, "radix"), (1, 2, "radix")],
)
def test_each_verify_step_emits_the_accepted_drafts_and_one_more_and_rolls_back(
    monkeypatch: pytest.MonkeyPatch, right: int, page_size: int, cache_type: str
) -> None:
    prompt, max_tokens, k = random_prompts(3, 1, longest=12)[0], 23, 4
    truth = hf_greedy_cached(QWEN3, prompt, max_tokens)
    oracle(monkeypatch, prompt, truth, right)
    scheduler = make_scheduler(
        page_size=page_size, cache_type=cache_type, speculative_tokens=k, num_pages=64
    )
    spec = decoder(scheduler)
    uid = scheduler.add_request(prompt, greedy(max_tokens))
    got: list[int] = []
    drafted_sum = accepted_sum = 0
    first = scheduler.step()  # the prefill
    got += [o.token for o in first]
    req = scheduler.decode_manager.running_reqs[uid]
    while scheduler.has_work:
        before = len(got)
        drafted = min(k, max_tokens - before - 1)
        drafted_sum += drafted
        accepted_sum += min(drafted, right)
        outputs = scheduler.step()
        got += [o.token for o in outputs]
        assert all(o.uid == uid for o in outputs)
        assert len(outputs) == min(drafted, right) + 1, "accepted drafts and the model's own"
        assert got == truth[: len(got)]
        if outputs[-1].finished:
            assert outputs[-1].finish_reason == "length" and len(got) == max_tokens
            assert all(o.finish_reason is None for o in outputs[:-1])
            break
        seq = len(prompt) + len(got)
        assert (req.device_len, req.cached_len) == (seq, seq - 1)
        assert req.input_ids.tolist() == prompt + got
        row = scheduler.table_manager.token_pool[req.table_idx, :seq]
        assert row.tolist() == prompt + got
        # whatever the tree holds of it, the request's pages are those of [0, cached_len)
        cache = scheduler.cache_manager
        owned = div_ceil(req.cached_len, page_size)
        assert cache.num_free_pages == cache.num_pages - owned
        # the row names `owned` distinct pages, none of them on the free list
        firsts = cache.page_table[req.table_idx, : owned * page_size : page_size].tolist()
        assert len(set(firsts)) == owned and all(f % page_size == 0 for f in firsts)
        assert not set(firsts) & set(cache.free_slots.tolist()), "a page in use is free"
    assert got == truth
    assert scheduler.status().integrity_ok
    stats = spec.stats
    assert (stats.drafted, stats.accepted) == (drafted_sum, accepted_sum)
    assert stats.per_request[uid] == [drafted_sum, accepted_sum]
    if cache_type == "radix":  # only the real sequence went into the tree
        tree = scheduler.cache_manager.prefix_cache
        ids = torch.tensor(prompt + got, dtype=torch.int32)
        cached = (len(ids) - 1) // page_size * page_size
        assert tree.size_info.total_size == cached
        assert len(tree.match_prefix(ids).indices) == cached


def test_the_verify_forward_keeps_every_tokens_greedy_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompt = random_prompts(4, 1, longest=10)[0]
    truth = hf_greedy_cached(QWEN3, prompt, 8)
    oracle(monkeypatch, prompt, truth, right=3)
    scheduler = make_scheduler(speculative_tokens=3)
    spec = decoder(scheduler)
    scheduler.add_request(prompt, greedy(8))
    scheduler.step()  # the prefill
    batch = scheduler.policy.pick_batch()
    assert isinstance(batch, VerifyBatch)
    forward_input = scheduler._prepare_batch(batch)
    steps = len(scheduler.stats.steps)
    output = scheduler.policy.run_batch(forward_input)
    assert batch.attn_metadata.last_indices.tolist() == [0, 1, 2, 3]
    # after the last token and each of three right drafts: the next four true tokens
    assert output.next_tokens_cpu.tolist() == truth[1:5]
    assert scheduler.stats.steps[steps:] == [("decode", 1, 4)]
    req = batch.reqs[0]
    assert (req.cached_len, req.device_len) == (len(prompt), len(prompt) + 4), "settled later"
    outputs = scheduler.policy.settle_batch((forward_input, output))
    assert [o.token for o in outputs] == truth[1:5]
    assert spec.stats.verify_steps == 1


@pytest.mark.parametrize("stop_at", [1, 3])
def test_eos_inside_the_accepted_run_stops_where_plain_decoding_stops(
    monkeypatch: pytest.MonkeyPatch, stop_at: int
) -> None:
    prompt = random_prompts(5, 1, longest=10)[0]
    truth = hf_greedy_cached(QWEN3, prompt, 12)
    eos = truth[stop_at]
    expected = truth[: truth.index(eos) + 1]
    oracle(monkeypatch, prompt, truth, right=4)
    results = []
    for k in (0, 4):
        scheduler = make_scheduler(speculative_tokens=k, page_size=2)
        scheduler.eos_token_ids = {eos}
        uid = scheduler.add_request(prompt, SamplingParams(max_tokens=12))
        outputs = []
        while scheduler.has_work:
            outputs += scheduler.step()
        assert scheduler.status().integrity_ok and scheduler.status().used_pages == 0
        assert scheduler.table_manager.available_size == 8
        results.append([(o.uid, o.token, o.finish_reason) for o in outputs])
        assert [o.token for o in outputs] == expected
        assert outputs[-1].finish_reason == "stop" and uid == outputs[-1].uid
    assert results[0] == results[1]


# ----- whole runs: every mode gives transformers' tokens ------------------------------------

MODES = {
    "radix": dict(cache_type="radix", page_size=4),
    "naive-page1": dict(cache_type="naive", page_size=1),
    "chunked": dict(cache_type="radix", max_extend_tokens=8, page_size=2),
    "overlap-asked": dict(cache_type="radix", enable_overlap=True),
    "mixed": dict(cache_type="radix", mixed_batches=True, max_extend_tokens=16),
    "optimistic": dict(cache_type="radix", admission="optimistic", num_pages=40, page_size=2),
    "k1-ngram2": dict(cache_type="naive", speculative_tokens=1, ngram_min=2),
}


def repeating_prompts(seed: int, count: int) -> list[list[int]]:
    """Random phrases said a few times over: text the n-gram drafter can follow."""
    rng = random.Random(seed)
    return [
        [rng.randrange(10, 400) for _ in range(rng.randint(2, 8))] * rng.randint(1, 4)
        for _ in range(count)
    ]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_gives_transformers_greedy_tokens_with_drafts_on(mode: str) -> None:
    prompts = repeating_prompts(11, 8)
    max_tokens = [random.Random(i).randint(1, 24) for i in range(8)]
    scheduler = make_scheduler(**MODES[mode])
    tokens = run_prompts(scheduler, prompts, max_tokens)
    for p, m, got in zip(prompts, max_tokens, tokens):
        assert got == hf_greedy_cached(QWEN3, p, m)
    stats = decoder(scheduler).stats
    assert stats.drafted > 0 and stats.verify_steps > 0
    assert scheduler.status().generated_tokens == sum(max_tokens)
    assert scheduler.status().used_pages == 0
    assert not scheduler.overlap, "drafts need the last step's tokens: no overlap"
    if mode == "optimistic":
        assert decoder(scheduler).inner.preemptor.preemptions > 0, "the pool was tight enough"


def test_the_ngram_drafter_gets_drafts_accepted_on_text_that_repeats() -> None:
    plain = make_scheduler(speculative_tokens=0, enable_overlap=True)
    assert not isinstance(plain.policy, SpeculativeDecoder) and plain.overlap  # off: as before
    scheduler = make_scheduler(cache_type="radix", num_pages=1024)
    prompts = [base * 4 for base in random_prompts(0, 4, longest=8)]
    tokens = run_prompts(scheduler, prompts, [40] * 4)
    for p, got in zip(prompts, tokens):
        assert got == hf_greedy_cached(QWEN3, p, 40)
    stats = decoder(scheduler).stats
    assert stats.accepted > 0, "some drafts must be right, or the test checks nothing"
    assert 0.0 < stats.acceptance_rate <= 1.0
    assert sum(a for _, a in stats.per_request.values()) == stats.accepted
    assert sum(d for d, _ in stats.per_request.values()) == stats.drafted
    plain_steps = 4 * 39  # one token per request and decode step without drafts
    decode_rows = sum(size for phase, size, _ in scheduler.stats.steps if phase == "decode")
    assert decode_rows == plain_steps - stats.accepted


@pytest.mark.slow
def test_smollm2_copies_text_with_drafts_and_matches_transformers() -> None:
    model = require_model(SMOLLM2)
    text = "The river rises in the hills above the town and runs east for forty miles."
    question = f"Repeat the following text exactly, word for word:\n\n{text}"
    chat = load_tokenizer(model).apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    prompts = [list(chat if isinstance(chat, list) else chat["input_ids"])]
    scheduler = make_scheduler(model, cache_type="radix", num_pages=1024)
    tokens = run_prompts(scheduler, prompts, [20])
    assert tokens[0] == hf_greedy_cached(model, prompts[0], 20)
    assert decoder(scheduler).stats.acceptance_rate > 0.5


@pytest.mark.slow
@pytest.mark.time_limit(120)  # two processes, each loading the model
def test_two_tensor_parallel_ranks_draft_alike_and_match_transformers() -> None:
    from minisgl.llm import LLM

    prompts = repeating_prompts(12, 6)
    config = dict(show_progress=False, speculative_tokens=3, cache_type="radix", max_running_req=8)
    with LLM(str(QWEN3), tp_size=2, **config) as llm:
        outputs = llm.generate(prompts, greedy(16))
        stats = llm.scheduler.policy.stats
        assert llm.scheduler.status().integrity_ok
    assert stats.drafted > 0
    for p, out in zip(prompts, outputs):
        assert out["token_ids"] == hf_greedy_cached(QWEN3, p, 16)


def test_with_decode_graphs_a_verify_step_runs_as_rows_that_fit_a_graph_with_the_same_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU a verify step is laid out as decode rows (`DraftRow`, one per token), with the
    drafts capped so that the rows fit the largest graph. Chapter 18's stand-in graphs over
    chapter 17's stand-in FlashInfer run it here; every token must be transformers'."""
    from test_ch17_gpu_attention import FakeFlashInfer
    from test_ch18_cuda_graph import fake_gpu

    fake = FakeFlashInfer()
    fake_gpu(monkeypatch, fake)
    prompts = repeating_prompts(13, 6)
    max_tokens = [6, 9, 12, 16, 20, 24]
    scheduler = make_scheduler(
        attention_backend="flashinfer", page_size=4, cuda_graph_max_bs=12, speculative_tokens=3
    )
    spec = decoder(scheduler)
    layouts: list[tuple[str, int, int]] = []
    draft = spec.draft

    def spy(reqs: list[Req]) -> VerifyBatch | None:
        batch = draft(reqs)
        if batch is not None:
            layouts.append((batch.phase, batch.size, len(batch.requests)))
            if batch.is_decode:
                rows = [(r.table_idx, r.cached_len, r.device_len, r.extend_len) for r in batch.reqs]
                assert rows == [
                    (q.table_idx, q.cached_len + j, q.cached_len + j + 1, 1)
                    for q in batch.requests
                    for j in range(q.extend_len)
                ], "one row per token, in the extend's order"
        return batch

    monkeypatch.setattr(spec, "draft", spy)
    tokens = run_prompts(scheduler, prompts, max_tokens)
    for p, m, got in zip(prompts, max_tokens, tokens):
        assert got == hf_greedy_cached(QWEN3, p, m)
    # With graphs the drafts are capped so that a step's rows fit the largest graph (12): six
    # requests verify one draft each, three or fewer all three.
    assert all(phase == "decode" and rows <= 12 for phase, rows, _ in layouts), layouts
    assert (("decode", 12, 6)) in layouts, "six requests: 12 // 6 - 1 = 1 draft each"
    assert any(n <= 3 and rows == 4 * n for _, rows, n in layouts), "k = 3 when they fit"
    replays = {n: g.replays for n, g in scheduler.engine.runner.graphs.items()}
    assert sum(replays.values()) >= sum(1 for phase, _, _ in layouts if phase == "decode")


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. The policy's stubs run on scheduler states taken from real
# runs with drafts on (greedy and sampled requests, a tight pool, a radix cache), copied into a
# scheduler without an engine: its managers and the methods a policy calls (`append_tokens`,
# `release`), and an engine that stands in for the runner (CUDA graphs of some size, or none)
# and for the forward. Then whole runs: every batch (with its drafts in the input ids), token,
# the running and waiting sets, the free pages and the drafter's counts, step by step, yours
# against the chapter's reference stubs.


@settings(max_examples=60)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=24),
    k=st.integers(0, 6),
    min_n=st.integers(1, 3),
    longer=st.integers(0, 3),
    dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_propose_drafts_matches_the_reference(tokens, k, min_n, longer, dtype):
    """Sequences of a small alphabet (matches of every n, near the end, none), k from 0,
    n-gram sizes past the sequence's length."""
    assert_same_call(propose_drafts, torch.tensor(tokens, dtype=dtype), k, min_n + longer, min_n)


@settings(max_examples=50)
@given(
    drafts=st.lists(st.integers(0, 3), max_size=6),
    agree=st.integers(0, 6),
    rest=st.lists(st.integers(0, 3), min_size=7, max_size=7),
)
def test_accepted_length_matches_the_reference(drafts, agree, rest):
    """Choices that agree with the drafts for a while, then anything (agreeing again too)."""
    choices = (drafts[:agree] + rest)[: len(drafts) + 1]
    assert_same_call(accepted_length, drafts, choices)


def rolled_back_in_a_region(roll: Any) -> Any:
    """`roll` inside a lazy_free_region (as settle_batch calls it), returning the free list
    as it is inside the region: freed pages must wait for the region's end."""

    def run(cache: CacheManager, req: Req, seq_len: int, lazy: bool) -> list[int]:
        if not lazy:
            roll(cache, req, seq_len)
            return cache.free_slots.tolist()
        with cache.lazy_free_region():
            roll(cache, req, seq_len)
            return cache.free_slots.tolist()

    return run


@settings(max_examples=50)
@given(
    cached=st.integers(0, 20),
    drafts=st.integers(0, 6),
    accepted=st.integers(0, 6),
    page_size=st.sampled_from([1, 2, 4]),
    lazy=st.booleans(),
)
def test_roll_back_matches_the_reference(cached, drafts, accepted, page_size, lazy):
    """A request verified with 0 to 6 drafts, of which any number were kept (all: nothing to
    free), cached prefixes ending at, inside and one past a page, inside a lazy region or not:
    its ledger, and the free list inside the region and after."""
    accepted = min(accepted, drafts)

    def build() -> tuple:
        table = torch.arange(4 * 64, dtype=torch.int32).view(4, 64)
        prefix = create_prefix_cache("naive", torch.device("cpu"), page_size)
        cache = CacheManager(48 // page_size, page_size, table, prefix)
        req = Req(torch.arange(10, 11 + cached, dtype=torch.int32), 2, 0, 30, 0, greedy(30))
        req.device_len += drafts  # the last token and its drafts, as draft leaves them
        cache.allocate_paged([req])
        req.cached_len = cached
        for token in range(accepted + 1):  # what settle_batch appends
            req.append_host(50 + token)
        return cache, req, len(req.input_ids), lazy

    call = call_differences(
        rolled_back_in_a_region(roll_back),
        build=build,
        reference=rolled_back_in_a_region(reference_function(verify_module, "roll_back")),
    )
    assert not call, "roll_back differs from the reference:\n  " + "\n  ".join(call)


class OtherParams(SamplingParams):
    """A later chapter's parameters (a grammar's, say): a subclass of SamplingParams."""


@settings(max_examples=40)
@given(
    temperature=st.sampled_from([0.0, 0.7]),
    top_k=st.sampled_from([-1, 1, 5]),
    subclass=st.booleans(),
)
def test_verifiable_matches_the_reference(temperature, top_k, subclass):
    """Greedy by temperature or by top_k = 1, sampled, plain parameters or a subclass."""
    kind = OtherParams if subclass else SamplingParams
    params = kind(temperature=temperature, top_k=top_k, max_tokens=8)
    assert_same_call(verifiable, Req(torch.tensor([1, 2], dtype=torch.int32), 0, 0, 8, 0, params))


# Scheduler states from real runs: (config overrides, prompts' seed, sampled requests).
DECODER_RUNS = {
    "greedy, naive, k 4": (dict(page_size=2, speculative_tokens=4, num_pages=128), 31, False),
    "sampled among greedy, radix, k 3": (
        dict(cache_type="radix", page_size=4, speculative_tokens=3, max_extend_tokens=16),
        32,
        True,
    ),
    "optimistic, a tight pool, page 1": (
        dict(admission="optimistic", page_size=1, num_pages=72, speculative_tokens=4),
        33,
        False,
    ),
}
LIGHT_FIELDS = (
    "decode_manager",
    "table_manager",
    "cache_manager",
    "overlap",
    "finished_reqs",
    "prefill_manager",
    "config",
    "eos_token_ids",
    "stats",
    "_last_phase",
    "pending_aborts",
)


def decoder_requests(seed: int, sampled: bool) -> list[tuple[list[int], SamplingParams]]:
    """Eight requests of phrases said over (ids 10 to 19: the drafter finds matches), half of
    them stopping at end-of-sequence; with `sampled`, one sampled and one of OtherParams
    among them (which keep the batch from being verified while they run)."""
    rng = random.Random(seed)
    requests = []
    for i in range(8):
        phrase = [rng.randrange(10, 20) for _ in range(rng.randint(2, 5))]
        max_tokens, ignore_eos = rng.randint(2, 14), rng.random() < 0.5
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        if sampled and i == 3:
            params = SamplingParams(temperature=1.0, seed=5, max_tokens=3, ignore_eos=True)
        if sampled and i == 6:
            params = OtherParams(max_tokens=3, ignore_eos=True)
        requests.append((phrase * rng.randint(1, 4), params))
    return requests


class Released(list):
    """The scheduler's `finished_reqs` in a copy: a list with set's `add`, so that both sides'
    requests compare by their state (a set of requests compares only by identity)."""

    def add(self, req: Req) -> None:
        if not any(r is req for r in self):
            self.append(req)


@dataclass
class FakeEngine:
    """What a policy reads of the engine: the runner (a GraphRunner of `graph_rows` or not),
    and a forward that records what it was given and returns token ids 100, 101, ..."""

    graph_rows: int | None = None
    forwards: list[str] = field(default_factory=list)

    @property
    def runner(self) -> Any:
        if self.graph_rows is None:
            return object()
        runner = GraphRunner.__new__(GraphRunner)
        runner.max_batch_size = self.graph_rows
        return runner

    def forward_batch(self, batch: Batch, sample_args: Any) -> ForwardOutput:
        meta = batch.attn_metadata
        self.forwards.append(
            f"{batch.phase} forward of {batch.input_ids.tolist()}, last indices "
            f"{meta.last_indices.tolist()} ({meta.last_indices.dtype}), {sample_args}"
        )
        tokens = torch.arange(100, 100 + len(meta.last_indices))
        return ForwardOutput(tokens, tokens.clone(), None)


class Inner(PolicyLayer):
    """The policy a decoder wraps, in a copy: the scheduler's own steps, recorded."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(scheduler)
        self.calls: list[str] = []

    def run_batch(self, forward_input: Any) -> Any:
        self.calls.append(f"run_batch of a {forward_input.batch.phase} batch")
        return "the inner policy's output"

    def settle_batch(self, data: Any) -> list[TokenOutput]:
        self.calls.append("settle_batch " + ("of nothing" if data is None else "of a batch"))
        return [TokenOutput(-1, -1)]


@dataclass
class DecoderState:
    """A scheduler's state before one of its steps, deep-copied."""

    run: str
    fields: dict[str, Any]

    def __repr__(self) -> str:
        running = list(self.fields["decode_manager"].running_reqs)
        return f"<a state of run {self.run!r}: running {running}>"

    def decoder(self, graph_rows: int | None = None, k: int | None = None) -> SpeculativeDecoder:
        """A fresh copy of the state as a scheduler without an engine, and a decoder around
        it (its inner policy records what it is passed)."""
        from minisgl.kvcache import radix_cache

        radix_cache._clock = itertools.count(10**6)  # both sides stamp the same accesses alike
        light = Scheduler.__new__(Scheduler)
        vars(light).update(copy.deepcopy(self.fields))
        light.finished_reqs = Released(sorted(light.finished_reqs, key=lambda r: r.uid))
        light.engine = FakeEngine(graph_rows)
        light._last_data = None
        for req in light.decode_manager.running_reqs.values():
            req._host_numpy = req._host_buffer.numpy()  # a copy's own buffer, as append_host writes
        decoder = SpeculativeDecoder(light, Inner(light))
        decoder.k = decoder.k if k is None else k
        return decoder


class DecoderStates(list):
    def __repr__(self) -> str:
        return f"<{len(self)} scheduler states of DECODER_RUNS>"


@pytest.fixture(scope="module")
def states() -> Iterator[DecoderStates]:
    """Every state before a step of the runs, in which requests are running. The runs are the
    reference's: the states are inputs, the same whatever your code does."""
    from minisgl.kvcache import radix_cache

    clock = radix_cache._clock
    found = DecoderStates()
    with use_reference_stubs(24):
        for run, (overrides, seed, sampled) in DECODER_RUNS.items():
            scheduler = make_scheduler(**overrides)
            for ids, params in decoder_requests(seed, sampled):
                scheduler.add_request(ids, params)
            while scheduler.has_work:
                if scheduler.decode_manager.running_reqs:
                    fields = {name: vars(scheduler)[name] for name in LIGHT_FIELDS}
                    found.append(DecoderState(run, copy.deepcopy(fields)))
                scheduler.step()
    yield found
    radix_cache._clock = clock


GRAPH_ROWS = st.sampled_from([None, None, 1, 4, 9, 16])  # the largest graph's rows, or none


def cut_pool(decoder: SpeculativeDecoder, free: int | None) -> None:
    """Leave `free` pages on the free list (None: as it was)."""
    if free is not None:
        cache = decoder.scheduler.cache_manager
        cache.free_slots = cache.free_slots[:free]


@settings(max_examples=40)
@given(data=st.data())
def test_draft_counts_matches_the_reference(states, data):
    """The running requests (near max_tokens or not) of any state, k from 0, graphs of any
    size or none, pools cut to the pages the step needs or fewer."""
    state = data.draw(st.sampled_from(states))
    graph_rows, k = data.draw(GRAPH_ROWS), data.draw(st.integers(0, 5))
    free = data.draw(st.one_of(st.none(), st.integers(0, 12)))

    def build() -> tuple:
        decoder = state.decoder(graph_rows, k)
        cut_pool(decoder, free)
        return decoder, list(decoder.scheduler.decode_manager.running_reqs.values())

    assert_same_call(SpeculativeDecoder.draft_counts, build=build)


@settings(max_examples=40)
@given(data=st.data())
def test_draft_matches_the_reference(states, data):
    """The verify batch (its layout, requests, drafts) and everything after: the ledgers, the
    token pool's rows, the host sequences; with graphs of any size or none."""
    state = data.draw(st.sampled_from(states))
    graph_rows, k = data.draw(GRAPH_ROWS), data.draw(st.integers(1, 5))
    free = data.draw(st.one_of(st.none(), st.integers(0, 12)))

    def build() -> tuple:
        decoder = state.decoder(graph_rows, k)
        cut_pool(decoder, free)
        return decoder, list(decoder.scheduler.decode_manager.running_reqs.values())

    assert_same_call(SpeculativeDecoder.draft, build=build)


@settings(max_examples=30)
@given(data=st.data())
def test_pick_batch_matches_the_reference(states, data):
    """The scheduler's own pick (a prefill, or a decode of greedy requests, with a sampled one
    or one of a subclass's rules among them or not) turned into a verify batch or passed
    on."""
    state = data.draw(st.sampled_from(states))
    graph_rows, free = data.draw(GRAPH_ROWS), data.draw(st.one_of(st.none(), st.integers(0, 12)))
    last_phase = data.draw(st.sampled_from(["prefill", "decode", None]))
    spoiler = data.draw(st.sampled_from([None, None, 0.7, 0.0]))  # None: every request as it is

    def build() -> tuple:
        decoder = state.decoder(graph_rows)
        decoder.inner = decoder.scheduler  # Scheduler.pick_batch: prefill or decode
        decoder.scheduler._last_phase = last_phase
        cut_pool(decoder, free)
        if spoiler is not None:  # the last running request samples, or has a subclass's rules
            req = list(decoder.scheduler.decode_manager.running_reqs.values())[-1]
            kind = SamplingParams if spoiler else OtherParams
            req.sampling_params = kind(temperature=spoiler, max_tokens=req.output_len)
        return (decoder,)

    assert_same_call(SpeculativeDecoder.pick_batch, build=build)


def prepared(decoder: SpeculativeDecoder, verify: bool) -> ForwardInput | None:
    """The running requests' step as the scheduler prepares it: the reference's verify batch
    (None if it drafts nothing) or a plain decode batch, with its pages and inputs, and the
    backend's last_indices (each request's last token)."""
    scheduler = decoder.scheduler
    reqs = list(scheduler.decode_manager.running_reqs.values())
    batch: Batch | None = Batch(reqs, "decode")
    if verify:
        batch = reference_function(SpeculativeDecoder, "draft")(decoder, reqs)
        if batch is None:
            return None
    scheduler.cache_manager.allocate_paged(batch.reqs)
    scheduler.table_manager.prepare_inputs(batch)
    ends = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0) - 1
    batch.attn_metadata = types.SimpleNamespace(last_indices=ends)
    return ForwardInput(batch, "the sampling arguments", frozenset())


@settings(max_examples=20)
@given(data=st.data())
def test_run_batch_matches_the_reference(states, data):
    """A verify batch of either layout (graphs or none) or a plain batch (passed on): what the
    engine's forward is given (its last indices above all) and returns, and the step recorded
    in the scheduler's stats."""
    state = data.draw(st.sampled_from(states))
    graph_rows, verify = data.draw(GRAPH_ROWS), data.draw(st.booleans())

    def build() -> tuple:
        decoder = state.decoder(graph_rows)
        return decoder, prepared(decoder, verify)

    assume(build()[1] is not None)
    assert_same_call(SpeculativeDecoder.run_batch, build=build)


@settings(max_examples=40)
@given(
    data=st.data(),
    agree=st.lists(st.integers(0, 6), min_size=8, max_size=8),
    noise=st.lists(st.integers(0, 9), min_size=64, max_size=64),
    copy_in_flight=st.booleans(),
)
def test_settle_batch_matches_the_reference(states, data, agree, noise, copy_in_flight):
    """Choices that agree with each request's drafts for 0 to all of them, end-of-sequence ids
    inside the accepted run, requests at max_tokens, tokens still on their way to the host;
    a plain batch and no batch are passed on. The outputs, and everything after: ledgers,
    pages (rolled back or released), token pool, host sequences, stats of both."""
    state = data.draw(st.sampled_from(states))
    graph_rows, verify = data.draw(GRAPH_ROWS), data.draw(st.sampled_from([True, True, False]))
    nothing = data.draw(st.integers(0, 9)) == 0

    def build() -> tuple:
        decoder = state.decoder(graph_rows)
        decoder.scheduler.eos_token_ids = {2, 12}
        forward_input = prepared(decoder, verify)
        if nothing or forward_input is None:
            return decoder, None
        batch = forward_input.batch
        if isinstance(batch, VerifyBatch):
            choices, tokens = [], iter(noise)
            for drafts, agreed in zip(batch.drafts, agree):
                own = list(drafts[:agreed])
                while len(own) < len(drafts) + 1:  # a choice the draft there is not
                    miss = drafts[len(own)] if len(own) < len(drafts) else -1
                    own.append(10 + (miss - 10 + 1 + next(tokens)) % 11)
                choices += own
        else:
            for req in batch.reqs:
                req.complete_one()  # as the scheduler's own run_batch leaves them
            choices = [10 + t for t in noise[: batch.size]]
        host = torch.tensor(choices)
        event = None
        if copy_in_flight:  # the host buffer holds stale tokens until synchronize
            event, host = CopyInFlight(host.clone()), torch.zeros_like(host)
            event.host = host
        return decoder, (forward_input, ForwardOutput(torch.tensor(choices), host, event))

    assert_same_call(SpeculativeDecoder.settle_batch, build=build)


@dataclass
class CopyInFlight:
    """Stands for the copy of the sampled tokens to the host (a CUDA event): the host buffer
    holds them only once `synchronize` returns."""

    tokens: torch.Tensor
    host: torch.Tensor | None = None

    def synchronize(self) -> None:
        self.host.copy_(self.tokens)


TRACE_MODES = {
    "radix, page 4": (dict(cache_type="radix", page_size=4), False),
    "naive, page 1, sampled among greedy": (dict(cache_type="naive", page_size=1), True),
    "chunked": (dict(cache_type="radix", max_extend_tokens=8, page_size=2), False),
    "mixed": (dict(cache_type="radix", mixed_batches=True, max_extend_tokens=16), False),
    "optimistic, a tight pool": (  # some steps have no room for drafts
        dict(cache_type="radix", admission="optimistic", num_pages=24, page_size=2),
        False,
    ),
    "k 1, n-grams from 2": (dict(speculative_tokens=1, ngram_min=2), False),
}


@pytest.mark.parametrize("mode", list(TRACE_MODES))
def test_the_scheduler_runs_a_workload_as_the_reference_does(mode):
    """Every stub in the loop: the batches (requests with their ledgers and rows, input ids
    with the drafts, positions, KV slots), the tokens (the accepted drafts and the model's
    own), the running and waiting sets and the free pages after each step, and the drafted
    and accepted counts, as with the chapter's reference code."""
    overrides, sampled = TRACE_MODES[mode]

    def run() -> list[str]:
        scheduler = make_scheduler(**overrides)
        scheduler.eos_token_ids |= {1868, 41289, 44941}  # what three of the requests sample
        events = scheduler_trace(scheduler, decoder_requests(41, sampled))
        stats = decoder(scheduler).stats
        events.append(
            f"drafted {stats.drafted}, accepted {stats.accepted}, verify steps "
            f"{stats.verify_steps}, per request {stats.per_request}"
        )
        return events

    assert_same_trace(24, run, mode)
