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

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    SMOLLM2,
    TINY_MODELS,
    encode,
    greedy,
    hf_greedy_cached,
    require_model,
    random_prompts,
    run_prompts,
)

from minisgl.core import Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
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
