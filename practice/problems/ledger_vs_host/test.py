"""Tests of problem 112: The ledger runs one step ahead."""

from submission import overlap_timeline, tokens_if_ledger_decides


def check(prompt_len, max_tokens, expected):
    got = [tuple(x) for x in overlap_timeline(prompt_len, max_tokens)]
    assert got == expected, (
        f"overlap_timeline(prompt_len={prompt_len}, max_tokens={max_tokens})"
        f"\nexpected {expected}\ngot      {got}"
    )


def check_ledger(prompt_len, max_tokens, expected):
    got = tokens_if_ledger_decides(prompt_len, max_tokens)
    assert got == expected, (
        f"tokens_if_ledger_decides(prompt_len={prompt_len}, max_tokens="
        f"{max_tokens}): expected {expected}, got {got}"
    )


def test_example_three_tokens():
    check(5, 3, [(5, 6, 5, False), (6, 7, 6, False), (7, 8, 7, False), (7, 8, 8, True)])
    check_ledger(5, 3, 2)


def test_one_token_is_done_after_the_prefill():
    check(5, 1, [(5, 6, 5, False), (5, 6, 6, True)])


def test_two_tokens():
    check(4, 2, [(4, 5, 4, False), (5, 6, 5, False), (5, 6, 6, True)])


def test_a_one_token_prompt():
    check(
        1,
        4,
        [(1, 2, 1, False), (2, 3, 2, False), (3, 4, 3, False), (4, 5, 4, False), (4, 5, 5, True)],
    )


def test_the_last_step_launches_nothing():
    timeline = overlap_timeline(10, 6)
    assert len(timeline) == 7, f"6 tokens take 7 overlapped steps, got {len(timeline)}"
    assert timeline[-1][:2] == timeline[-2][:2], (
        f"the ledger is done one step early, so the last step launches nothing: "
        f"{timeline[-2]} then {timeline[-1]}"
    )


def test_host_always_trails_the_ledger_by_one_until_the_end():
    for prompt_len, max_tokens in [(3, 5), (7, 2), (2, 9)]:
        for step, (_, device, host, finished) in enumerate(
            overlap_timeline(prompt_len, max_tokens)
        ):
            expected = 0 if finished else 1
            assert device - host == expected, (
                f"overlap_timeline({prompt_len}, {max_tokens}) step {step}: device_len {device}, "
                f"host_len {host}: expected the ledger {expected} ahead"
            )


def test_the_ledger_would_cut_a_request_one_token_short():
    check_ledger(10, 6, 5)
    check_ledger(4, 2, 1)
    check_ledger(3, 20, 19)


def test_with_one_token_both_views_agree():
    check_ledger(5, 1, 1)
