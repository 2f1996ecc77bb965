"""Tests of problem 132: Stop strings in a stream."""

import random

from submission import StopMatcher


def run(stop, pieces):
    """(shown text, stopped) over a whole stream, flushing at the end if not stopped."""
    m = StopMatcher(stop)
    shown = []
    for piece in pieces:
        text, stopped = m.push(piece)
        shown.append(text)
        if stopped:
            return "".join(shown), True, shown
    shown.append(m.flush())
    return "".join(shown), False, shown


def test_example_cut_across_pieces():
    m = StopMatcher(["</answer>"])
    assert m.push("It is 4.</an") == ("It is 4.", False)
    assert m.push("swer> more") == ("", True)


def test_a_false_alarm_is_released():
    m = StopMatcher(["STOP"])
    assert m.push("go ST") == ("go ", False)
    assert m.push("ART") == ("START", False)
    assert m.flush() == ""


def test_the_earliest_stop_wins():
    assert run(["\n\n", "."], ["One. Two\n\nThree"])[:2] == ("One", True)


def test_no_stop_strings_no_holding():
    m = StopMatcher([])
    assert m.push("abc </") == ("abc </", False)
    assert StopMatcher([""]).push("x") == ("x", False)


def test_any_split_gives_the_same_result_and_never_shows_the_stop():
    rng = random.Random(5)
    text = "The answer is 42.</answer> And then more </answer> text"
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(0, 8)))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        shown, stopped, parts = run(["</answer>"], pieces)
        assert (shown, stopped) == ("The answer is 42.", True), f"pieces {pieces}: {parts}"


def test_held_text_comes_out_at_flush():
    shown, stopped, _ = run(["<end>"], ["abc <e", "n"])
    assert (shown, stopped) == ("abc <en", False)
