"""Tests of problem 133: A chat template by hand."""

import pytest
from submission import render_chatml


def test_example_one_user_message():
    got = render_chatml([{"role": "user", "content": "Hi"}], "Be kind.", True)
    expected = (
        "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert got == expected, f"got {got!r}"


def test_a_leading_system_message_replaces_the_default():
    got = render_chatml(
        [{"role": "system", "content": "Terse."}, {"role": "user", "content": "2+2?"}],
        "Be kind.",
        False,
    )
    assert got == "<|im_start|>system\nTerse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"


def test_history_keeps_every_turn_in_order():
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    got = render_chatml(history, "S", True)
    assert got.count("<|im_start|>") == 5
    assert got.index("Hi") < got.index("Hello!") < got.index("Bye")
    assert got.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_without_generation_prompt_it_ends_after_the_last_message():
    got = render_chatml([{"role": "user", "content": "x"}], "S", False)
    assert got.endswith("<|im_start|>user\nx<|im_end|>\n")


def test_bad_roles_are_refused():
    with pytest.raises(ValueError):
        render_chatml([{"role": "wizard", "content": "x"}], "S", True)
    with pytest.raises(ValueError):
        render_chatml(
            [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "S", True
        )
