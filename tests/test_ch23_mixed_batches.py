"""Chapter 23 tests: mixed batches (MixedPolicy.mixed_batch), optimistic admission and
preemption by recompute (scheduler/preempt.py).

The pieces first, each against its whole contract: the pages a decode step needs, the queue
entry of a preempted request, what optimistic admission reserves, which adder a batch gets,
where a preempted request goes back in, who is preempted, what a preemption frees, and the
budget rule of a mixed batch. Then whole runs: every mode (mixed on and off, optimistic and
conservative, radix and naive, overlap on and off, a small chunk budget) gives transformers'
greedy tokens; a storm of preemptions on a pool a fraction of the worst case finishes every
request with the right tokens, each preempted at most once, with every page free or cached
afterwards; a preempted request with a step in flight, and a half-prefilled one, come back
right; and two tensor-parallel ranks take the same decisions.
"""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import (
    SMOLLM2,
    TINY_MODELS,
    assert_same_trace,
    encode,
    greedy,
    hf_greedy_cached,
    require_model,
    random_prompts,
    run_prompts,
    scheduler_trace,
)
from course.differential import assert_same_call, use_reference_stubs
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.mixed import MixedPolicy
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.preempt import (
    OptimisticAdder,
    OptimisticPrefillManager,
    Preemptor,
    ResumedReq,
    pages_needed,
    resume,
)
from minisgl.scheduler.utils import PendingReq

QWEN3 = TINY_MODELS["qwen3"]
BUDGET = 16


def make_scheduler(model: Path = QWEN3, **overrides: Any) -> Scheduler:
    config: dict[str, Any] = dict(
        device="cpu",
        show_progress=False,
        cache_type="naive",
        enable_overlap=False,
        max_running_req=8,
        num_pages=256,
        max_extend_tokens=BUDGET,
    )
    return Scheduler(SchedulerConfig(str(model), **(config | overrides)))


def spy_preemptions(scheduler: Scheduler) -> list[tuple[int, bool, bool]]:
    """Record each preemption: (uid, was it in the launched batch, was it a chunk)."""
    preemptor: Preemptor = scheduler.policy.preemptor
    preempt = preemptor.preempt
    log: list[tuple[int, bool, bool]] = []

    def recorded(req: Req) -> None:
        launched = scheduler._last_data is not None and any(
            r is req for r in scheduler._last_data[0].batch.reqs
        )
        log.append((req.uid, launched, isinstance(req, ChunkedReq)))
        preempt(req)

    preemptor.preempt = recorded
    return log


def ledger(input_len: int, cached_len: int, output_len: int = 8, uid: int = 0) -> Req:
    return Req(
        input_ids=torch.arange(input_len, dtype=torch.int32),
        table_idx=uid,
        cached_len=cached_len,
        output_len=output_len,
        uid=uid,
        sampling_params=greedy(output_len),
    )


# --- the pieces ------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_pages_needed_counts_exactly_the_pages_allocate_paged_takes(page_size: int) -> None:
    scheduler = make_scheduler(page_size=page_size, num_pages=200 // page_size)
    cm = scheduler.cache_manager
    all_free = cm.free_slots.clone()
    rng = random.Random(page_size)
    for trial in range(20):
        reqs = []
        for i in range(rng.randint(1, 5)):
            device_len = rng.randint(1, 30)
            cached = rng.choice([0, device_len - 1, rng.randint(0, device_len - 1)])
            reqs.append(ledger(device_len, cached, uid=i))
        cm.allocate_paged(reqs)  # takes the pages from cached_len up to device_len
        assert pages_needed(reqs, page_size) == len(all_free) - cm.num_free_pages, (trial, reqs)
        cm.free_slots = all_free.clone()
    assert pages_needed([], page_size) == 0


def test_resume_recomputes_prompt_and_tokens_so_far_and_keeps_the_end() -> None:
    params = SamplingParams(max_tokens=10, ignore_eos=True, seed=3)
    req = Req(torch.tensor([5, 6, 7], dtype=torch.int32), 4, 0, 10, 42, params)
    for token in (8, 9):  # two tokens generated and seen by the host
        req.complete_one()
        req.append_host(token)
    entry = resume(req)
    assert isinstance(entry, ResumedReq) and isinstance(entry, PendingReq)
    assert entry.uid == 42 and entry.sampling_params is params
    assert entry.input_ids.tolist() == [5, 6, 7, 8, 9]
    assert entry.chunked_req is None, "a resumed request holds nothing"
    assert entry.remaining == entry.output_len == 8
    assert entry.input_len + entry.output_len == req.max_device_len


def test_resume_with_a_token_in_flight_takes_only_what_the_host_has_seen() -> None:
    req = Req(torch.tensor([5, 6, 7], dtype=torch.int32), 0, 0, 6, 1, greedy(6))
    req.complete_one()
    req.append_host(8)
    req.complete_one()  # a second forward launched: its token is not on the host yet
    entry = resume(req)
    assert entry.input_ids.tolist() == [5, 6, 7, 8]
    assert entry.output_len == 5 and entry.input_len + entry.output_len == req.max_device_len


@pytest.mark.parametrize("page_size", [1, 4])
def test_optimistic_admission_reserves_the_prompt_and_a_page_not_the_output(
    page_size: int,
) -> None:
    scheduler = make_scheduler(page_size=page_size, num_pages=64)
    adder = OptimisticAdder(scheduler.cache_manager, scheduler.table_manager, 100, 0)
    pending = PendingReq(0, torch.arange(13, dtype=torch.int32), greedy(50))
    for cached_len in (0, 1, 4, 5, 8, 12):
        held = -(-cached_len // page_size) * page_size
        assert adder.worst_case_tokens(pending, cached_len) == 13 + page_size - held
    conservative = PrefillAdder(scheduler.cache_manager, scheduler.table_manager, 100, 0)
    assert conservative.worst_case_tokens(pending, 0) - adder.worst_case_tokens(pending, 0) == 50


def test_each_batch_gets_an_optimistic_adder_unless_a_preempted_request_heads_the_queue() -> None:
    scheduler = make_scheduler(page_size=2, admission="optimistic", max_extend_tokens=256)
    manager = scheduler.prefill_manager
    assert isinstance(manager, OptimisticPrefillManager)
    run_prompts(scheduler, random_prompts(0, 1), [1])  # warm: nothing left running
    for p in random_prompts(1, 3):
        scheduler.add_request(p, greedy(20))
    scheduler.step()  # three running requests
    running = scheduler.decode_manager.running_reqs
    assert len(running) == 3
    adder = manager.new_adder(7)
    assert type(adder) is OptimisticAdder
    assert adder.token_budget == 7 and adder.reserved_size == 2 * 3, "a page per running request"
    assert adder.cache_manager is scheduler.cache_manager
    assert adder.table_manager is scheduler.table_manager
    fresh = PendingReq(90, torch.arange(5, dtype=torch.int32), greedy(4))
    manager.pending_list.append(fresh)
    assert type(manager.new_adder(7)) is OptimisticAdder, "a fresh request at the head"
    manager.pending_list.insert(
        0, ResumedReq(91, torch.arange(5, dtype=torch.int32), greedy(9), remaining=4)
    )
    adder = manager.new_adder(7)
    assert type(adder) is PrefillAdder, "a preempted request comes back conservatively"
    assert adder.token_budget == 7
    assert adder.reserved_size == scheduler.decode_manager.inflight_tokens


def test_a_preempted_request_goes_first_but_behind_a_half_prefilled_prompt() -> None:
    scheduler = make_scheduler(admission="optimistic")
    manager = scheduler.prefill_manager
    a, b = (PendingReq(i, torch.arange(50, dtype=torch.int32), greedy(4)) for i in (0, 1))
    manager.pending_list += [a, b]
    first = ResumedReq(7, torch.arange(5, dtype=torch.int32), greedy(9), remaining=3)
    manager.requeue(first)
    assert manager.pending_list == [first, a, b]
    manager.pending_list = [a, b]
    scheduler.step()  # a's first chunk (budget 16): a keeps the head
    assert manager.pending_list[0] is a and a.chunked_req is not None
    manager.requeue(first)
    assert manager.pending_list == [a, first, b]
    second = ResumedReq(8, torch.arange(5, dtype=torch.int32), greedy(9), remaining=3)
    manager.requeue(second)
    assert manager.pending_list == [a, second, first, b], "the newest preempted goes first"


def test_the_victim_is_the_chunk_then_the_newest_running_and_never_a_preempted_one() -> None:
    scheduler = make_scheduler(admission="optimistic")
    preemptor: Preemptor = scheduler.policy.preemptor
    for p in random_prompts(2, 3, longest=5):
        scheduler.add_request(p, greedy(30))
    scheduler.step()  # three running, in admission order
    running = list(scheduler.decode_manager.running_reqs.values())
    assert preemptor.victim(running) is running[-1]
    assert preemptor.victim(running[:2]) is running[1], "the newest of the requests given"
    preemptor.protected = {running[2].uid}
    assert preemptor.victim(running) is running[1], "a preempted request is never chosen again"
    preemptor.protected = {r.uid for r in running}
    assert preemptor.victim(running) is None
    preemptor.protected = set()
    scheduler.add_request(list(range(10, 60)), greedy(4))
    scheduler.decode_manager.running_reqs.clear()  # let the next prefill take the whole budget
    scheduler.step()
    scheduler.decode_manager.running_reqs.update({r.uid: r for r in running})
    chunk = scheduler.prefill_manager.pending_list[0].chunked_req
    assert isinstance(chunk, ChunkedReq)
    assert preemptor.victim(running) is chunk, "a half-prefilled prompt was admitted last"
    preemptor.protected = {chunk.uid}
    assert preemptor.victim(running) is running[-1]


@pytest.mark.parametrize("cache_type", ["naive", "radix"])
def test_preempt_frees_the_row_and_pages_and_lock_and_requeues_the_request_first(
    cache_type: str,
) -> None:
    scheduler = make_scheduler(
        cache_type=cache_type, page_size=2, admission="optimistic", max_extend_tokens=256
    )
    preemptor: Preemptor = scheduler.policy.preemptor
    cm, tm = scheduler.cache_manager, scheduler.table_manager
    prompts = random_prompts(3, 2, longest=12)
    uids = [scheduler.add_request(p, greedy(9)) for p in prompts]
    waiting = PendingReq(77, torch.arange(3, 6, dtype=torch.int32), greedy(2))
    scheduler.step()
    scheduler.step()
    scheduler.prefill_manager.pending_list.append(waiting)
    victim = scheduler.decode_manager.running_reqs[uids[1]]
    rows = tm.available_size
    generated = victim.input_ids[len(prompts[1]) :].tolist()
    assert len(generated) == 2
    preemptor.preempt(victim)
    assert uids[1] not in scheduler.decode_manager.running_reqs
    assert uids[0] in scheduler.decode_manager.running_reqs
    assert tm.available_size == rows + 1, "its table row is free"
    # With overlap a launched batch may still hold it: the token it samples there is dropped.
    assert (victim in scheduler.finished_reqs) == scheduler.overlap
    assert preemptor.protected == {uids[1]} and preemptor.preemptions == 1
    entry = scheduler.prefill_manager.pending_list[0]
    assert scheduler.prefill_manager.pending_list[1:] == [waiting]
    assert isinstance(entry, ResumedReq) and entry.uid == uids[1]
    assert entry.input_ids.tolist() == prompts[1] + generated
    assert entry.output_len == 9 - 2 and entry.chunked_req is None
    # Only request 0 holds KV now: its pages are in use, the victim's are free or cached.
    other = scheduler.decode_manager.running_reqs[uids[0]]
    size = cm.prefix_cache.size_info
    if cache_type == "radix":
        assert size.total_size > 0, "the victim's computed prefix stays in the radix tree"
    held_by_other = -(-other.cached_len // 2)
    cached_pages = size.total_size // 2
    other_locked = size.protected_size // 2
    assert cm.num_free_pages + cached_pages + held_by_other - other_locked == cm.num_pages
    scheduler.release(other)
    scheduler.prefill_manager.pending_list.clear()
    cm.check_integrity()  # no lock left: the victim's lock was released


def test_make_room_preempts_newest_first_until_the_decode_step_fits() -> None:
    scheduler = make_scheduler(num_pages=60, admission="optimistic", max_extend_tokens=256)
    preemptor: Preemptor = scheduler.policy.preemptor
    cm = scheduler.cache_manager
    for p in random_prompts(4, 4, longest=8):
        scheduler.add_request(p, greedy(40))
    scheduler.step()
    running = list(scheduler.decode_manager.running_reqs.values())
    assert preemptor.make_room(running) == running, "room enough: nobody is preempted"
    free = cm.num_free_pages
    cm.free_slots, spare = cm.free_slots[:4], cm.free_slots[4:]
    assert preemptor.make_room(running) == running, "4 pages for 4 new tokens: it fits exactly"
    cm.free_slots = torch.cat([cm.free_slots, spare])
    assert preemptor.preemptions == 0
    cm.free_slots, spare = cm.free_slots[:2], cm.free_slots[2:]  # only 2 of 4 pages left
    kept = preemptor.make_room(running)
    freed = cm.num_free_pages - 2
    assert kept == running[: len(kept)], "the oldest stay, in order"
    assert len(kept) < 4 and pages_needed(kept, 1) <= cm.available_size
    assert preemptor.preemptions == 4 - len(kept)
    assert [p.uid for p in scheduler.prefill_manager.pending_list] == [
        r.uid for r in reversed(running[len(kept) :])
    ], "each victim went to the front: the last preempted is first"
    assert freed > 0
    cm.free_slots = torch.cat([cm.free_slots, spare])
    assert cm.num_free_pages == free + freed
    preemptor.protected = {r.uid for r in kept}
    cm.free_slots, spare = cm.free_slots[:0], cm.free_slots
    with pytest.raises(RuntimeError, match="nothing left to preempt"):
        preemptor.make_room(kept)
    cm.free_slots = spare


def test_a_mixed_batch_puts_every_decode_token_first_then_chunks_within_the_budget() -> None:
    scheduler = make_scheduler(mixed_batches=True)
    assert scheduler.policy.pick_batch() is None, "nothing to do"
    short = random_prompts(5, 3, longest=6)
    uids = [scheduler.add_request(p, greedy(30)) for p in short]
    batch = scheduler.policy.pick_batch()
    assert batch.phase == "prefill" and [r.uid for r in batch.reqs] == uids, "prompts alone"
    scheduler.prefill_manager.pending_list.clear()  # picked only; put them back as running
    for req in batch.reqs:
        scheduler.decode_manager.running_reqs[req.uid] = req
        req.complete_one()
    batch = scheduler.policy.pick_batch()
    assert batch.phase == "decode" and batch.reqs == list(
        scheduler.decode_manager.running_reqs.values()
    )
    long_uid = scheduler.add_request(list(range(10, 50)), greedy(3))
    batch = scheduler.policy.pick_batch()
    running = list(scheduler.decode_manager.running_reqs.values())
    assert batch.phase == "prefill"
    assert batch.reqs[:3] == running, "decode tokens first, in admission order"
    chunk = batch.reqs[3]
    assert isinstance(chunk, ChunkedReq) and chunk.uid == long_uid and len(batch.reqs) == 4
    assert chunk.extend_len == BUDGET - 3, "the chunk fills the rest of the budget"
    assert sum(r.extend_len for r in batch.reqs) == BUDGET


@pytest.mark.parametrize("overlap", [False, True])
def test_every_step_of_a_mixed_run_stays_within_the_budget_and_decodes_everyone(
    overlap: bool,
) -> None:
    scheduler = make_scheduler(
        mixed_batches=True, enable_overlap=overlap, page_size=4, num_pages=64
    )
    prompts = random_prompts(6, 3, longest=6) + [list(range(20, 120))]
    expected = [hf_greedy_cached(QWEN3, p, 12) for p in prompts]
    uids = [scheduler.add_request(p, greedy(12)) for p in prompts[:3]]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    steps = 0
    while scheduler.has_work:
        running = set(scheduler.decode_manager.running_reqs)
        if steps == 2:
            uids.append(scheduler.add_request(prompts[3], greedy(12)))
            tokens[uids[3]] = []
        for out in scheduler.step():
            tokens[out.uid].append(out.token)
        phase, size, count = scheduler.stats.steps[-1]
        assert count <= BUDGET, "never over the token budget"
        assert size >= len(running), "every running request decodes in every step"
        steps += 1
    scheduler.cache_manager.check_integrity()
    prefills = [n for phase, _, n in scheduler.stats.steps if phase == "prefill"]
    assert len(prefills) >= 100 // BUDGET, "the long prompt was chunked into mixed steps"
    assert [tokens[u] for u in uids] == expected


# --- whole runs --------------------------------------------------------------------------------

# Mixed batches or optimistic admission or both (neither is chapter 7's scheduler).
MODES = [
    (mixed, admission, cache_type)
    for mixed, admission, cache_type in itertools.product(
        [False, True], ["conservative", "optimistic"], ["radix", "naive"]
    )
    if mixed or admission == "optimistic"
]


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("mixed,admission,cache_type", MODES)
def test_every_mode_gives_transformers_greedy_tokens(
    mixed: bool, admission: str, cache_type: str, overlap: bool
) -> None:
    prompts = random_prompts(7, 10)
    max_tokens = [random.Random(i).randint(3, 24) for i in range(10)]
    scheduler = make_scheduler(
        mixed_batches=mixed,
        admission=admission,
        cache_type=cache_type,
        enable_overlap=overlap,
        page_size=2,
        num_pages=60,  # about a quarter of the worst cases
    )
    tokens = run_prompts(scheduler, prompts, max_tokens)
    for p, m, got in zip(prompts, max_tokens, tokens):
        assert got == hf_greedy_cached(QWEN3, p, m)
    if admission == "optimistic":
        assert scheduler.policy.preemptor.preemptions > 0, "the pool was tight enough"


@pytest.mark.parametrize(
    "mixed,overlap,cache_type",
    [(True, True, "radix"), (False, True, "naive"), (True, False, "naive")],
)
def test_a_storm_of_preemptions_finishes_every_request_right_once_each(
    mixed: bool, overlap: bool, cache_type: str, tiny_model_dir: Path
) -> None:
    scheduler = make_scheduler(
        tiny_model_dir,
        mixed_batches=mixed,
        admission="optimistic",
        cache_type=cache_type,
        enable_overlap=overlap,
        num_pages=48,  # a tenth of the 16 requests' worst cases
        max_extend_tokens=12,
    )
    log = spy_preemptions(scheduler)
    prompts = random_prompts(8, 16, longest=16)
    tokens = run_prompts(scheduler, prompts, [14] * 16)
    for p, got in zip(prompts, tokens):
        assert got == hf_greedy_cached(tiny_model_dir, p, 14)
    uids = [uid for uid, _, _ in log]
    assert len(uids) > 4, "a storm, not a drizzle"
    assert len(set(uids)) == len(uids), "no request is preempted twice"
    status = scheduler.status()
    assert status.integrity_ok and status.used_pages == 0
    assert status.free_pages + status.cached_pages == status.num_pages
    assert scheduler.table_manager.available_size == 8
    if overlap:
        assert any(launched for _, launched, _ in log), "a victim had a step in flight"


@pytest.mark.parametrize("mixed,overlap", [(True, False), (False, False), (True, True)])
def test_a_half_prefilled_prompt_is_preempted_and_comes_back_whole(
    mixed: bool, overlap: bool
) -> None:
    scheduler = make_scheduler(
        admission="optimistic",
        mixed_batches=mixed,
        enable_overlap=overlap,
        num_pages=50,
        max_extend_tokens=8,
        cache_type="radix",
    )
    log = spy_preemptions(scheduler)
    prompts = random_prompts(9, 3, longest=5) + [list(range(30, 60))]
    tokens = run_prompts(scheduler, prompts, [30, 30, 30, 6])
    assert any(chunk for _, _, chunk in log), "a chunk was preempted"
    for p, m, got in zip(prompts, [30, 30, 30, 6], tokens):
        assert got == hf_greedy_cached(QWEN3, p, m)


@pytest.mark.slow
def test_smollm2_text_survives_preemption_and_mixing() -> None:
    model = require_model(SMOLLM2)
    prompts = encode(model, ["The capital of France is", "def add(a, b):", "Once upon a time"] * 2)
    scheduler = make_scheduler(
        model,
        mixed_batches=True,
        admission="optimistic",
        cache_type="radix",
        num_pages=72,
        enable_overlap=True,
    )
    log = spy_preemptions(scheduler)
    tokens = run_prompts(scheduler, prompts, [16] * 6)
    assert log, "the pool was tight enough to preempt"
    for p, got in zip(prompts, tokens):
        assert got == hf_greedy_cached(model, p, 16)


@pytest.mark.slow
@pytest.mark.time_limit(120)  # two processes, each loading the model
def test_two_tensor_parallel_ranks_preempt_alike_and_match_one_process() -> None:
    from minisgl.llm import LLM

    prompts = random_prompts(10, 8, longest=12)
    config = dict(
        show_progress=False,
        mixed_batches=True,
        admission="optimistic",
        num_pages=50,
        max_extend_tokens=12,
        cache_type="radix",
        max_running_req=8,
    )
    with LLM(str(QWEN3), tp_size=2, **config) as llm:
        outputs = llm.generate(prompts, greedy(12))
        preemptions = llm.scheduler.policy.preemptor.preemptions
        status = llm.scheduler.status()
    assert preemptions > 0
    assert status.integrity_ok
    for p, out in zip(prompts, outputs):
        assert out["token_ids"] == hf_greedy_cached(QWEN3, p, 12)


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. The preemptor's and the mixed policy's stubs run on
# scheduler states taken from real runs (tight pools, chunked prompts, preemptions under way),
# copied into a scheduler without an engine: its managers and `release`, all that they use.
# Then whole runs: every batch, token, preemption, the running and waiting sets and the free
# pages, step by step, yours against the chapter's reference stubs.

PAGE_SIZES = st.sampled_from([1, 2, 4, 16])


def ledger_reqs(specs: list[tuple[int, int]], first_uid: int = 0) -> list[Req]:
    """Requests of (device_len, cached_len as a share of it: 0 none, 1 all but the last)."""
    reqs = []
    for i, (device_len, share) in enumerate(specs):
        cached = min(device_len - 1, int(share * device_len))
        reqs.append(ledger(device_len, cached, uid=first_uid + i))
    return reqs


@settings(max_examples=50)
@given(
    specs=st.lists(st.tuples(st.integers(1, 40), st.sampled_from([0, 0.3, 0.7, 1])), max_size=6),
    page_size=PAGE_SIZES,
)
def test_pages_needed_matches_the_reference(specs, page_size):
    """Prompts and decoding requests, cached prefixes ending at, inside and one past a page."""
    assert_same_call(pages_needed, build=lambda: (ledger_reqs(specs), page_size))


@settings(max_examples=40)
@given(
    prompt_len=st.integers(1, 12),
    generated=st.integers(0, 6),
    in_flight=st.booleans(),
    max_tokens=st.integers(1, 10),
    seed=st.one_of(st.none(), st.integers(0, 9)),
)
def test_resume_matches_the_reference(prompt_len, generated, in_flight, max_tokens, seed):
    """Requests fresh, part-decoded, at max_tokens, with a token still in flight (not on the
    host yet), greedy or seeded."""

    def build() -> tuple[Req]:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0 if seed is None else 1.0, seed=seed
        )
        req = Req(torch.arange(7, 7 + prompt_len, dtype=torch.int32), 3, 0, max_tokens, 42, params)
        for token in range(min(generated, max_tokens - 1)):
            req.complete_one()
            req.append_host(100 + token)
        if in_flight and req.can_decode:
            req.complete_one()
        return (req,)

    assert_same_call(resume, build=build)


def managers(page_size: int, free_pages: int = 64, rows: int = 8) -> tuple[Any, Any, Any]:
    """A cache manager of a naive cache, a table manager and a decode manager, empty."""
    from minisgl.scheduler.cache import CacheManager, create_prefix_cache
    from minisgl.scheduler.decode import DecodeManager
    from minisgl.scheduler.table import TableManager

    table = torch.zeros(rows, 256, dtype=torch.int32)
    prefix = create_prefix_cache("naive", torch.device("cpu"), page_size)
    cache = CacheManager(free_pages, page_size, table, prefix)
    return cache, TableManager(rows, table), DecodeManager(page_size)


def pending(uid: int, prompt_len: int, max_tokens: int, resumed: bool) -> PendingReq:
    ids = torch.arange(10, 10 + prompt_len, dtype=torch.int32)
    if resumed:
        return ResumedReq(uid, ids, greedy(max_tokens + 3), remaining=max_tokens)
    return PendingReq(uid, ids, greedy(max_tokens))


@settings(max_examples=50)
@given(
    prompt_len=st.integers(1, 40),
    max_tokens=st.integers(1, 30),
    resumed=st.booleans(),
    cached=st.floats(0, 1),
    page_size=PAGE_SIZES,
)
def test_worst_case_tokens_matches_the_reference(
    prompt_len, max_tokens, resumed, cached, page_size
):
    """Fresh and resumed requests, nothing to all but the last prompt token cached."""

    def build() -> tuple:
        cache, table, _ = managers(page_size)
        adder = OptimisticAdder(cache, table, 64, 0)
        request = pending(0, prompt_len, max_tokens, resumed)
        return adder, request, min(prompt_len - 1, int(cached * prompt_len))

    assert_same_call(OptimisticAdder.worst_case_tokens, build=build)


QUEUES = st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20), st.booleans()), max_size=4)


def queued_manager(
    queue: list[tuple[int, int, bool]], head_chunked: bool, running: list, page_size: int
) -> OptimisticPrefillManager:
    """A queue of fresh and resumed requests, its head half-way through its chunks or not,
    beside running requests."""
    cache, table, decode = managers(page_size)
    manager = OptimisticPrefillManager(cache, table, decode)
    manager.pending_list = [pending(50 + i, *entry) for i, entry in enumerate(queue)]
    if head_chunked and manager.pending_list:
        head = manager.pending_list[0]
        chunk_len = max(1, head.input_len // 2)
        head.chunked_req = ChunkedReq(
            head.input_ids[:chunk_len], 7, 0, 1, head.uid, head.sampling_params
        )
    decode.running_reqs = {req.uid: req for req in ledger_reqs(running)}
    return manager


MANAGER_INPUTS = dict(
    queue=QUEUES,
    head_chunked=st.booleans(),
    running=st.lists(st.tuples(st.integers(1, 30), st.sampled_from([0.5, 1])), max_size=4),
    page_size=PAGE_SIZES,
)


@settings(max_examples=40)
@given(**MANAGER_INPUTS, budget=st.integers(1, 64))
def test_new_adder_matches_the_reference(queue, head_chunked, running, page_size, budget):
    """An empty queue, a fresh or a resumed request (or a chunked one) at its head, 0 to 4
    running requests: the adder's type and every field."""
    assert_same_call(
        OptimisticPrefillManager.new_adder,
        build=lambda: (queued_manager(queue, head_chunked, running, page_size), budget),
    )


@settings(max_examples=40)
@given(**MANAGER_INPUTS)
def test_requeue_matches_the_reference(queue, head_chunked, running, page_size):
    """Into an empty queue, in front of a fresh head, behind a head half-way through its
    chunks."""
    assert_same_call(
        OptimisticPrefillManager.requeue,
        build=lambda: (
            queued_manager(queue, head_chunked, running, page_size),
            pending(99, 5, 4, resumed=True),
        ),
    )


# Scheduler states from real runs: name -> (config overrides, the requests' max_tokens).
STATE_RUNS = {
    "optimistic mixed radix overlap": (
        dict(
            admission="optimistic",
            mixed_batches=True,
            cache_type="radix",
            enable_overlap=True,
            page_size=2,
            num_pages=28,
            max_extend_tokens=10,
        ),
        14,
    ),
    "optimistic naive": (
        dict(admission="optimistic", page_size=1, num_pages=44, max_extend_tokens=8),
        12,
    ),
    "conservative mixed": (
        dict(
            mixed_batches=True, cache_type="radix", page_size=4, num_pages=40, max_extend_tokens=12
        ),
        10,
    ),
}
# What a preemptor and a mixed policy use of a scheduler (`release` reads the first five).
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
)


class Released(list):
    """The scheduler's `finished_reqs` in a copy: a list with set's `add`, so that both sides'
    requests compare by their state, in the order they were released (a set of requests
    compares only by identity)."""

    def add(self, req: Req) -> None:
        if not any(r is req for r in self):
            self.append(req)


@dataclass
class SchedulerState:
    """A scheduler's state before one of its steps, deep-copied; its preemptor's too."""

    run: str
    fields: dict[str, Any]
    protected: set[int]
    preemptions: int
    optimistic: bool

    def __repr__(self) -> str:
        queue = [p.uid for p in self.fields["prefill_manager"].pending_list]
        running = list(self.fields["decode_manager"].running_reqs)
        return f"<a state of run {self.run!r}: running {running}, waiting {queue}>"

    def scheduler(self) -> Scheduler:
        """A fresh copy of the state as a scheduler without an engine. The radix cache's
        clock restarts, so that both sides stamp the same accesses alike."""
        from minisgl.kvcache import radix_cache

        radix_cache._clock = itertools.count(10**6)
        light = Scheduler.__new__(Scheduler)
        vars(light).update(copy.deepcopy(self.fields))
        light.finished_reqs = Released(sorted(light.finished_reqs, key=lambda r: r.uid))
        light._last_data = None
        return light

    def preemptor(self) -> Preemptor:
        scheduler = self.scheduler()
        preemptor = Preemptor(scheduler, scheduler.prefill_manager)
        preemptor.protected, preemptor.preemptions = set(self.protected), self.preemptions
        return preemptor


class States(list):
    def __repr__(self) -> str:
        return f"<{len(self)} scheduler states of STATE_RUNS>"


@pytest.fixture(scope="module")
def states() -> Iterator[States]:
    """Every state before a step of three runs: nine requests, three of long prompts that are
    chunked, on pools that force preemptions (optimistic admission) or not (conservative).
    The runs are the reference's: the states are inputs, the same whatever your code does."""
    from minisgl.kvcache import radix_cache

    clock = radix_cache._clock
    found = States()
    for run, (overrides, max_tokens) in STATE_RUNS.items():
        with use_reference_stubs(23):
            found += states_of_run(run, overrides, max_tokens)
    yield found
    radix_cache._clock = clock


STATE_UIDS = [40, 12, 33, 7, 51, 20, 3, 45, 28]


def states_of_run(run: str, overrides: dict[str, Any], max_tokens: int) -> list[SchedulerState]:
    """A copy of the scheduler's state before each step of one run."""
    scheduler = make_scheduler(**overrides)
    preemptor = scheduler.policy.preemptor
    prompts = random_prompts(23, 6, longest=10) + random_prompts(24, 3, shortest=20, longest=30)
    for i, prompt in enumerate(prompts):  # uids as a frontend gives them: not in arrival order
        scheduler.add_request(prompt, greedy(max_tokens - i % 3), uid=STATE_UIDS[i])
    found = []
    while scheduler.has_work:
        fields = copy.deepcopy({name: vars(scheduler)[name] for name in LIGHT_FIELDS})
        protected = set(preemptor.protected) if preemptor else set()
        count = preemptor.preemptions if preemptor else 0
        found.append(SchedulerState(run, fields, protected, count, preemptor is not None))
        scheduler.step()
    return found


def optimistic(states: list[SchedulerState]) -> list[SchedulerState]:
    return [s for s in states if s.optimistic]


# Which of the running and waiting requests (in that order) get protected besides those the
# run protected: about one in four.
PROTECTIONS = st.lists(st.integers(0, 3), min_size=32, max_size=32)


def protect(preemptor: Preemptor, draws: list[int]) -> None:
    scheduler = preemptor.scheduler
    uids = list(scheduler.decode_manager.running_reqs)
    uids += [p.uid for p in scheduler.prefill_manager.pending_list]
    preemptor.protected |= {uid for uid, draw in zip(uids, draws) if draw == 0}


@settings(max_examples=40)
@given(data=st.data())
def test_victim_matches_the_reference(states, data):
    """Any sublist of the running requests (in admission order), a chunk at the queue's head
    or not, any of them protected."""
    state = data.draw(st.sampled_from(optimistic(states)))
    keep = data.draw(st.lists(st.booleans(), min_size=16, max_size=16))
    protections = data.draw(PROTECTIONS)

    def build() -> tuple:
        preemptor = state.preemptor()
        protect(preemptor, protections)
        running = list(preemptor.scheduler.decode_manager.running_reqs.values())
        return preemptor, [req for req, kept in zip(running, keep) if kept]

    assert_same_call(Preemptor.victim, build=build)


@settings(max_examples=30)
@given(data=st.data())
def test_preempt_matches_the_reference(states, data):
    """A running request (with a step in flight, under overlap) or the queue head's chunk:
    the whole scheduler state after (running set, rows, pages and prefix cache, the queue),
    the preemptor's protected uids and count."""
    state = data.draw(
        st.sampled_from(
            [
                s
                for s in optimistic(states)
                if s.fields["decode_manager"].running_reqs or chunk_of(s)
            ]
        )
    )
    which = data.draw(st.integers(0, 16))

    def build() -> tuple:
        preemptor = state.preemptor()
        scheduler = preemptor.scheduler
        candidates = list(scheduler.decode_manager.running_reqs.values())
        pending_list = scheduler.prefill_manager.pending_list
        if pending_list and pending_list[0].chunked_req is not None:
            candidates.append(pending_list[0].chunked_req)
        return preemptor, candidates[which % len(candidates)]

    assert_same_call(Preemptor.preempt, build=build)


def chunk_of(state: SchedulerState) -> ChunkedReq | None:
    queue = state.fields["prefill_manager"].pending_list
    return queue[0].chunked_req if queue else None


@settings(max_examples=40)
@given(data=st.data())
def test_make_room_matches_the_reference(states, data):
    """The running requests' decode step on a pool cut to 0 pages up to what it has: room
    enough, room exactly, one or more victims, and no victim left (RuntimeError)."""
    state = data.draw(st.sampled_from(optimistic(states)))
    free = data.draw(st.integers(0, 6))
    protections = data.draw(PROTECTIONS)

    def build() -> tuple:
        preemptor = state.preemptor()
        protect(preemptor, protections)
        cache = preemptor.scheduler.cache_manager
        cache.free_slots = cache.free_slots[:free]
        return preemptor, list(preemptor.scheduler.decode_manager.running_reqs.values())

    assert_same_call(Preemptor.make_room, build=build)


@settings(max_examples=40)
@given(data=st.data())
def test_mixed_batch_matches_the_reference(states, data):
    """Every state of the three runs (with and without a preemptor), budgets from one token
    per running request up, pools cut short: the batch (phase, requests and their ledgers)
    and the scheduler after (admissions, preemptions)."""
    state = data.draw(st.sampled_from(states))
    # budget left after a token per running request: often a few tokens, so that a prompt's
    # chunk is cut by the budget, which a preemption's returned tokens widen
    spare = data.draw(st.one_of(st.integers(0, 3), st.integers(0, 16)))
    free = data.draw(st.one_of(st.none(), st.just(0), st.integers(0, 8)))

    def build() -> tuple:
        if state.optimistic:
            preemptor = state.preemptor()
            scheduler = preemptor.scheduler
        else:
            preemptor, scheduler = None, state.scheduler()
        running = len(scheduler.decode_manager.running_reqs)
        scheduler.config.max_extend_tokens = running + spare
        if free is not None:
            scheduler.cache_manager.free_slots = scheduler.cache_manager.free_slots[:free]
        return (MixedPolicy(scheduler, scheduler, preemptor, mixed=True),)

    assert_same_call(MixedPolicy.mixed_batch, build=build)


TRACE_MODES = {
    # (config overrides, seed): mixed or not, optimistic or conservative, pools a fraction of
    # the worst cases (each preempts once or twice, a chunk too), chunk budgets that split the
    # long prompts, overlap on and off
    "mixed, optimistic, radix, overlap": (
        dict(
            mixed_batches=True,
            admission="optimistic",
            cache_type="radix",
            enable_overlap=True,
            page_size=2,
            num_pages=22,
            max_extend_tokens=12,
        ),
        0,
    ),
    "optimistic, naive, page 1": (
        dict(admission="optimistic", page_size=1, num_pages=34, max_extend_tokens=8),
        1,
    ),
    "mixed, optimistic, a small budget": (
        dict(
            mixed_batches=True,
            admission="optimistic",
            page_size=4,
            num_pages=11,
            max_extend_tokens=6,
            max_running_req=4,
        ),
        2,
    ),
    "optimistic, radix, overlap, a chunk preempted": (
        dict(
            admission="optimistic",
            cache_type="radix",
            enable_overlap=True,
            page_size=1,
            num_pages=42,
            max_extend_tokens=10,
        ),
        4,
    ),
    "mixed, conservative, overlap": (
        dict(
            mixed_batches=True,
            cache_type="radix",
            enable_overlap=True,
            page_size=4,
            num_pages=40,
            max_extend_tokens=16,
        ),
        3,
    ),
}


def trace_with_preemptions(overrides: dict[str, Any], seed: int) -> list[str]:
    """scheduler_trace of eight requests (some stop at EOS, three have long prompts), with
    each preemption (who, and whether running or a chunk) in the step it happened."""
    scheduler = make_scheduler(**overrides)
    scheduler.eos_token_ids |= {11, 12, 13}  # ids the tiny model samples now and then
    rng = random.Random(seed)
    prompts = random_prompts(seed, 5, longest=12) + random_prompts(
        seed + 9, 3, shortest=16, longest=30
    )
    requests = [
        (p, SamplingParams(max_tokens=rng.randint(2, 16), ignore_eos=rng.random() < 0.7))
        for p in prompts
    ]
    step_count = 0
    preemptions: list[tuple[int, str]] = []
    step = scheduler.step

    def counted_step() -> list:
        nonlocal step_count
        step_count += 1
        return step()

    scheduler.step = counted_step
    preemptor = getattr(scheduler.policy, "preemptor", None)
    if preemptor is not None:
        preempt = preemptor.preempt

        def recorded(req: Req) -> None:
            what = "chunk" if isinstance(req, ChunkedReq) else "running request"
            preemptions.append((step_count, f"preempted {what} {req.uid}"))
            preempt(req)

        preemptor.preempt = recorded
    events = scheduler_trace(scheduler, requests)
    for when, event in reversed(preemptions):  # before the first event of its step
        first = next(
            (i for i, e in enumerate(events) if e.startswith(f"step {when}:")), len(events)
        )
        events.insert(first, f"step {when}: {event}")
    if preemptor is not None:
        events.append(
            f"{preemptor.preemptions} preemptions; protected {sorted(preemptor.protected)}"
        )
    return events


@pytest.mark.parametrize("mode", list(TRACE_MODES))
def test_the_scheduler_runs_a_workload_as_the_reference_does(mode):
    """Every stub in the loop: the batches (phase, requests with their ledgers and rows,
    input ids, positions, KV slots), the tokens, each preemption, the running and waiting
    sets and the free pages after each step, as with the chapter's reference code."""
    overrides, seed = TRACE_MODES[mode]
    assert_same_trace(23, lambda: trace_with_preemptions(overrides, seed), mode)
