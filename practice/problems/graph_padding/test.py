"""Tests of problem 182 (pad_for_graph): the padded lists are read back row by row, as the
kernels of a replay would: real rows unchanged, padding rows one key on the spare page, and
no K/V written outside the batch's slots and the spare page."""

import random

from submission import pad_for_graph


def rows(kv_indptr, kv_indices, last_page_len, page_size):
    """Per row: the slots of its keys, read from the lists."""
    out = []
    for r, used in enumerate(last_page_len):
        own = kv_indices[kv_indptr[r] : kv_indptr[r + 1]]
        count = (len(own) - 1) * page_size + used
        out.append([own[t // page_size] * page_size + t % page_size for t in range(count)])
    return out


def check(seq_lens, graph_size, page_size, seed):
    rng = random.Random(seed)
    pad_page = 100
    pages = [rng.sample(range(100), -(-n // page_size)) for n in seq_lens]
    kv_indptr = [0]
    for own in pages:
        kv_indptr.append(kv_indptr[-1] + len(own))
    kv_indices = [p for own in pages for p in own]
    last = [n - (len(own) - 1) * page_size for n, own in zip(seq_lens, pages)]
    out_loc = [
        own[(n - 1) // page_size] * page_size + (n - 1) % page_size
        for n, own in zip(seq_lens, pages)
    ]
    args = (kv_indptr, kv_indices, last, out_loc, graph_size, pad_page, page_size)
    got = pad_for_graph(*[list(a) if isinstance(a, list) else a for a in args])
    call = f"pad_for_graph{args}"
    assert len(got) == 4 and len(got[2]) == graph_size and len(got[3]) == graph_size, (
        f"{call}: expected {graph_size} rows, got {got}"
    )
    read = rows(got[0], got[1], got[2], page_size)
    spare = pad_page * page_size
    assert read[: len(seq_lens)] == rows(kv_indptr, kv_indices, last, page_size), (
        f"{call}: the real rows changed: got {got}"
    )
    assert got[3][: len(seq_lens)] == out_loc, f"{call}: the real rows' out_loc changed: {got[3]}"
    for r in range(len(seq_lens), graph_size):
        assert read[r] == [spare], f"{call}: padding row {r} reads slots {read[r]}, not [{spare}]"
        assert got[3][r] == spare, f"{call}: padding row {r} writes slot {got[3][r]}"


def test_example_two_requests_in_a_graph_of_four():
    assert pad_for_graph([0, 2, 3], [4, 1, 6], [3, 1], [6, 24], 4, 9, 4) == (
        [0, 2, 3, 4, 5],
        [4, 1, 6, 9, 9],
        [3, 1, 1, 1],
        [6, 24, 36, 36],
    )


def test_random_batches_and_graphs():
    for seed in range(10):
        rng = random.Random(seed)
        n = rng.randint(1, 7)
        check(
            [rng.randint(1, 40) for _ in range(n)],
            rng.choice([8, 16]),
            rng.choice([1, 4, 16]),
            seed,
        )


def test_a_batch_of_exactly_the_graphs_size_is_unchanged():
    check([5, 9, 2, 17], 4, 4, seed=11)
