"""Tests of problem 203: Padding each expert to whole blocks."""

import random

from submission import block_layout


def sorted_pairs(flat_experts, num_experts):
    order = sorted(range(len(flat_experts)), key=lambda p: flat_experts[p])
    return order, [flat_experts.count(e) for e in range(num_experts)]


def check_layout(flat_experts, num_experts, block_m):
    """Every block holds one expert's pairs only, every pair appears once, in sorted order,
    and no expert has more blocks than it needs."""
    order, counts = sorted_pairs(flat_experts, num_experts)
    pair_ids, block_expert = block_layout(order, counts, block_m)
    args = f"block_layout({order}, {counts}, {block_m})"
    assert len(pair_ids) == len(block_expert) * block_m, (
        f"{args}: {len(pair_ids)} rows for {len(block_expert)} blocks"
    )
    for b, expert in enumerate(block_expert):
        block = pair_ids[b * block_m : (b + 1) * block_m]
        real = [p for p in block if p != -1]
        assert real, f"{args}: block {b} is all padding"
        assert all(flat_experts[p] == expert for p in real), (
            f"{args}: block {b} ({block}) is not all expert {expert}"
        )
    assert [p for p in pair_ids if p != -1] == order, f"{args}: the pairs are not `order`"
    needed = [-(-c // block_m) for c in counts]
    assert [block_expert.count(e) for e in range(num_experts)] == needed, (
        f"{args}: blocks per expert"
    )


def test_example():
    assert block_layout([2, 5, 0, 3, 1, 4], [2, 2, 0, 2], 4) == (
        [2, 5, -1, -1, 0, 3, -1, -1, 1, 4, -1, -1],
        [0, 1, 3],
    )


def test_an_expert_with_exactly_a_block_gets_no_padding():
    check_layout([0, 0, 0, 0, 1], 2, 4)


def test_one_decoding_token_is_almost_all_padding():
    flat = [5, 2, 7, 0, 3, 1, 6, 4]
    check_layout(flat, 128, 64)
    order, counts = sorted_pairs(flat, 128)
    pair_ids, _ = block_layout(order, counts, 64)
    assert len(pair_ids) == 8 * 64 and pair_ids.count(-1) == 8 * 63


def test_random_routings():
    rng = random.Random(2)
    for block_m in (1, 4, 16):
        flat = [rng.randrange(8) for _ in range(rng.randint(1, 60))]
        check_layout(flat, 8, block_m)
