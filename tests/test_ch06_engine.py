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
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODELS, hf_greedy, load_tokenizer
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, Sampler
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
