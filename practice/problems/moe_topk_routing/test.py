"""Tests of problem 201: Top-k routing with renormalization."""

import math
import random

import pytest
from submission import route


def softmax(row):
    exps = [math.exp(x) for x in row]
    return [e / sum(exps) for e in exps]


def check(logits, top_k, renormalize, expected):
    got = route(logits, top_k, renormalize)
    assert len(got) == len(expected), f"{len(logits)} tokens, got {len(got)} rows"
    for t, (row, want) in enumerate(zip(got, expected)):
        experts, want_experts = [e for e, _ in row], [e for e, _ in want]
        assert experts == want_experts, (
            f"token {t} of {logits}: expected experts {want_experts}, got {experts}"
        )
        assert [w for _, w in row] == pytest.approx([w for _, w in want]), (
            f"token {t}: expected weights {[w for _, w in want]}, got {[w for _, w in row]}"
        )


def test_example():
    a, b = math.exp(2), math.exp(1)
    check([[2.0, 1.0, 0.0, 1.0]], 2, True, [[(0, a / (a + b)), (1, b / (a + b))]])


def test_without_renormalization_the_weights_are_the_softmax_probabilities():
    logits = [[0.5, -1.0, 2.0, 0.1, 0.3]]
    probs = softmax(logits[0])
    check(logits, 3, False, [[(2, probs[2]), (0, probs[0]), (4, probs[4])]])


def test_renormalized_weights_are_a_softmax_over_the_kept_logits():
    rng = random.Random(0)
    logits = [[rng.uniform(-3, 3) for _ in range(8)] for _ in range(6)]
    for row, routed in zip(logits, route(logits, 2, True)):
        kept = [row[e] for e, _ in routed]
        assert [w for _, w in routed] == pytest.approx(softmax(kept)), f"logits {row}"
        assert sum(w for _, w in routed) == pytest.approx(1.0)


def test_equal_probabilities_keep_the_lower_expert_first():
    check([[1.0, 3.0, 3.0, 3.0]], 2, True, [[(1, 0.5), (2, 0.5)]])


def test_large_logits_do_not_overflow():
    got = route([[1000.0, 999.0, -1000.0]], 1, False)
    assert got[0][0][0] == 0 and got[0][0][1] == pytest.approx(1 / (1 + math.exp(-1)))


def test_every_expert_kept_and_renormalized_is_the_plain_softmax():
    logits = [[0.2, -0.4, 1.5]]
    probs = softmax(logits[0])
    order = sorted(range(3), key=lambda e: -probs[e])
    check(logits, 3, True, [[(e, probs[e]) for e in order]])
