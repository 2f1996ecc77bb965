"""Tests of problem 3 (forward_calls)."""

from submission import forward_calls


def check(prompt_len, max_new_tokens, eos_at, expected):
    got = forward_calls(prompt_len, max_new_tokens, eos_at)
    assert list(map(tuple, got)) == expected, (
        f"forward_calls({prompt_len}, {max_new_tokens}, eos_at={eos_at}): "
        f"expected {expected}, got {got}"
    )


def test_example_three_tokens():
    check(5, 3, None, [(0, 5), (5, 1), (6, 1)])


def test_example_eos_first():
    check(5, 3, 0, [(0, 5)])


def test_one_token_is_only_the_prefill():
    check(7, 1, None, [(0, 7)])


def test_no_tokens_no_calls():
    check(4, 0, None, [])


def test_eos_in_the_middle_stops_after_it():
    check(3, 10, 2, [(0, 3), (3, 1), (4, 1)])


def test_eos_on_the_last_allowed_token():
    check(2, 4, 3, [(0, 2), (2, 1), (3, 1), (4, 1)])


def test_eos_after_the_limit_changes_nothing():
    check(2, 3, 5, [(0, 2), (2, 1), (3, 1)])


def test_one_token_prompt():
    check(1, 4, None, [(0, 1), (1, 1), (2, 1), (3, 1)])


def test_the_last_token_never_enters_the_cache():
    calls = forward_calls(100, 50)
    fed = sum(n for _, n in calls)
    assert len(calls) == 50, f"forward_calls(100, 50): expected 50 calls, got {len(calls)}"
    assert fed == 149, (
        f"forward_calls(100, 50) feeds {fed} tokens in all; expected 149: the "
        "prompt plus every generated token but the last"
    )
    last = calls[-1]
    assert tuple(last) == (148, 1), (
        f"forward_calls(100, 50): last call expected (148, 1), got {last}"
    )
