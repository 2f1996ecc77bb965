"""Tests of problem 64: Per-row sampling parameters."""

import os
from pathlib import Path

import pytest

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.sample import Sampler
from minisgl.llm import LLM
from submission import prepare

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it

CPU = torch.device("cpu")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Hi"]


def rows(*params: SamplingParams) -> list[Req]:
    return [
        Req(
            torch.tensor([1, 2], dtype=torch.int32),
            table_idx=i,
            cached_len=0,
            output_len=p.max_tokens,
            uid=i,
            sampling_params=p,
        )
        for i, p in enumerate(params)
    ]


def run(*params: SamplingParams, vocab: int = 100):
    args = prepare(Sampler(CPU, vocab, seed=0), Batch(rows(*params), "decode"))
    return args


def check_tensor(name, got, expected, dtype, shape):
    assert isinstance(got, torch.Tensor), f"{name}: expected a tensor, got {type(got).__name__}"
    assert got.dtype == dtype, f"{name}: expected dtype {dtype}, got {got.dtype}"
    assert tuple(got.shape) == shape, f"{name}: expected shape {shape}, got {tuple(got.shape)}"
    values = got.flatten().tolist()
    ok = all(abs(a - b) < 1e-6 for a, b in zip(values, expected))
    assert ok, f"{name}: expected {expected}, got {values}"


@pytest.fixture
def llm():
    return LLM(
        str(MODEL),
        device="cpu",
        show_progress=False,
        cache_type="naive",
        enable_overlap=False,
        num_pages=1024,
        max_running_req=8,
    )


# --- samples ---------------------------------------------------------------------------------


def test_example_a_greedy_and_a_random_row():
    args = run(SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9))
    assert not args.all_greedy, f"one row samples: all_greedy must be False, got {args.all_greedy}"
    check_tensor("greedy", args.greedy, [True, False], torch.bool, (2,))
    check_tensor("temperature", args.temperature, [1.0, 0.7], torch.float32, (2, 1))
    check_tensor("top_k", args.top_k, [100, 100], torch.int64, (2, 1))
    check_tensor("top_p", args.top_p, [1.0, 0.9], torch.float32, (2, 1))


def test_example_a_mixed_batch_in_the_real_engine(llm, monkeypatch):
    greedy = SamplingParams(max_tokens=4, ignore_eos=True)
    random_ = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.8, top_k=20)
    params = [greedy, random_, greedy, random_]
    expected = llm.generate(PROMPTS, params)
    with monkeypatch.context() as m:
        m.setattr(Sampler, "prepare", prepare)
        got = llm.generate(PROMPTS, params)
    for i in (0, 2):
        assert got[i]["token_ids"] == expected[i]["token_ids"], (
            f"greedy request {PROMPTS[i]!r} beside random ones: expected "
            f"{expected[i]['token_ids']}, got {got[i]['token_ids']}"
        )


# --- hidden ----------------------------------------------------------------------------------


def test_all_greedy():
    args = run(SamplingParams(), SamplingParams(temperature=1.0, top_k=1))
    assert bool(args.all_greedy) is True, (
        f"temperature 0 and top_k 1 are both greedy: all_greedy must be True, got {args.all_greedy}"
    )
    check_tensor("greedy", args.greedy, [True, True], torch.bool, (2,))


def test_greedy_rows_get_temperature_1():
    args = run(
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5, top_k=1),
        SamplingParams(temperature=0.3),
    )
    check_tensor("temperature", args.temperature, [1.0, 1.0, 0.3], torch.float32, (3, 1))


def test_top_k_off_becomes_the_vocabulary_size():
    args = run(
        SamplingParams(temperature=1.0, top_k=-1),
        SamplingParams(temperature=1.0, top_k=7),
        vocab=49152,
    )
    check_tensor("top_k", args.top_k, [49152, 7], torch.int64, (2, 1))


def test_one_row():
    args = run(SamplingParams(temperature=0.5, top_k=3, top_p=0.25))
    check_tensor("greedy", args.greedy, [False], torch.bool, (1,))
    check_tensor("temperature", args.temperature, [0.5], torch.float32, (1, 1))
    check_tensor("top_k", args.top_k, [3], torch.int64, (1, 1))
    check_tensor("top_p", args.top_p, [0.25], torch.float32, (1, 1))


def test_the_reference_sampler_runs_on_these_tensors():
    args = run(
        SamplingParams(), SamplingParams(temperature=0.9), SamplingParams(top_p=0.5), vocab=16
    )
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    tokens = Sampler(CPU, 16, seed=0).sample(logits, args)
    assert (
        tokens[0].item() == logits[0].argmax().item()
        and tokens[2].item() == logits[2].argmax().item()
    ), f"rows 0 and 2 are greedy: expected their argmax, got {tokens.tolist()}"


def test_only_random_requests_in_the_real_engine(llm, monkeypatch):
    params = [
        SamplingParams(max_tokens=3, ignore_eos=True, temperature=1.2, top_k=-1, top_p=0.95)
    ] * 4
    with monkeypatch.context() as m:
        m.setattr(Sampler, "prepare", prepare)
        got = llm.generate(PROMPTS, params)
    assert all(len(out["token_ids"]) == 3 for out in got), f"expected 3 tokens each, got {got}"
