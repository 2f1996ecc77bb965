"""Tests of problem 173 (pages_of_row): rows are built from random pages, so the expected
pages are known; then single slots are corrupted."""

import random

from submission import pages_of_row


def row_of(pages, page_size, seq_len, width):
    slots = [pages[t // page_size] * page_size + t % page_size for t in range(seq_len)]
    return slots + [0] * (width - seq_len)


def test_example_three_pages():
    assert pages_of_row([20, 21, 22, 23, 4, 5, 6, 7, 36, 0, 0, 0], 9, 4) == [5, 1, 9]


def test_random_rows_give_back_their_pages():
    rng = random.Random(2)
    for page_size in (1, 2, 4, 16):
        for _ in range(10):
            seq_len = rng.randint(1, 60)
            pages = rng.sample(range(100), -(-seq_len // page_size))
            row = row_of(pages, page_size, seq_len, 64)
            got = pages_of_row(row, seq_len, page_size)
            assert got == pages, (
                f"pages_of_row(row, {seq_len}, {page_size}) with pages {pages}: got {got}"
            )


def test_a_misplaced_slot_raises():
    rng = random.Random(3)
    for _ in range(10):
        page_size, seq_len = 4, rng.randint(2, 30)
        row = row_of(rng.sample(range(100), -(-seq_len // page_size)), page_size, seq_len, 32)
        t = rng.choice([t for t in range(seq_len) if t % page_size])  # not a page's first
        row[t] += 1000 * page_size  # same offset, another page
        try:
            got = pages_of_row(row, seq_len, page_size)
        except ValueError:
            continue
        raise AssertionError(
            f"pages_of_row: token {t} moved to slot {row[t]}; expected ValueError, got {got}"
        )
