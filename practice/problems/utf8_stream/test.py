"""Tests of problem 131: Streaming text from byte-level tokens."""

import random

from submission import Utf8Stream

TEXTS = ["Tokyo 東京!", "Grüße aus Köln", "emoji 👍🏽 and 🎉", "Ελληνικά и русский", "plain"]


def stream(pieces):
    s = Utf8Stream()
    return [s.push(p) for p in pieces] + [s.flush()]


def test_example_a_kanji_split_over_tokens():
    got = stream([b"Tokyo \xe6", b"\x9d\xb1", b"\xe4\xba", b"\xac!"])
    assert got == ["Tokyo ", "東", "", "京!", ""], f"got {got}"


def test_no_piece_holds_half_a_character():
    data = "emoji 👍🏽".encode()
    pieces = [data[i : i + 1] for i in range(len(data))]  # one byte at a time
    got = stream(pieces)
    assert "".join(got) == "emoji 👍🏽"
    assert not any("\ufffd" in text for text in got), f"a broken character was shown: {got}"


def test_random_splits_of_real_text_join_to_the_text():
    rng = random.Random(7)
    for text in TEXTS * 20:
        data = text.encode()
        cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(0, 6))))
        pieces = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        got = stream(pieces)
        assert "".join(got) == text, f"pieces {pieces} gave {got}"
        assert "\ufffd" not in "".join(got[:-1])


def test_random_bytes_join_to_the_replacing_decode():
    rng = random.Random(3)
    for _ in range(300):
        pieces = [
            bytes(rng.randrange(256) for _ in range(rng.randint(0, 4)))
            for _ in range(rng.randint(1, 8))
        ]
        got = stream(pieces)
        expected = b"".join(pieces).decode("utf-8", "replace")
        assert "".join(got) == expected, f"pieces {pieces}: got {got}, expected {expected!r}"


def test_a_broken_tail_comes_out_at_flush():
    s = Utf8Stream()
    assert s.push(b"ok \xe6\x9d") == "ok "
    assert s.flush() == "\ufffd"
