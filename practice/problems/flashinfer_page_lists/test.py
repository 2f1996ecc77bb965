"""Tests of problem 171 (csr_lists). Expected lists are rebuilt token by token: the keys of
request r are the slots its tokens occupy, read back from the lists the way FlashInfer does."""

import random

from submission import csr_lists


def keys_read_by_the_kernel(lists, r, page_size):
    """The slots FlashInfer reads for request r, from the three lists alone."""
    kv_indptr, kv_indices, last_page_len = lists
    own = kv_indices[kv_indptr[r] : kv_indptr[r + 1]]
    count = (len(own) - 1) * page_size + last_page_len[r]
    return [own[t // page_size] * page_size + t % page_size for t in range(count)]


def check(pages, seq_lens, page_size):
    got = csr_lists([list(p) for p in pages], list(seq_lens), page_size)
    call = f"csr_lists({pages}, {seq_lens}, {page_size})"
    assert len(got) == 3 and len(got[0]) == len(pages) + 1, f"{call}: got {got}"
    assert got[0][0] == 0 and got[1] == [p for own in pages for p in own], f"{call}: got {got}"
    for r, (own, n) in enumerate(zip(pages, seq_lens)):
        expected = [own[t // page_size] * page_size + t % page_size for t in range(n)]
        read = keys_read_by_the_kernel(got, r, page_size)
        assert read == expected, (
            f"{call}: request {r} ({n} tokens) would read {len(read)} keys, slots {read}, "
            f"instead of {expected}\n(got {got})"
        )


def test_example_three_requests():
    assert csr_lists([[5, 2, 9], [0], [7, 3]], [10, 3, 8], 4) == (
        [0, 3, 4, 6],
        [5, 2, 9, 0, 7, 3],
        [2, 3, 4],
    )


def test_full_last_pages():
    check([[1, 4], [6]], [8, 4], 4)


def test_page_size_one():
    check([[3, 1, 2], [0]], [3, 1], 1)


def test_random_batches():
    rng = random.Random(0)
    for page_size in (2, 3, 16):
        seq_lens = [rng.randint(1, 50) for _ in range(5)]
        free = rng.sample(range(200), sum(-(-n // page_size) for n in seq_lens))
        pages = [[free.pop() for _ in range(-(-n // page_size))] for n in seq_lens]
        check(pages, seq_lens, page_size)


def test_wrong_page_counts_raise():
    for pages, seq_lens in (([[1]], [5]), ([[1, 2, 3]], [5])):
        try:
            got = csr_lists(pages, seq_lens, 4)
        except ValueError:
            continue
        raise AssertionError(f"csr_lists({pages}, {seq_lens}, 4): expected ValueError, got {got}")
