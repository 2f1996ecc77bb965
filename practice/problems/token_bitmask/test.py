"""Tests of problem 252: Packing a token mask into 32-bit words."""

import math
import random

from submission import apply, pack, unpack


def test_example():
    assert pack({0, 1, 31}, 40) == [-2147483645, 0]
    assert sorted(unpack([-1, 1], 34)) == list(range(33))
    assert apply([1.0, 2.0, 3.0], [0b101]) == [1.0, -math.inf, 3.0]


def test_pack_and_unpack_are_inverse_and_words_are_signed_32_bit():
    rng = random.Random(0)
    for vocab in (1, 31, 32, 33, 100, 1000):
        allowed = {j for j in range(vocab) if rng.random() < 0.4}
        words = pack(allowed, vocab)
        assert len(words) == (vocab + 31) // 32, f"vocab {vocab}: {len(words)} words"
        assert all(-(2**31) <= w < 2**31 for w in words), f"not signed 32-bit: {words}"
        assert unpack(words, vocab) == allowed


def test_an_all_ones_row_allows_everything_and_apply_leaves_it_alone():
    logits = [0.5, -1.0, 2.0, 7.0]
    assert apply(logits, [-1]) == logits
    assert apply(logits, [0]) == [-math.inf] * 4
    assert pack(set(range(32)), 32) == [-1]
