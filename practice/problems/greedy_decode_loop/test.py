"""Tests of problem 2 (generate_ids), with the chapter 0 tiny engine on tiny-qwen3."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

import minisgl.tiny_engine as tiny
from submission import generate_ids

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

PROMPT = [1, 17, 404, 9, 2024]


@pytest.fixture(scope="module")
def engine() -> tiny.TinyEngine:
    return tiny.TinyEngine(MODELS / "tiny-qwen3")


def reference(engine: tiny.TinyEngine, prompt: list[int], n: int, ignore_eos: bool) -> list[int]:
    return tiny.TinyEngine.generate_ids(engine, prompt, n, ignore_eos)


def spy_on_forward(engine: tiny.TinyEngine, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Record every model.forward call: its tokens, positions, cache object and cache length."""
    calls: list[dict] = []
    forward = engine.model.forward

    def spy(input_ids, positions, kv):
        calls.append(
            {
                "ids": input_ids.tolist(),
                "positions": positions.tolist(),
                "kv": id(kv),
                "cached": len(kv),
            }
        )
        return forward(input_ids, positions, kv)

    monkeypatch.setattr(engine.model, "forward", spy)
    return calls


def test_example_same_tokens_as_the_engine(engine):
    want = reference(engine, PROMPT, 6, True)
    got = generate_ids(engine, PROMPT, 6, ignore_eos=True)
    assert got == want, (
        f"generate_ids(engine, {PROMPT}, 6, ignore_eos=True) on tiny-qwen3:\n"
        f"expected {want}\ngot      {got}"
    )


def test_returns_python_ints(engine):
    got = generate_ids(engine, PROMPT, 2, ignore_eos=True)
    assert isinstance(got, list) and all(type(t) is int for t in got), (
        f"generate_ids must return a list of Python ints, got {got!r}"
    )


def test_prefill_once_then_one_token_per_step(engine, monkeypatch):
    want = reference(engine, PROMPT, 4, True)
    calls = spy_on_forward(engine, monkeypatch)
    got = generate_ids(engine, PROMPT, 4, ignore_eos=True)
    assert len(calls) == 4, (
        f"generate_ids(engine, {PROMPT}, 4): expected 4 forward calls "
        f"(1 prefill + 3 decode), got {len(calls)}"
    )
    first = calls[0]
    assert first["ids"] == PROMPT and first["positions"] == list(range(len(PROMPT))), (
        f"the prefill must run the whole prompt at positions 0..{len(PROMPT) - 1}; got ids "
        f"{first['ids']} at positions {first['positions']}"
    )
    for step, call in enumerate(calls[1:], start=1):
        expected = {"ids": [want[step - 1]], "positions": [len(PROMPT) + step - 1]}
        assert call["ids"] == expected["ids"] and call["positions"] == expected["positions"], (
            f"decode call {step} must feed only the newest token {expected['ids']} at position "
            f"{expected['positions']}; got ids {call['ids']} at positions {call['positions']}"
        )
    assert len({call["kv"] for call in calls}) == 1, "all calls must share one KVCache"
    assert [c["cached"] for c in calls] == [0, 5, 6, 7], (
        f"tokens in the cache before each call: expected [0, 5, 6, 7], got "
        f"{[c['cached'] for c in calls]}"
    )
    assert got == want


def test_one_token_is_one_forward(engine, monkeypatch):
    calls = spy_on_forward(engine, monkeypatch)
    got = generate_ids(engine, PROMPT, 1, ignore_eos=True)
    assert len(calls) == 1 and len(got) == 1, (
        f"generate_ids(engine, {PROMPT}, 1): expected 1 forward call and 1 token, got "
        f"{len(calls)} calls and tokens {got}"
    )


def test_stops_right_after_eos_and_returns_it(engine, monkeypatch):
    want = reference(engine, PROMPT, 6, True)
    eos = want[2]  # pretend the third token is EOS
    config = dataclasses.replace(engine.model.config, eos_token_ids=(eos,))
    monkeypatch.setattr(engine.model, "config", config)
    got = generate_ids(engine, PROMPT, 6)
    expected = want[: want.index(eos) + 1]
    assert got == expected, (
        f"with eos_token_ids=({eos},), generate_ids(engine, {PROMPT}, 6) "
        f"must stop right after the first EOS:\nexpected {expected}\n"
        f"got      {got}"
    )
    got = generate_ids(engine, PROMPT, 6, ignore_eos=True)
    assert got == want, f"ignore_eos=True must go on past EOS:\nexpected {want}\ngot      {got}"


def test_runs_as_the_engine_method(engine, monkeypatch):
    monkeypatch.setattr(tiny.TinyEngine, "generate_ids", generate_ids)
    text = engine.generate("The capital of France is", 5)
    monkeypatch.undo()
    want = engine.generate("The capital of France is", 5)
    assert text == want, (
        f"TinyEngine.generate with your generate_ids: expected {want!r}, got {text!r}"
    )
