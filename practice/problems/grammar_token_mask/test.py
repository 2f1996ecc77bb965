"""Tests of problem 251: The token mask of a finite grammar."""

import random

from submission import allowed_tokens

VOCAB = ["yes", "y", "es", "no", "<eos>", "n", "o"]


def test_example():
    assert sorted(allowed_tokens(VOCAB, {"yes", "no"}, "", eos=4)) == [0, 1, 3, 5]
    assert sorted(allowed_tokens(VOCAB, {"yes", "no"}, "y", eos=4)) == [2]
    assert sorted(allowed_tokens(VOCAB, {"yes", "no"}, "yes", eos=4)) == [4]


def test_a_dead_prefix_allows_nothing_and_empty_tokens_are_never_allowed():
    vocab = ["a", "", "b", "</s>"]
    assert allowed_tokens(vocab, {"ab"}, "x", eos=3) == set()
    assert allowed_tokens(vocab, {"ab"}, "a", eos=3) == {2}


def test_an_output_that_is_a_prefix_of_another_allows_both_eos_and_more():
    vocab = ["1", "2", "EOS", "12"]
    assert allowed_tokens(vocab, {"1", "12"}, "1", eos=2) == {1, 2}
    assert allowed_tokens(vocab, {"1", "12"}, "", eos=2) == {0, 3}


def test_any_walk_through_the_mask_ends_in_an_output():
    rng = random.Random(0)
    outputs = {"red", "green", "blue", "grey"}
    vocab = ["r", "e", "d", "g", "re", "en", "bl", "ue", "gr", "ey", "<e>", "b", "l", "u", "n", "y"]
    for _ in range(100):
        text = ""
        for _ in range(20):
            allowed = allowed_tokens(vocab, outputs, text, eos=10)
            assert allowed, f"no token allowed after {text!r}"
            token = rng.choice(sorted(allowed))
            if token == 10:
                break
            text += vocab[token]
        assert text in outputs, f"the mask let the walk write {text!r}"
