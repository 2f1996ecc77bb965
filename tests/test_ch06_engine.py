"""Chapter 6 tests: the sampler, the engine's admission checks and KV sizing, and the stage 1
milestone: a hand-assembled batch through the Engine generates exactly what transformers does.

References are computed at test time: `argmax` for greedy rows; for random rows, the
distribution transformers' own logits warpers (temperature, then top-k, then top-p) define,
against which we compare the frequencies of many seeded draws; and `model.generate` for
end-to-end greedy parity (on SmolLM2, its tokens as committed in tests/transformers_greedy.json).
Two more tests break the model on purpose (a wrong RoPE base, Qwen3 without its q/k norm) to
show that the parity check notices.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
from conftest import TINY_MODELS, assert_same_trace, hf_greedy, load_tokenizer
from course.differential import Tolerance, assert_same_call, call_differences, reference_of
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, Sampler
from minisgl.engine.sample import BatchSamplingArgs
from minisgl.layers import AttentionLayer
from minisgl.models import ModelConfig
from minisgl.scheduler.table import TableManager
from minisgl.utils import InvalidRequestError, RequestTooLongError
from stage1_milestone import generate_hand_batched

CPU = torch.device("cpu")
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
NEW_TOKENS = 32
GREEDY_LONG = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
DRAWS = 20_000  # rows per distribution test: a frequency's standard error is <= 0.0036
FREQ_TOL = 0.025  # about 7 standard errors: a correct sampler never trips it


# --- the sampler -----------------------------------------------------------------------------


def rows_of(params: list[SamplingParams]) -> list[Req]:
    """One request per row of the logits, each with its own sampling parameters."""
    return [
        Req(
            torch.tensor([1], dtype=torch.int32),
            table_idx=0,
            cached_len=0,
            output_len=1,
            uid=i,
            sampling_params=p,
        )
        for i, p in enumerate(params)
    ]


def sample(sampler: Sampler, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    return sampler.sample(logits, sampler.prepare(Batch(rows_of(params), "decode")))


def hf_distribution(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The next-token distribution transformers samples from with these parameters."""
    scores = TemperatureLogitsWarper(p.temperature)(None, logits[None].clone())
    if p.top_k != -1:
        scores = TopKLogitsWarper(p.top_k)(None, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(p.top_p)(None, scores)
    return scores.softmax(dim=-1)[0]


def random_logits(rows: int, vocab: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_rows_return_the_argmax_of_their_logits():
    logits = random_logits(64, 1000, seed=0)
    tokens = sample(Sampler(CPU, 1000, seed=0), logits, [SamplingParams()] * 64)
    assert tokens.shape == (64,) and not tokens.is_floating_point()
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.3, top_k=1), SamplingParams(temperature=1.0, top_p=1e-6)],
    ids=["top_k=1", "top_p=1e-6"],
)
def test_a_one_token_limit_makes_sampling_greedy_whatever_the_temperature(params):
    logits = random_logits(256, 64, seed=1)  # flat enough that a real draw would stray
    tokens = sample(Sampler(CPU, 64, seed=0), logits, [params] * 256)
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()


def test_same_seed_draws_the_same_tokens_and_another_seed_does_not():
    logits = random_logits(256, 64, seed=2)
    params = [SamplingParams(temperature=1.0)] * 256

    def two_steps(seed: int) -> list[list[int]]:
        sampler = Sampler(CPU, 64, seed)
        return [sample(sampler, logits, params).tolist() for _ in range(2)]

    first = two_steps(7)
    assert first == two_steps(7)
    assert first[0] != first[1], "the generator must advance from one step to the next"
    assert first != two_steps(8)


def test_a_request_with_its_own_seed_draws_the_same_tokens_whatever_else_is_in_the_batch():
    """A seeded request samples from a generator of its own, seeded from its seed and the
    position it samples: its tokens do not depend on its row, its neighbours or the engine's
    generator, and still change from one position to the next."""
    vocab = 64
    logits = random_logits(1, vocab, seed=5)[0]
    seeded, other = SamplingParams(temperature=1.0, seed=11), SamplingParams(temperature=1.0)

    def seeded_token(
        position: int, row: int, batch_size: int, engine_seed: int, seed: int = 11
    ) -> int:
        params = [other] * batch_size
        params[row] = dataclasses.replace(seeded, seed=seed)
        reqs = [
            Req(
                torch.arange(1, position + 1, dtype=torch.int32),
                table_idx=0,
                cached_len=0,
                output_len=1,
                uid=i,
                sampling_params=p,
            )
            for i, p in enumerate(params)
        ]
        sampler = Sampler(CPU, vocab, engine_seed)
        args = sampler.prepare(Batch(reqs, "decode"))
        return sampler.sample(logits.expand(batch_size, vocab).contiguous(), args)[row].item()

    tokens = [seeded_token(position, 0, 1, engine_seed=0) for position in range(1, 21)]
    for position, token in zip(range(1, 21), tokens):
        assert seeded_token(position, 2, 5, engine_seed=3) == token, (
            f"position {position}: another row, batch and engine seed changed the seeded draw"
        )
    assert len(set(tokens)) > 1, "the seeded draws must differ from one position to the next"
    assert tokens != [seeded_token(p, 0, 1, engine_seed=0, seed=12) for p in range(1, 21)], (
        "another seed must draw other tokens"
    )


def test_tied_probabilities_rank_by_token_id_under_top_k_and_top_p():
    """Ten tokens share the top probability: top-k 3 keeps the three of lowest id, and top-p
    0.35 the four ranked before 0.35 of the mass (0.1 each), also the lowest ids; so a row's
    draws depend on its values, not on how a sort happened to order equal ones."""
    vocab = 64
    logits = torch.full((1, vocab), -30.0)
    tied = torch.tensor([40, 3, 57, 12, 9, 31, 60, 22, 5, 48])
    logits[0, tied] = 2.0
    lowest = sorted(tied.tolist())
    for params, kept in [
        (SamplingParams(temperature=1.0, top_k=3), lowest[:3]),
        (SamplingParams(temperature=1.0, top_p=0.35), lowest[:4]),
    ]:
        tokens = draw(logits[0], params, rows=2000)
        assert set(tokens.tolist()) == set(kept), params


def draw(logits: torch.Tensor, params: SamplingParams, rows: int = DRAWS) -> torch.Tensor:
    """`rows` independent draws from one row of logits, in a single seeded call."""
    vocab = logits.shape[-1]
    return sample(
        Sampler(CPU, vocab, seed=0), logits.expand(rows, vocab).contiguous(), [params] * rows
    )


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=1.0, top_k=4),
        SamplingParams(temperature=0.7, top_k=2),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=0.7, top_p=0.6),
    ],
    ids=lambda p: f"T={p.temperature},k={p.top_k},p={p.top_p}",
)
def test_sampled_frequencies_follow_the_transformers_warped_distribution(params):
    vocab = 12
    logits = random_logits(1, vocab, seed=3, scale=1.5)[0]
    expected = hf_distribution(logits, params)
    tokens = draw(logits, params)
    freq = torch.bincount(tokens, minlength=vocab).double() / DRAWS
    allowed = set(expected.nonzero().flatten().tolist())
    assert set(tokens.unique().tolist()) <= allowed, "sampled a token outside top-k / top-p"
    torch.testing.assert_close(freq, expected.double(), atol=FREQ_TOL, rtol=0)


@pytest.mark.parametrize("top_k, top_p", [(5, 0.8), (3, 0.9), (6, 0.4)])
def test_top_k_and_top_p_together_sample_within_both_limits(top_k, top_p):
    """Engines disagree on whether top-p measures mass before or after top-k renormalizes
    (transformers and vLLM: after; SGLang's torch sampler: before), so we check only what both
    guarantee: every token transformers may sample shows up, and nothing outside the top-k
    or outside the top-p nucleus of the whole (temperature-scaled) distribution ever does."""
    vocab, temperature = 12, 1.5
    logits = random_logits(1, vocab, seed=3, scale=1.5)[0]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = (logits / temperature).softmax(dim=-1)
    sorted_probs, order = probs.sort(descending=True)
    in_nucleus = (sorted_probs.cumsum(0) - sorted_probs) < top_p  # mass ranked before < top_p
    widest = set(order[:top_k][in_nucleus[:top_k]].tolist())
    narrowest = set(hf_distribution(logits, params).nonzero().flatten().tolist())
    sampled = set(draw(logits, params, rows=4000).tolist())
    assert narrowest <= sampled <= widest


def test_top_k_samples_only_and_all_of_the_k_most_likely_tokens():
    vocab, k = 500, 6
    logits = random_logits(1, vocab, seed=4)[0]
    logits[logits.topk(k).indices] += 3.0  # six clear favourites, scattered over the vocabulary
    tokens = draw(logits, SamplingParams(temperature=1.0, top_k=k), rows=4000)
    assert set(tokens.tolist()) == set(logits.topk(k).indices.tolist())


def test_top_p_samples_only_from_the_smallest_set_holding_top_p_of_the_mass():
    vocab = 300
    gen = torch.Generator().manual_seed(5)
    probs = torch.full((vocab,), 0.01 / (vocab - 5))
    favourites = torch.randperm(vocab, generator=gen)[:5]
    probs[favourites] = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.07])
    # cumulative mass 0.40, 0.65, 0.80, ...: a nucleus of 0.7 is exactly the first three
    tokens = draw(probs.log(), SamplingParams(temperature=1.0, top_p=0.7), rows=4000)
    assert set(tokens.tolist()) == set(favourites[:3].tolist())


def test_greedy_and_sampled_rows_mix_in_one_batch():
    pattern = [
        SamplingParams(),  # greedy
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_k=1),  # greedy in effect
        SamplingParams(temperature=1.5, top_p=0.9),
    ]
    repeats, vocab = 500, 64
    logits = random_logits(len(pattern) * repeats, vocab, seed=6)
    tokens = sample(Sampler(CPU, vocab, seed=0), logits, pattern * repeats)
    argmax = logits.argmax(dim=-1)
    greedy_rows = torch.tensor([p.is_greedy for p in pattern] * repeats)
    assert torch.equal(tokens[greedy_rows], argmax[greedy_rows])
    sampled = tokens[~greedy_rows] != argmax[~greedy_rows]
    assert sampled.float().mean() > 0.5, "sampled rows must not all fall back to argmax"


# --- the engine: admission checks and KV sizing ----------------------------------------------


def tiny_engine(**overrides) -> Engine:
    config = dict(max_running_req=4, device="cpu", show_progress=False) | overrides
    return Engine(EngineConfig(str(TINY_MODELS["qwen2"]), **config))


def test_request_longer_than_max_seq_len_is_refused_with_a_clear_error():
    engine = tiny_engine(max_seq_len=100, num_pages=1000)
    engine.check_request_fits(90, 10)  # exactly max_seq_len tokens: fits
    engine.check_request_fits(1, 99)
    for prompt_len, max_tokens in [(90, 11), (123, 1)]:
        with pytest.raises(RequestTooLongError) as error:
            engine.check_request_fits(prompt_len, max_tokens)
        message = str(error.value)
        assert str(prompt_len) in message, "the message must name the prompt length"
        assert "100" in message, "the message must name the limit (max_seq_len)"


def test_request_needing_more_pages_than_the_pool_is_refused_with_a_clear_error():
    engine = tiny_engine(max_seq_len=1000, page_size=4, num_pages=13)  # 52 slots
    engine.check_request_fits(20, 10)  # 30 tokens: 8 pages, with room to spare
    with pytest.raises(RequestTooLongError) as error:
        engine.check_request_fits(37, 16)  # 53 tokens: 14 pages, more than the whole pool
    message = str(error.value)
    assert "37" in message, "the message must name the prompt length"
    assert "13" in message or "52" in message, "the message must name the pool's size"


def test_empty_prompt_is_refused():
    engine = tiny_engine(num_pages=64)
    with pytest.raises(InvalidRequestError):
        engine.check_request_fits(0, 8)
    engine.check_request_fits(1, 8)


@pytest.mark.parametrize("gib, page_size", [(0.001, 1), (0.003, 4), (0.002, 16)])
def test_kv_pool_takes_as_many_pages_as_fit_in_kv_cache_gib(gib, page_size):
    engine = tiny_engine(kv_cache_gib=gib, page_size=page_size)
    cfg = ModelConfig.from_dir(TINY_MODELS["qwen2"])
    bytes_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # K+V, float32
    budget, page_bytes = gib * 2**30, bytes_per_token * page_size
    assert engine.num_pages * page_bytes <= budget < (engine.num_pages + 1) * page_bytes
    assert engine.kv_cache.num_slots == engine.num_pages * page_size
    pool_bytes = sum(
        engine.kv_cache.k_cache(i).nbytes + engine.kv_cache.v_cache(i).nbytes
        for i in range(cfg.num_layers)
    )
    assert pool_bytes <= budget


# --- the engine: greedy parity with transformers ---------------------------------------------

_HF_CACHE: dict[tuple[Path, tuple[int, ...]], list[int]] = {}


def prompt_ids(model_dir: Path) -> list[list[int]]:
    tokenizer = load_tokenizer(model_dir)
    return [tokenizer.encode(p) for p in PROMPTS]


def transformers_greedy(model_dir: Path) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, computed once per session."""
    outs = []
    for ids in prompt_ids(model_dir):
        key = (model_dir, tuple(ids))
        if key not in _HF_CACHE:
            _HF_CACHE[key] = hf_greedy(model_dir, ids, NEW_TOKENS)
        outs.append(_HF_CACHE[key])
    return outs


def build_engine(model_dir: Path, **overrides) -> Engine:
    config = dict(max_running_req=4, num_pages=512, device="cpu", show_progress=False) | overrides
    return Engine(EngineConfig(str(model_dir), **config))


@pytest.fixture(scope="module")
def engines():
    """engines(dir) -> one Engine per model directory, built once per module."""
    cache: dict[Path, Engine] = {}

    def get(model_dir: Path) -> Engine:
        if model_dir not in cache:
            cache[model_dir] = build_engine(model_dir)
        return cache[model_dir]

    return get


def test_hand_batched_greedy_matches_transformers_on_tiny_checkpoint(tiny_model_dir, engines):
    ids = prompt_ids(tiny_model_dir)
    assert len({len(i) for i in ids}) == len(ids), "prompts of different lengths"
    ours, _ = generate_hand_batched(engines(tiny_model_dir), ids, GREEDY_LONG)
    assert ours == transformers_greedy(tiny_model_dir)


@pytest.mark.slow  # ~3 s on 2 idle CPU cores: 32 steps of a 135M model (transformers' committed)
def test_hand_batched_greedy_matches_transformers_on_smollm2(smollm2_dir, engines):
    ours, _ = generate_hand_batched(engines(smollm2_dir), prompt_ids(smollm2_dir), GREEDY_LONG)
    expected = transformers_greedy(smollm2_dir)
    assert ours == expected
    assert load_tokenizer(smollm2_dir).decode(ours[0]).startswith(" Paris")


def test_prefill_on_top_of_a_cached_prefix_continues_like_transformers(engines):
    """Prefill the first half of a prompt, then the rest as a second forward whose cached_len
    points at the first half's K/V: the next token is transformers' first greedy token."""
    model_dir = TINY_MODELS["qwen3"]
    engine = engines(model_dir)
    ids = prompt_ids(model_dir)[2]
    table = TableManager(engine.config.max_running_req, engine.page_table)
    row = table.allocate()
    slots = torch.randperm(
        engine.kv_cache.num_slots,  # scattered
        generator=torch.Generator().manual_seed(0),
    )[: len(ids) + 1]
    engine.page_table[row, : len(slots)] = slots.to(torch.int32)
    half = len(ids) // 2
    for cached_len, known in [(0, ids[:half]), (half, ids)]:
        req = Req(
            torch.tensor(known, dtype=torch.int32),
            row,
            cached_len=cached_len,
            output_len=1,
            uid=0,
            sampling_params=SamplingParams(),
        )
        table.write_prompt(req)
        batch = Batch([req], "prefill")
        table.prepare_inputs(batch)
        engine.prepare_batch(batch)
        token = engine.forward_batch(batch, engine.sampler.prepare(batch)).next_tokens_cpu
    assert token.tolist() == transformers_greedy(model_dir)[2][:1]


def test_seeded_sampling_through_the_engine_is_reproducible():
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, ignore_eos=True)
    ids = prompt_ids(TINY_MODELS["llama"])

    def run(seed: int) -> list[list[int]]:
        return generate_hand_batched(build_engine(TINY_MODELS["llama"], seed=seed), ids, params)[0]

    first = run(1)
    assert first == run(1)
    assert first != run(2)
    greedy = [out[: params.max_tokens] for out in transformers_greedy(TINY_MODELS["llama"])]
    assert first != greedy, "temperature 1 is not greedy"


# --- the parity check is sensitive -----------------------------------------------------------

WRONG_ROPE_THETA = 10_000.0  # the classic default: what you get by ignoring config.json's value


def test_parity_fails_when_the_rope_base_is_wrong(tiny_model_dir, monkeypatch):
    real_from_dir = ModelConfig.from_dir
    assert real_from_dir(tiny_model_dir).rope_theta != WRONG_ROPE_THETA

    def wrong_rope(model_dir: str | Path) -> ModelConfig:
        return dataclasses.replace(real_from_dir(model_dir), rope_theta=WRONG_ROPE_THETA)

    monkeypatch.setattr(ModelConfig, "from_dir", staticmethod(wrong_rope))
    engine = build_engine(tiny_model_dir)
    assert engine.model_config.rope_theta == WRONG_ROPE_THETA
    ours, _ = generate_hand_batched(engine, prompt_ids(tiny_model_dir), GREEDY_LONG)
    assert ours != transformers_greedy(tiny_model_dir)


def test_parity_fails_when_qwen3_runs_without_its_qk_norm():
    model_dir = TINY_MODELS["qwen3"]
    engine = build_engine(model_dir)
    layers = [m for m in engine.model.modules() if isinstance(m, AttentionLayer)]
    assert layers and all(layer.q_norm is not None for layer in layers)
    for layer in layers:
        layer.q_norm = layer.k_norm = None
    ours, _ = generate_hand_batched(engine, prompt_ids(model_dir), GREEDY_LONG)
    assert ours != transformers_greedy(model_dir)


def test_request_that_fits_the_pool_only_without_its_page_of_slack_is_refused():
    """The worst case the scheduler reserves is prompt + max_tokens + one page of slack: a
    request that fits the pool only without that page could never be admitted."""
    page_size, num_pages, max_tokens = 4, 13, 8
    engine = tiny_engine(max_seq_len=1000, page_size=page_size, num_pages=num_pages)
    capacity = page_size * num_pages
    engine.check_request_fits(capacity - page_size - max_tokens, max_tokens)  # exactly fills it
    for needed in range(capacity - page_size + 1, capacity + 1):
        with pytest.raises(RequestTooLongError):
            engine.check_request_fits(needed - max_tokens, max_tokens)


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code). Where the contract fixes one answer (greedy
# tokens, admission, page counts, the sampling tensors) it must be the reference's exactly.
# A random draw is not fixed, only its distribution: random rows are compared by what they
# draw over many rows (the same tokens possible, frequencies within sampling noise).


def raised(function: Callable[..., Any], empty_prompt: bool) -> Callable[..., Any]:
    """`function`, answering what it raised (or "nothing"): the contract fixes the error's type,
    not its wording. Which of its two errors an empty prompt that is also too long gets is
    left open: both are InvalidRequestErrors."""

    @functools.wraps(function)
    def call(*args: Any) -> str:
        try:
            function(*args)
        except Exception as error:  # noqa: BLE001 - compared with the reference's
            if empty_prompt and isinstance(error, InvalidRequestError):
                return "InvalidRequestError"
            return type(error).__name__
        return "nothing"

    return call


def bare_engine(**fields: Any) -> Engine:
    """An Engine with only the fields a stub reads: no model is loaded."""
    engine = object.__new__(Engine)
    engine.__dict__.update(fields)
    return engine


@given(
    page_size=st.sampled_from([1, 2, 4, 16]),
    num_pages=st.integers(1, 40),
    max_seq_len=st.integers(1, 300),
    limit=st.sampled_from(["max_seq_len", "pool", "anywhere"]),
    offset=st.integers(-2, 2),
    anywhere=st.integers(1, 400),
    prompt_len=st.integers(0, 400),
)
@settings(max_examples=50)
def test_check_request_fits_matches_the_reference(
    page_size, num_pages, max_seq_len, limit, offset, anywhere, prompt_len
):
    """Requests of prompt + max_tokens at, one short of and one past each limit (max_seq_len;
    the pool less its page of slack), or anywhere, empty prompts included: refused with the
    reference's error type, or accepted, exactly when the reference's are."""
    capacity = num_pages * page_size
    needed = {"max_seq_len": max_seq_len, "pool": capacity - page_size, "anywhere": anywhere}
    total = max(1, needed[limit] + offset)  # prompt + max_tokens, at least one output token
    prompt_len %= total
    args = (bare_engine(max_seq_len=max_seq_len, num_pages=num_pages, page_size=page_size),)
    args += (prompt_len, total - prompt_len)
    stub = Engine.check_request_fits
    found = call_differences(
        raised(stub, prompt_len == 0),
        *args,
        reference=raised(reference_of(stub), prompt_len == 0),
    )
    assert not found, f"Engine.check_request_fits{args[1:]} on {args[0].__dict__}: {found}"


@given(
    layers=st.integers(1, 4),
    kv_heads=st.integers(1, 4),
    head_dim=st.sampled_from([8, 64, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    page_size=st.sampled_from([1, 4, 16]),
    device=st.sampled_from(["cpu", "cuda"]),
    pages=st.integers(0, 5000),  # 0: a budget under one page
    short_by=st.sampled_from([0, 1, None]),  # bytes short of `pages` exactly, or anywhere
    fraction=st.sampled_from([1.0, 0.85, 0.5, 0.3333]),
)
@settings(max_examples=50)
def test_pages_that_fit_matches_the_reference(
    layers, kv_heads, head_dim, dtype, page_size, device, pages, short_by, fraction
):
    """Budgets of exactly a whole number of pages, one byte short of one, and in between, on
    the CPU (kv_cache_gib) and on a GPU (its free memory, as torch.cuda.mem_get_info reports
    it, times gpu_memory_fraction), for any page size and per-token size, and budgets under
    one page (the pool keeps one)."""
    page_bytes = 2 * layers * kv_heads * head_dim * dtype.itemsize * page_size
    if pages == 0:
        budget = page_bytes // 2
    elif short_by is None:
        budget = pages * page_bytes + page_bytes // 3
    else:
        budget = max(page_bytes, pages * page_bytes - short_by)
    free_bytes = math.ceil(budget / fraction)
    config = EngineConfig("unused", kv_cache_gib=budget / 2**30, gpu_memory_fraction=fraction)

    def build() -> tuple:
        model_config = SimpleNamespace(num_layers=layers, head_dim=head_dim)
        engine = bare_engine(
            config=config,
            device=torch.device(device),
            dtype=dtype,
            page_size=page_size,
            model_config=model_config,
            num_heads=kv_heads,
            num_kv_heads=kv_heads,
        )
        return (engine,)

    with mock.patch.object(torch.cuda, "mem_get_info", lambda *_: (free_bytes, 2 * free_bytes)):
        assert_same_call(Engine._pages_that_fit, build=build)


VOCAB = st.integers(2, 64)


def sampling_params(vocab: int) -> st.SearchStrategy[SamplingParams]:
    """Greedy (temperature 0, or top_k 1) and random parameters, with and without limits and
    seeds: top_k off, inside the vocabulary, at it and past it; top_p tiny to 1."""
    return st.builds(
        SamplingParams,
        temperature=st.sampled_from([0.0, 0.3, 1.0, 1.7]),
        top_k=st.sampled_from([-1, 1, 2, vocab, vocab + 5]),
        top_p=st.sampled_from([1.0, 0.9, 0.5, 1e-6]),
        max_tokens=st.just(8),
        seed=st.one_of(st.none(), st.integers(0, 2**40)),
    )


def sampling_args_seen(args, sampler: Sampler, batch: Batch) -> dict:  # noqa: ANN001
    """The tensors as sample reads them, exactly (dtypes and shapes too), but where the
    contract leaves a choice: a top_k past the vocabulary may be clamped to it, the order of
    row_seeds' entries is free, and a greedy row's top_k and top_p, never used, need only be
    valid (its temperature is 1.0, as BatchSamplingArgs says)."""
    random = ~args.greedy
    top_k = args.top_k.clamp(max=sampler.vocab_size)
    return {
        "all_greedy": args.all_greedy,
        "greedy": args.greedy,
        "temperature": args.temperature,
        "top_k of the random rows": top_k[random],
        "top_p of the random rows": args.top_p[random],
        "top_k and top_p shapes and dtypes": [
            (tuple(t.shape), t.dtype) for t in (args.top_k, args.top_p)
        ],
        "greedy rows' top_k >= 1 and top_p in (0, 1]": bool(
            (args.top_k[args.greedy] >= 1).all()
            and ((args.top_p[args.greedy] > 0) & (args.top_p[args.greedy] <= 1)).all()
        ),
        "row_seeds": dict(sorted(args.row_seeds.items())),
        "batch": batch,
    }


@given(data=st.data(), vocab=VOCAB, size=st.integers(1, 6))
@settings(max_examples=40)
def test_sampler_prepare_matches_the_reference(data, vocab, size):
    """Batches of one to six requests, each with its own parameters and position (a seeded
    request's seed of this step depends on it)."""
    params = data.draw(st.lists(sampling_params(vocab), min_size=size, max_size=size))
    lengths = data.draw(st.lists(st.integers(1, 30), min_size=size, max_size=size))

    def build() -> tuple:
        reqs = [
            Req(torch.arange(n, dtype=torch.int32), 0, n - 1, 8, uid, p)
            for uid, (n, p) in enumerate(zip(lengths, params))
        ]
        return Sampler(CPU, vocab, seed=0), Batch(reqs, "decode")

    assert_same_call(Sampler.prepare, build=build, observe=sampling_args_seen)


def sampling_args(rows: list[tuple[bool, float, int, float, int | None]]) -> BatchSamplingArgs:
    """Arguments as prepare makes them, row by row: (greedy, temperature, top_k, top_p, seed
    of this step or None)."""
    greedy, temperature, top_k, top_p, seeds = zip(*rows)
    return BatchSamplingArgs(
        all_greedy=all(greedy),
        greedy=torch.tensor(greedy),
        temperature=torch.tensor(temperature, dtype=torch.float32).view(-1, 1),
        top_k=torch.tensor(top_k, dtype=torch.int64).view(-1, 1),
        top_p=torch.tensor(top_p, dtype=torch.float32).view(-1, 1),
        row_seeds={row: seed for row, seed in enumerate(seeds) if seed is not None},
    )


DETERMINED_ROWS = st.lists(  # rows whose token the contract fixes: (kind, temperature, seed)
    st.tuples(
        st.sampled_from(
            ["greedy", "top_k 1", "top_p tiny", "one likely token", "top_p after top_k"]
        ),
        st.sampled_from([0.3, 1.0, 1.7]),
        st.one_of(st.none(), st.integers(0, 2**40)),
    ),
    min_size=1,
    max_size=6,
)


@given(
    rows=DETERMINED_ROWS,
    vocab=VOCAB,
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 999),
)
@settings(max_examples=25)
def test_sample_matches_the_reference_where_the_token_is_determined(rows, vocab, dtype, seed):
    """Greedy rows, and random rows that can draw only one token (top_k 1, a tiny top_p, all
    the mass on one token, or top_k 2 with a top_p that the top token's share of what top-k
    kept passes, though its share of the whole does not), in batches that are all greedy or
    mixed, with logits in float32, bfloat16 or float16: the very tokens of the reference,
    int64 on the logits' device."""
    logits = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(seed))
    logits = logits.to(dtype)
    top2 = logits.float().topk(2, dim=-1).values
    assume(bool((top2[:, 0] > top2[:, 1]).all()))  # no tie for the top: the argmax is one token
    args = []
    for i, (kind, temperature, row_seed) in enumerate(rows):
        if kind == "greedy":
            args.append((True, 1.0, vocab, 1.0, None))
            continue
        if kind == "one likely token":
            logits[i] = logits[i].float().clamp(max=0).to(dtype)
            logits[i, int(logits[i].float().argmax())] = 1000.0  # the rest: exp(-500) is 0
        top_k = 1 if kind == "top_k 1" else vocab
        top_p = 1e-6 if kind == "top_p tiny" else 1.0
        if kind == "top_p after top_k" and vocab >= 3:
            # probabilities 0.4, 0.3 and the rest 0.3 spread: top_k 2 keeps 0.4 and 0.3, of
            # which the top token holds 0.57 > top_p, so top-p keeps it alone (0.4 < top_p)
            order = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed + i))
            probs = torch.full((vocab,), 0.3 / (vocab - 2))
            probs[order[0]], probs[order[1]] = 0.4, 0.3
            logits[i] = (probs.log() * temperature).to(dtype)
            top_k, top_p = 2, 0.5
        args.append((False, temperature, top_k, top_p, row_seed))
    assert_same_call(
        Sampler.sample,
        build=lambda: (Sampler(CPU, vocab, seed), logits.clone(), sampling_args(args)),
        observe=lambda tokens, *_: {"tokens": tokens},
    )


DRAWN_ROWS = 5_000  # draws of each random row: a frequency's noise is below 0.0071
SEEDED_ROWS = 200  # of which draw with a seed of their own
# Two samplers' frequencies differ by noise of at most 0.01 (one standard error): 5 of them.
FREQUENCY_TOLERANCE = Tolerance(atol=0.05)


def near_a_top_p_boundary(probs: list[float], top_k: int, top_p: float) -> bool:
    """Whether the mass before some token is within rounding of top_p (either way of
    measuring): a correct sampler may keep or drop that token."""
    order = sorted(range(len(probs)), key=lambda t: (-probs[t], t))
    for ranked in (order[:top_k], order):
        mass, before = sum(probs[t] for t in ranked), 0.0
        for t in ranked:
            if abs(before / mass - top_p) < 0.01:
                return True
            before += probs[t]
    return False


RANDOM_ROW = st.tuples(  # (weights of the tokens, temperature, top_k or None, top_p)
    st.lists(st.integers(1, 6), min_size=2, max_size=8),
    st.sampled_from([0.5, 1.0, 1.7]),
    st.one_of(st.none(), st.integers(1, 8)),
    st.sampled_from([1.0, 0.95, 0.8, 0.6, 0.4, 0.2]),
)


@given(rows=st.lists(RANDOM_ROW, min_size=1, max_size=2), seed=st.integers(0, 999))
@settings(max_examples=10)
def test_sample_draws_what_the_reference_draws_over_many_rows(rows, seed):
    """Random rows of every temperature, top_k and top_p: each is repeated DRAWN_ROWS times
    (some with a seed of their own), and what your sampler draws must be what the reference's
    draws: the same set of tokens, and each token's frequency within sampling noise. Tokens
    get probabilities of at least 2% and top_p stays clear of every boundary, so no token is
    too rare to be seen or kept by the accident of rounding. Top-p is measured on what top-k
    kept (the contract's order), including where measuring it before top-k would keep other
    tokens."""
    vocab = max(len(weights) for weights, *_ in rows)
    logits, args = [], []
    for weights, temperature, top_k, top_p in rows:
        weights = weights + [1] * (vocab - len(weights))
        probs = [w / sum(weights) for w in weights]
        top_k = min(top_k or vocab, vocab)
        assume(not near_a_top_p_boundary(probs, top_k, top_p))
        # softmax(logits / temperature) is `probs` again, whatever the temperature
        logits.append(torch.tensor(probs).log() * temperature + 3.0)
        for draw in range(DRAWN_ROWS):
            own = seed * DRAWN_ROWS + draw if draw < SEEDED_ROWS else None
            args.append((False, temperature, top_k, top_p, own))
    logits = torch.stack(logits).repeat_interleave(DRAWN_ROWS, dim=0)

    def frequencies(tokens: torch.Tensor, *_: Any) -> dict:
        per_row = tokens.view(len(rows), DRAWN_ROWS)
        counts = [torch.bincount(drawn, minlength=vocab) for drawn in per_row]
        return {
            "dtype": tokens.dtype,
            "tokens drawn, row by row": [sorted(drawn.unique().tolist()) for drawn in per_row],
            "frequencies, row by row": [c.double() / DRAWN_ROWS for c in counts],
        }

    assert_same_call(
        Sampler.sample,
        build=lambda: (Sampler(CPU, vocab, seed), logits.clone(), sampling_args(args)),
        observe=frequencies,
        tolerance=FREQUENCY_TOLERANCE,
    )


@given(
    seeded=st.lists(st.integers(0, 2**40), min_size=1, max_size=4),
    unseeded=st.integers(0, 3),
    seed=st.integers(0, 999),
)
@settings(max_examples=6)
def test_a_seeded_row_draws_alike_whatever_the_engine_generator_and_the_other_rows(
    seeded, unseeded, seed
):
    """What a seeded row draws depends on its seed of this step and its own logits only
    (SamplingParams): the rows of `seeded`, among `unseeded` other random rows, in one order
    from an engine generator of one seed, then in the reverse order beside one more row from
    another, draw the same tokens, as with the reference."""
    vocab = 64  # flat logits over many tokens: a draw from another generator would differ
    gen = torch.Generator().manual_seed(seed)
    row = (False, 1.0, vocab, 1.0)
    logits = torch.randn(len(seeded) + unseeded, vocab, generator=gen)
    neighbour = torch.randn(1, vocab, generator=gen)
    rows = [(*row, s) for s in seeded] + [(*row, None)] * unseeded

    def run() -> list[str]:
        first = Sampler(CPU, vocab, seed).sample(logits, sampling_args(rows))
        again = torch.cat([neighbour, logits.flip(0)])
        second = Sampler(CPU, vocab, seed + 1).sample(
            again, sampling_args([(*row, None), *rows[::-1]])
        )
        second = second[1:].flip(0)  # back in the first order
        return [
            f"seeded row {i}: " + ("the same token" if first[i] == second[i] else "another")
            for i in range(len(seeded))
        ]

    assert_same_trace(6, run, "seeded rows")


@pytest.fixture(scope="module")
def qwen3_engine(engines) -> Engine:  # noqa: ANN001
    return engines(TINY_MODELS["qwen3"])


def tokens_out(output, *_: Any) -> dict:  # noqa: ANN001
    """ForwardOutput's tokens by value (int32 or int64: the contract leaves it open) and
    where they are; its event (None on a CPU)."""
    gpu, cpu, event = output
    return {
        "next_tokens_gpu": (gpu.is_floating_point(), gpu.device, gpu.long()),
        "next_tokens_cpu": (cpu.is_floating_point(), cpu.device, cpu.long()),
        "copy_done_event": event,
    }


@given(
    ledgers=st.lists(st.tuples(st.integers(1, 16), st.integers(0, 15)), min_size=1, max_size=4),
    phase=st.sampled_from(["prefill", "decode"]),
    params=st.lists(
        st.sampled_from(
            [
                SamplingParams(),
                SamplingParams(temperature=1.0),
                SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
                SamplingParams(temperature=1.0, seed=3),
            ]
        ),
        min_size=4,
        max_size=4,
    ),
    seed=st.integers(0, 999),
)
@settings(max_examples=5)
def test_forward_batch_matches_the_reference(qwen3_engine, ledgers, phase, params, seed):
    """One forward of the tiny Qwen3 on batches of fresh prompts, cached prefixes and decodes,
    with greedy, random and seeded rows; the engine's generator is reseeded before each side,
    so both sample the same tokens from the same logits."""
    engine = qwen3_engine
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(engine.kv_cache.num_slots, generator=gen)

    def build() -> tuple:
        reqs, used = [], 0
        for row, ((length, cached), p) in enumerate(zip(ledgers, params)):
            cached = length - 1 if phase == "decode" else min(cached, length - 1)
            ids = torch.randint(0, 1000, (length,), generator=torch.Generator().manual_seed(row))
            reqs.append(Req(ids.int(), row, cached, 4, row, p))
            engine.page_table[row, :length] = slots[used : used + length].int()
            used += length
        batch = Batch(reqs, phase)
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
        batch.input_ids = torch.cat([r.input_ids[r.cached_len :] for r in reqs])
        batch.out_loc = torch.cat(
            [engine.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs]
        )
        engine.prepare_batch(batch)
        args = reference_of(Sampler.prepare)(engine.sampler, batch)
        engine.sampler.generator.manual_seed(seed)
        return engine, batch, args

    assert_same_call(Engine.forward_batch, build=build, observe=tokens_out)
