"""Tests of problem 42 (kv_bytes_per_token, tokens_that_fit)."""

import pytest

from submission import kv_bytes_per_token, tokens_that_fit


def test_example_smollm2_float32():
    got = kv_bytes_per_token(30, 3, 64, 4)
    assert got == 46080, f"kv_bytes_per_token(30, 3, 64, 4): expected 46080, got {got}"


def test_example_one_gib():
    got = tokens_that_fit(2**30, 46080, 1)
    assert got == 23301, f"tokens_that_fit(2**30, 46080, 1): expected 23301, got {got}"


def test_example_pages_of_16():
    got = tokens_that_fit(2**30, 46080, 16)
    assert got == 23296, f"tokens_that_fit(2**30, 46080, 16): expected 23296, got {got}"


@pytest.mark.parametrize(
    "args, expected",
    [
        ((30, 3, 64, 2), 23040),  # SmolLM2 in bfloat16
        ((28, 8, 128, 2), 114688),  # Qwen3-0.6B in bfloat16: explicit head_dim 128
        ((2, 2, 16, 4), 512),  # the tiny models in float32
        ((32, 32, 128, 2), 524288),  # Llama-2-7B: no GQA, 512 KiB per token
    ],
)
def test_other_models(args, expected):
    got = kv_bytes_per_token(*args)
    assert got == expected, f"kv_bytes_per_token{args}: expected {expected}, got {got}"


@pytest.mark.parametrize(
    "args, expected",
    [
        ((46079, 46080, 1), 0),  # not even one token
        ((46080 * 15, 46080, 16), 0),  # 15 tokens' worth, but a page is 16
        ((46080 * 16, 46080, 16), 16),  # exactly one page
        ((80 * 2**30, 114688, 64), 748928),  # an 80 GiB budget for Qwen3-0.6B, pages of 64
    ],
)
def test_whole_pages_only(args, expected):
    got = tokens_that_fit(*args)
    assert got == expected, f"tokens_that_fit{args}: expected {expected}, got {got}"
    assert isinstance(got, int), (
        f"tokens_that_fit{args} must return an int, got {type(got).__name__}"
    )
