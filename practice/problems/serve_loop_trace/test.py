"""Tests of problem 141: When does the scheduler loop block?"""

from submission import trace


def check(arrivals, steps, expected):
    got = trace(arrivals, steps)
    assert got == expected, f"trace({arrivals}, {steps}):\n expected {expected}\n got      {got}"


def test_example():
    check(
        {0: [1], 1: [2], 5: [3]},
        {1: 2, 2: 2, 3: 1},
        [
            "block until 0",
            "step 0: [1]",
            "step 1: [1, 2]",
            "step 2: [2]",
            "block until 5",
            "step 5: [3]",
        ],
    )


def test_nothing_arrives_nothing_happens():
    check({}, {}, [])


def test_a_burst_is_admitted_together():
    check({3: [7, 8, 9]}, {7: 1, 8: 2, 9: 1}, ["block until 3", "step 3: [7, 8, 9]", "step 4: [8]"])


def test_arrivals_during_a_long_request_never_block():
    got = trace({0: [1], 2: [2], 4: [3]}, {1: 6, 2: 1, 3: 1})
    assert got.count("block until 0") == 1 and sum(e.startswith("block") for e in got) == 1, got
    assert got == [
        "block until 0",
        "step 0: [1]",
        "step 1: [1]",
        "step 2: [1, 2]",
        "step 3: [1]",
        "step 4: [1, 3]",
        "step 5: [1]",
    ]


def test_a_late_arrival_waits_for_the_next_iteration_not_the_next_idle_period():
    # request 2 arrives at 1, while 1 runs: it starts at step 1, not after 1 finishes
    check(
        {0: [1], 1: [2]},
        {1: 3, 2: 1},
        ["block until 0", "step 0: [1]", "step 1: [1, 2]", "step 2: [1]"],
    )
