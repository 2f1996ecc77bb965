"""Tests of problem 193: Run a Triton program grid by hand."""

import random

from submission import run_prepare_inputs


def per_request(rows, cached_lens, extend_lens, token_pool, page_table):
    """The same three lists, request by request, with no grid at all."""
    positions, input_ids, out_loc = [], [], []
    for row, cached, n in zip(rows, cached_lens, extend_lens):
        for position in range(cached, cached + n):
            positions.append(position)
            input_ids.append(token_pool[row][position])
            out_loc.append(page_table[row][position])
    return positions, input_ids, out_loc


def check(rows, cached_lens, extend_lens, token_pool, page_table, block):
    expected = per_request(rows, cached_lens, extend_lens, token_pool, page_table)
    got = run_prepare_inputs(rows, cached_lens, extend_lens, token_pool, page_table, block)
    names = ("positions", "input_ids", "out_loc")
    for name, g, e in zip(names, got, expected):
        assert list(g) == e, (
            f"{name} for rows={rows}, cached_lens={cached_lens}, extend_lens={extend_lens}, "
            f"block={block}:\nexpected {e}\ngot      {list(g)}"
        )


def random_tables(num_rows, row_len, seed):
    rng = random.Random(seed)
    token_pool = [[rng.randrange(50_000) for _ in range(row_len)] for _ in range(num_rows)]
    page_table = [[rng.randrange(10_000) for _ in range(row_len)] for _ in range(num_rows)]
    return token_pool, page_table


def test_example():
    got = run_prepare_inputs(
        [1, 0],
        [2, 0],
        [2, 1],
        [[5, 6, 7, 8], [9, 10, 11, 12]],
        [[40, 41, 42, 43], [20, 21, 22, 23]],
        2,
    )
    assert tuple(map(list, got)) == ([2, 3, 0], [11, 12, 5], [22, 23, 40])


def test_a_decode_batch():
    token_pool, page_table = random_tables(5, 20, seed=1)
    check([4, 0, 2], [7, 0, 19], [1, 1, 1], token_pool, page_table, block=4)


def test_requests_longer_than_a_block_and_at_its_edges():
    token_pool, page_table = random_tables(4, 64, seed=2)
    check([3, 1, 0, 2], [0, 5, 30, 1], [8, 9, 7, 17], token_pool, page_table, block=8)


def test_random_batches():
    rng = random.Random(3)
    for _ in range(20):
        token_pool, page_table = random_tables(6, 40, seed=rng.randrange(1000))
        requests = rng.randint(1, 6)
        rows = rng.sample(range(6), requests)
        extend_lens = [rng.randint(1, 20) for _ in rows]
        cached_lens = [rng.randint(0, 40 - n) for n in extend_lens]
        check(
            rows, cached_lens, extend_lens, token_pool, page_table, block=rng.choice([1, 2, 4, 16])
        )
