"""Tests of problem 62: The sampler of a mixed batch."""

import os
from pathlib import Path

import pytest

import torch

from minisgl.core import SamplingParams
from minisgl.engine.sample import Sampler, BatchSamplingArgs
from minisgl.llm import LLM
from submission import sample

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it

CPU = torch.device("cpu")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Hi"]


def make_args(rows: list[tuple[float, int, float]], vocab: int) -> BatchSamplingArgs:
    """rows: (temperature, top_k, top_p) per row; temperature 0 = greedy, top_k -1 = off."""
    greedy = [t == 0.0 or k == 1 for t, k, _ in rows]
    return BatchSamplingArgs(
        all_greedy=all(greedy),
        greedy=torch.tensor(greedy),
        temperature=torch.tensor([[1.0 if g else t] for g, (t, _, _) in zip(greedy, rows)]),
        top_k=torch.tensor([[vocab if k == -1 else k] for _, k, _ in rows]),
        top_p=torch.tensor([[p] for _, _, p in rows]),
    )


def run_sample(logits: torch.Tensor, rows, seed: int = 0) -> torch.Tensor:
    out = sample(Sampler(CPU, logits.shape[-1], seed), logits, make_args(rows, logits.shape[-1]))
    assert isinstance(out, torch.Tensor), f"sample must return a tensor, got {type(out)}"
    assert out.shape == (logits.shape[0],), (
        f"expected one token per row, shape ({logits.shape[0]},); got shape {tuple(out.shape)}"
    )
    assert out.dtype == torch.int64, f"expected int64 token ids, got {out.dtype}"
    return out


def frequencies(probs: list[float], rows_params, draws: int = 20000) -> list[float]:
    logits = torch.tensor(probs).log().expand(draws, len(probs)).contiguous()
    tokens = run_sample(logits, [rows_params] * draws)
    return (torch.bincount(tokens, minlength=len(probs)).double() / draws).tolist()


def assert_close(got: list[float], expected: list[float], what: str, tol: float = 0.02) -> None:
    ok = all(abs(g - e) <= tol for g, e in zip(got, expected))
    assert ok, (
        f"{what}: expected frequencies {[round(e, 3) for e in expected]}, "
        f"got {[round(g, 3) for g in got]}"
    )


@pytest.fixture
def llm():
    """A fresh engine for every test: a failing sampler leaves the scheduler mid-step."""
    return LLM(
        str(MODEL),
        device="cpu",
        show_progress=False,
        cache_type="naive",
        enable_overlap=False,
        num_pages=1024,
        max_running_req=8,
    )


def generate(llm, monkeypatch, params, patched: bool) -> list[list[int]]:
    with monkeypatch.context() as m:
        if patched:
            m.setattr(Sampler, "sample", sample)
        return [out["token_ids"] for out in llm.generate(PROMPTS, params)]


# --- samples ---------------------------------------------------------------------------------


def test_example_greedy_rows_take_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    got = run_sample(logits, [(0.0, -1, 1.0), (0.0, -1, 1.0)]).tolist()
    assert got == [1, 0], f"logits {logits.tolist()}, greedy rows: expected [1, 0], got {got}"


def test_example_greedy_generation_in_the_real_engine(llm, monkeypatch):
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (5, 4, 3, 2)]
    expected = generate(llm, monkeypatch, params, patched=False)
    got = generate(llm, monkeypatch, params, patched=True)
    assert got == expected, (
        f"LLM.generate({PROMPTS}) with your sampler: expected token ids {expected}, got {got}"
    )


# --- hidden ----------------------------------------------------------------------------------


def test_random_rows_do_not_change_greedy_rows_of_the_same_batch(llm, monkeypatch):
    params = [
        SamplingParams(max_tokens=5, ignore_eos=True),
        SamplingParams(max_tokens=5, ignore_eos=True, temperature=1.0, top_k=50),
        SamplingParams(max_tokens=5, ignore_eos=True),
        SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.7, top_p=0.9),
    ]
    expected = generate(llm, monkeypatch, params, patched=False)
    got = generate(llm, monkeypatch, params, patched=True)
    for i in (0, 2):
        assert got[i] == expected[i], (
            f"greedy request {PROMPTS[i]!r} in a batch with random requests: expected "
            f"{expected[i]}, got {got[i]}"
        )


def test_engine_draws_stay_inside_each_rows_top_k(llm, monkeypatch):
    seen = []

    def recording(self, logits, args):
        tokens = sample(self, logits, args)
        seen.append((logits.clone(), tokens.clone()))
        return tokens

    params = [SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.5, top_k=3)] * 4
    with monkeypatch.context() as m:
        m.setattr(Sampler, "sample", recording)
        llm.generate(PROMPTS, params)
    assert seen, "the engine never called the sampler"
    for logits, tokens in seen:
        top3 = logits.topk(3, dim=-1).indices
        for row, token in enumerate(tokens.tolist()):
            allowed = top3[row].tolist()
            assert token in allowed, (
                f"top_k=3, temperature=1.5: row {row} drew token {token}, "
                f"which is not among its top-3 ids {allowed}"
            )


def test_a_tiny_top_p_in_the_engine_is_greedy(llm, monkeypatch):
    greedy = [SamplingParams(max_tokens=4, ignore_eos=True)] * 4
    nucleus = [SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.3, top_p=1e-6)] * 4
    expected = generate(llm, monkeypatch, greedy, patched=False)
    got = generate(llm, monkeypatch, nucleus, patched=True)
    assert got == expected, (
        f"temperature=1.3, top_p=1e-6 keeps only the top token: expected "
        f"the greedy output {expected}, got {got}"
    )


def test_mixed_rows_in_one_call():
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0], [4.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 9.0]])
    rows = [(0.0, -1, 1.0), (1.0, -1, 1.0), (0.0, -1, 1.0)]
    for seed in range(20):
        got = run_sample(logits, rows, seed).tolist()
        assert got[0] == 1 and got[2] == 3, (
            f"rows 0 and 2 are greedy (argmax 1 and 3) beside a random row 1: got {got}"
        )


def test_frequencies_follow_the_softmax_at_temperature_1():
    probs = [0.5, 0.3, 0.15, 0.05]
    assert_close(frequencies(probs, (1.0, -1, 1.0)), probs, "temperature 1, no limits")


def test_temperature_sharpens_the_distribution():
    probs = [0.5, 0.3, 0.15, 0.05]
    squared = [p * p for p in probs]
    expected = [s / sum(squared) for s in squared]
    assert_close(
        frequencies(probs, (0.5, -1, 1.0)), expected, "temperature 0.5 (p^2, renormalized)"
    )


def test_top_k_keeps_the_k_most_probable_and_renormalizes():
    probs = [0.15, 0.5, 0.05, 0.3]
    assert_close(frequencies(probs, (1.0, 2, 1.0)), [0.0, 0.625, 0.0, 0.375], "top_k=2", tol=0.02)


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = [0.5, 0.3, 0.15, 0.05]
    # mass before token 1 is 0.5 < 0.6: kept; before token 2 it is 0.8: dropped
    assert_close(frequencies(probs, (1.0, -1, 0.6)), [0.625, 0.375, 0.0, 0.0], "top_p=0.6")
    assert_close(frequencies(probs, (1.0, -1, 0.45)), [1.0, 0.0, 0.0, 0.0], "top_p=0.45")


def test_top_k_and_top_p_together():
    probs = [0.4, 0.3, 0.2, 0.1]
    # top_k=3 keeps {0,1,2}; top_p=0.65 keeps {0,1}: the tighter wins
    assert_close(
        frequencies(probs, (1.0, 3, 0.65)), [4 / 7, 3 / 7, 0.0, 0.0], "top_k=3, top_p=0.65"
    )


def test_top_p_applies_to_the_renormalized_top_k():
    probs = [0.4, 0.3, 0.2, 0.1]
    # top_k=2 renormalizes to [4/7, 3/7]: the mass before token 1 is 0.57 >= 0.5, so only
    # token 0 is left (on the raw probabilities it would be 0.4 < 0.5 and token 1 would stay)
    assert_close(frequencies(probs, (1.0, 2, 0.5)), [1.0, 0.0, 0.0, 0.0], "top_k=2, top_p=0.5")


def test_the_seeded_generator_makes_draws_repeatable_whatever_the_global_rng():
    logits = torch.zeros(256, 64)  # uniform: every draw is a real random choice
    rows = [(1.0, -1, 1.0)] * 256
    torch.manual_seed(1)
    first = run_sample(logits, rows, seed=7).tolist()
    torch.manual_seed(2)
    again = run_sample(logits, rows, seed=7).tolist()
    assert first == again, (
        "two samplers with seed 7 drew different tokens after the global "
        "RNG was reseeded: draw with self.generator"
    )
    other = run_sample(logits, rows, seed=8).tolist()
    assert first != other, "seeds 7 and 8 drew the same 256 tokens: use self.generator"


def test_the_generator_advances_from_one_call_to_the_next():
    logits = torch.zeros(256, 64)
    rows = [(1.0, -1, 1.0)] * 256
    sampler = Sampler(CPU, 64, seed=3)
    args = make_args(rows, 64)
    first, second = sample(sampler, logits, args).tolist(), sample(sampler, logits, args).tolist()
    assert first != second, "two calls of one sampler drew the same 256 tokens"
