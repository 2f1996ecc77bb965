"""Tests of problem 214: static batches against continuous batching."""

import heapq
import random

from submission import continuous_batching, static_batching


def list_schedule(output_lens, slots):
    """Continuous batching seen per slot: each request takes the slot that frees first."""
    free_at = [0] * slots
    for length in output_lens:
        heapq.heappush(free_at, heapq.heappop(free_at) + length)
    return max(free_at)


def test_example():
    assert static_batching([2, 8, 3, 3], batch_size=2) == (11, 22)
    assert continuous_batching([2, 8, 3, 3], slots=2) == 8


def test_static_batches_run_to_their_longest_request():
    rng = random.Random(0)
    lens = [rng.randint(1, 50) for _ in range(37)]
    steps, tokens = static_batching(lens, 8)
    batches = [lens[i : i + 8] for i in range(0, 37, 8)]
    assert steps == sum(max(b) for b in batches), "steps: each batch runs to its longest"
    assert tokens == sum(max(b) * len(b) for b in batches), "tokens: padding rows included"
    assert static_batching(lens, 100) == (max(lens), max(lens) * len(lens))


def test_continuous_batching_matches_a_per_slot_schedule():
    rng = random.Random(1)
    for slots in (1, 3, 8):
        lens = [rng.randint(1, 40) for _ in range(25)]
        got = continuous_batching(lens, slots)
        assert got == list_schedule(lens, slots), f"slots {slots}, lens {lens}"


def test_enough_slots_take_as_long_as_the_longest_request():
    lens = [5, 1, 9, 2]
    assert continuous_batching(lens, 4) == 9
    assert continuous_batching(lens, 1) == sum(lens)
    assert continuous_batching(lens, 4) <= static_batching(lens, 4)[0]
