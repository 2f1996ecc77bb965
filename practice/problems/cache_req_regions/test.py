"""Tests of problem 85: The four regions of cache_req."""

from submission import cache_req_regions


def check(old, lcp_now, cached_len, page_size, finished, expected):
    got = cache_req_regions(old, lcp_now, cached_len, page_size, finished)
    got = {k: (tuple(v) if k not in ("freed", "pages_freed") else v) for k, v in dict(got).items()}
    got["freed"] = [tuple(r) for r in got.get("freed", [])]
    call = (
        f"cache_req_regions(old={old}, lcp_now={lcp_now}, cached_len={cached_len}, "
        f"page_size={page_size}, finished={finished})"
    )
    for key, value in expected.items():
        assert got.get(key) == value, f"{call}[{key!r}]: expected {value}, got {got.get(key)}"


def test_example_a_finished_request_with_duplicates_and_a_tail():
    check(
        4,
        13,
        14,
        4,
        True,
        {
            "matched": (0, 4),
            "duplicate": (4, 12),
            "inserted": (12, 12),
            "tail": (12, 14),
            "freed": [(4, 12), (12, 14)],
            "pages_freed": 3,
        },
    )


def test_example_the_same_request_still_running_keeps_its_tail():
    check(
        4,
        13,
        14,
        4,
        False,
        {
            "matched": (0, 4),
            "duplicate": (4, 12),
            "inserted": (12, 12),
            "tail": (12, 14),
            "freed": [(4, 12)],
            "pages_freed": 2,
        },
    )


def test_nothing_cached_before_everything_whole_is_inserted():
    check(
        0,
        0,
        10,
        4,
        True,
        {
            "matched": (0, 0),
            "duplicate": (0, 0),
            "inserted": (0, 8),
            "tail": (8, 10),
            "freed": [(8, 10)],
            "pages_freed": 1,
        },
    )


def test_page_size_1_has_no_tail():
    check(
        3,
        5,
        10,
        1,
        True,
        {
            "matched": (0, 3),
            "duplicate": (3, 5),
            "inserted": (5, 10),
            "tail": (10, 10),
            "freed": [(3, 5)],
            "pages_freed": 2,
        },
    )


def test_no_duplicates_when_the_cache_holds_only_what_was_matched():
    check(
        8,
        8,
        20,
        4,
        False,
        {
            "matched": (0, 8),
            "duplicate": (8, 8),
            "inserted": (8, 20),
            "tail": (20, 20),
            "freed": [],
            "pages_freed": 0,
        },
    )


def test_the_common_prefix_rounds_down_to_a_page():
    check(
        0,
        7,
        16,
        4,
        False,
        {"duplicate": (0, 4), "inserted": (4, 16), "freed": [(0, 4)], "pages_freed": 1},
    )


def test_shared_never_exceeds_the_page_aligned_length():
    check(
        0,
        15,
        15,
        4,
        True,
        {
            "duplicate": (0, 12),
            "inserted": (12, 12),
            "tail": (12, 15),
            "freed": [(0, 12), (12, 15)],
            "pages_freed": 4,
        },
    )


def test_a_prompt_shorter_than_a_page():
    check(
        0,
        0,
        3,
        16,
        True,
        {
            "matched": (0, 0),
            "duplicate": (0, 0),
            "inserted": (0, 0),
            "tail": (0, 3),
            "freed": [(0, 3)],
            "pages_freed": 1,
        },
    )
    check(0, 0, 3, 16, False, {"freed": [], "pages_freed": 0})


def test_whole_pages_finished_frees_only_duplicates():
    check(
        16,
        32,
        48,
        16,
        True,
        {
            "matched": (0, 16),
            "duplicate": (16, 32),
            "inserted": (32, 48),
            "tail": (48, 48),
            "freed": [(16, 32)],
            "pages_freed": 1,
        },
    )


def test_every_slot_lands_in_exactly_one_region():
    for args in [
        (4, 9, 23, 4, True),
        (0, 0, 1, 1, False),
        (2, 2, 2, 2, True),
        (6, 17, 17, 3, False),
    ]:
        got = cache_req_regions(*args)
        parts = [tuple(got[k]) for k in ("matched", "duplicate", "inserted", "tail")]
        edges = [parts[0][0]] + [p[1] for p in parts]
        starts = [p[0] for p in parts]
        assert parts[0][0] == 0 and parts[-1][1] == args[2] and starts[1:] == edges[1:-1], (
            f"cache_req_regions{args}: the regions {parts} must tile [0, {args[2]}) in order"
        )
