"""Tests of problem 172 (visible_keys), against a ledger walk: a request with `cached` tokens
in the cache and `new` new ones computes positions cached..cached+new-1, and the token at
position p sees the p + 1 keys at positions 0..p."""

import random

from submission import visible_keys


def expected_from_ledgers(ledgers):
    return [p + 1 for cached, new in ledgers for p in range(cached, cached + new)]


def check(ledgers):
    qo_indptr = [0]
    for _, new in ledgers:
        qo_indptr.append(qo_indptr[-1] + new)
    kv_lens = [cached + new for cached, new in ledgers]
    got = visible_keys(qo_indptr, kv_lens)
    expected = expected_from_ledgers(ledgers)
    assert got == expected, (
        f"visible_keys({qo_indptr}, {kv_lens}) (ledgers (cached, new) {ledgers}):\n"
        f"expected {expected}\ngot      {got}"
    )


def test_example_cached_prefix_then_fresh_prompt():
    assert visible_keys([0, 2, 5], [6, 3]) == [5, 6, 1, 2, 3]


def test_fresh_prompts_are_plain_causal():
    check([(0, 4), (0, 1), (0, 3)])


def test_decode_rows_see_every_key():
    check([(9, 1), (0, 1), (30, 1)])


def test_random_chunked_batches():
    rng = random.Random(1)
    for _ in range(20):
        check([(rng.randint(0, 40), rng.randint(1, 12)) for _ in range(rng.randint(1, 6))])


def test_more_new_tokens_than_keys_raise():
    try:
        got = visible_keys([0, 5], [3])
    except ValueError:
        return
    raise AssertionError(f"visible_keys([0, 5], [3]): expected ValueError, got {got}")
