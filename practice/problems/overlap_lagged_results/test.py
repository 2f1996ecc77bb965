"""Tests of problem 111: Overlap scheduling and its lagging results."""

from submission import overlap_outputs


def check(tokens, max_tokens, eos, expected_steps, expected_forwards):
    steps, forwards = overlap_outputs([list(t) for t in tokens], list(max_tokens), set(eos))
    steps = [[tuple(o) for o in step] for step in steps]
    call = f"overlap_outputs({tokens}, max_tokens={max_tokens}, eos={set(eos)})"
    if steps != expected_steps:
        first = next(
            (i for i, (g, e) in enumerate(zip(steps, expected_steps)) if g != e),
            min(len(steps), len(expected_steps)),
        )
        raise AssertionError(
            f"{call}: outputs per step differ first at step {first}: expected "
            f"{expected_steps[first] if first < len(expected_steps) else 'no step'}, got "
            f"{steps[first] if first < len(steps) else 'no step'}\n"
            f"expected {expected_steps}\ngot      {steps}"
        )
    assert list(forwards) == expected_forwards, (
        f"{call}: forwards per request: expected {expected_forwards}, got {list(forwards)}"
    )


def test_example_eos_costs_one_extra_forward():
    check(
        [[5, 2, 7, 8], [9, 9, 9, 9]],
        [4, 3],
        {2},
        [[], [(0, 5, False), (1, 9, False)], [(0, 2, True), (1, 9, False)], [(1, 9, True)]],
        [3, 3],
    )


def test_example_a_single_request_to_max_tokens():
    check([[1, 1, 1]], [3], set(), [[], [(0, 1, False)], [(0, 1, False)], [(0, 1, True)]], [3])


def test_eos_in_the_prefill_token():
    check([[2, 3, 3]], [3], {2}, [[], [(0, 2, True)], []], [2])


def test_max_tokens_1_never_decodes():
    check([[4]], [1], set(), [[], [(0, 4, True)]], [1])


def test_eos_on_the_last_allowed_token_wastes_nothing():
    check([[1, 1, 2]], [3], {2}, [[], [(0, 1, False)], [(0, 1, False)], [(0, 2, True)]], [3])


def test_three_requests_finishing_three_ways():
    check(
        [[4, 4, 4], [2, 6, 6], [7, 2, 8]],
        [3, 3, 2],
        {2},
        [
            [],
            [(0, 4, False), (1, 2, True), (2, 7, False)],
            [(0, 4, False), (2, 2, True)],
            [(0, 4, True)],
        ],
        [3, 2, 2],
    )


def test_eos_is_ignored_when_not_in_the_eos_set():
    check([[2, 2]], [2], {5}, [[], [(0, 2, False)], [(0, 2, True)]], [2])


def test_the_dropped_token_is_never_reported():
    steps, _ = overlap_outputs([[8, 2, 99, 99], [3, 3, 3, 3]], [4, 4], {2})
    reported = [o for step in steps for o in step if o[0] == 0]
    assert [t for _, t, _ in reported] == [8, 2], (
        f"request 0 hits EOS (2) at its second token: only 8, 2 may be reported, got {reported}"
    )


def test_several_eos_finishes_at_different_steps():
    check(
        [[1, 2, 0, 0, 0], [1, 1, 1, 2, 0], [1, 1, 1, 1, 1]],
        [5, 5, 5],
        {2},
        [
            [],
            [(0, 1, False), (1, 1, False), (2, 1, False)],
            [(0, 2, True), (1, 1, False), (2, 1, False)],
            [(1, 1, False), (2, 1, False)],
            [(1, 2, True), (2, 1, False)],
            [(2, 1, True)],
        ],
        [3, 5, 5],
    )
