"""Tests of problem 121: Token ids as packed int32 bytes."""

import random

import pytest
from submission import pack_ids, unpack_ids


def test_example_pack():
    got = pack_ids([1, 258])
    assert got == b"\x01\x00\x00\x00\x02\x01\x00\x00", f"pack_ids([1, 258]) gave {got!r}"


def test_example_unpack():
    got = unpack_ids(b"\x01\x00\x00\x00\x02\x01\x00\x00")
    assert got == [1, 258], f"expected [1, 258], got {got}"


def test_empty_list_is_empty_bytes():
    assert pack_ids([]) == b"" and unpack_ids(b"") == []


def test_four_bytes_per_id_and_a_round_trip():
    rng = random.Random(0)
    ids = [rng.randrange(-(2**31), 2**31) for _ in range(1000)]
    data = pack_ids(ids)
    assert len(data) == 4 * len(ids), f"{len(ids)} ids gave {len(data)} bytes"
    assert unpack_ids(data) == ids


def test_int32_limits_pack_and_beyond_them_is_an_error():
    assert unpack_ids(pack_ids([2**31 - 1, -(2**31)])) == [2**31 - 1, -(2**31)]
    for bad in (2**31, -(2**31) - 1):
        with pytest.raises(ValueError):
            pack_ids([5, bad])


def test_a_partial_id_is_an_error():
    with pytest.raises(ValueError):
        unpack_ids(b"\x01\x00\x00\x00\x02")
