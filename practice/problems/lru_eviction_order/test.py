"""Tests of problem 92: LRU eviction order."""

import pytest

from submission import eviction_order

EXAMPLE = {
    "A": (None, 4, 2, 0),
    "B": ("A", 2, 6, 0),
    "C": ("A", 3, 4, 0),
    "D": (None, 5, 1, 1),
    "E": ("D", 1, 7, 0),
}


def check(nodes, num_tokens, expected):
    got = eviction_order(dict(nodes), num_tokens)
    assert list(got) == expected, (
        f"eviction_order({nodes}, num_tokens={num_tokens}): expected {expected}, got {list(got)}"
    )


def test_example_children_before_their_parent():
    check(EXAMPLE, 6, ["C", "B", "A"])


def test_example_one_leaf_is_enough():
    check(EXAMPLE, 3, ["C"])


def test_everything_evictable():
    check(EXAMPLE, 10, ["C", "B", "A", "E"])


def test_more_than_evictable_raises():
    with pytest.raises(ValueError):
        eviction_order(dict(EXAMPLE), 11)


def test_nothing_to_evict():
    check(EXAMPLE, 0, [])
    check({}, 0, [])


def test_overshoot_with_whole_nodes():
    check({"X": (None, 16, 5, 0), "Y": (None, 2, 9, 0)}, 1, ["X"])


def test_a_locked_leaf_is_skipped_however_old():
    check({"A": (None, 3, 1, 1), "B": (None, 3, 2, 0)}, 3, ["B"])


def test_a_parent_waits_for_its_last_child():
    nodes = {"P": (None, 2, 1, 0), "Q": ("P", 2, 3, 0), "R": ("P", 2, 8, 0), "S": (None, 2, 5, 0)}
    check(nodes, 7, ["Q", "S", "R", "P"])


def test_a_chain_peels_from_the_bottom():
    nodes = {"a": (None, 1, 1, 0), "b": ("a", 1, 2, 0), "c": ("b", 1, 3, 0), "z": (None, 1, 10, 0)}
    check(nodes, 4, ["c", "b", "a", "z"])


def test_a_parent_with_a_locked_child_stays():
    nodes = {"P": (None, 4, 1, 1), "L": ("P", 2, 2, 1), "U": ("P", 2, 3, 0), "V": (None, 3, 9, 0)}
    check(nodes, 5, ["U", "V"])
    with pytest.raises(ValueError):
        eviction_order(dict(nodes), 6)


def test_newly_exposed_parent_older_than_remaining_leaves_goes_first():
    nodes = {
        "old": (None, 2, 1, 0),
        "kid": ("old", 2, 4, 0),
        "mid": (None, 2, 5, 0),
        "new": (None, 2, 6, 0),
    }
    check(nodes, 6, ["kid", "old", "mid"])
