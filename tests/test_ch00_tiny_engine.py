"""Chapter 0 tests: the tiny engine computes exactly what Hugging Face transformers computes.

Every expected value is computed by transformers (nothing is hand-typed): RMSNorm against its
formula, RoPE and Llama-3 frequency scaling against transformers' rotary code, the forward pass
against transformers' logits, and greedy generation token for token against
`model.generate(do_sample=False)` on each tiny random checkpoint, and on SmolLM2 against the
tokens of that run committed in tests/transformers_greedy.json (conftest.hf_greedy).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from conftest import hf_greedy
from minisgl.tiny_engine import KVCache, TinyConfig, TinyEngine, apply_rope, rms_norm, rope_inv_freq

MODELS = Path(__file__).resolve().parents[1] / "models"
SMOLLM2 = "SmolLM2-135M-Instruct"
TINY = ["tiny-qwen3", "tiny-qwen2", "tiny-llama"]
ALL_MODELS = [SMOLLM2, *TINY]
NEW_TOKENS = 32  # greedy parity length on SmolLM2
TINY_NEW_TOKENS = 48  # the tiny checkpoints are cheap: run longer
# float32 on CPU: our ops and transformers' differ only in summation order.
ATOL, RTOL = 1e-4, 1e-4
LOGITS_ATOL = 1e-3  # logits are O(10) and pass through every layer


def model_dir(name: str) -> Path:
    path = MODELS / name
    assert (path / "config.json").is_file(), (
        f"{path} is missing: run `.venv/bin/python tools/provision.py`"
    )
    return path


@pytest.fixture(scope="module")
def engine():
    """engine(name) -> our TinyEngine, loaded once per module (inside the test, so a broken
    engine is a test failure, not a fixture error)."""
    cache: dict[str, TinyEngine] = {}

    def load(name: str) -> TinyEngine:
        if name not in cache:
            cache[name] = TinyEngine(model_dir(name))
        return cache[name]

    return load


@pytest.fixture(scope="module")
def hf_model():
    """hf_model(name) -> the transformers model of the same directory, loaded once per module."""
    cache: dict[str, torch.nn.Module] = {}

    def load(name: str) -> torch.nn.Module:
        if name not in cache:
            model = AutoModelForCausalLM.from_pretrained(model_dir(name), dtype=torch.float32)
            cache[name] = model.eval()
        return cache[name]

    return load


def hf_generate(model: torch.nn.Module, prompt_ids: list[int], max_new: int, **kwargs) -> list[int]:
    """transformers' greedy decoding: the reference every parity test compares against."""
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, max_new_tokens=max_new, do_sample=False, **kwargs)
    return out[0, len(prompt_ids) :].tolist()


# --- building blocks -------------------------------------------------------------------------


def test_rms_norm_matches_formula():
    torch.manual_seed(0)
    x, weight, eps = torch.randn(3, 5, 64) * 3, torch.randn(64), 1e-6
    expected = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * weight
    torch.testing.assert_close(rms_norm(x, weight, eps), expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_rope_inv_freq_matches_transformers(name):
    hf_inv_freq = LlamaRotaryEmbedding(AutoConfig.from_pretrained(model_dir(name))).inv_freq
    ours = rope_inv_freq(TinyConfig.from_dir(model_dir(name)))
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, hf_inv_freq, atol=0, rtol=1e-6)


def test_llama3_scaled_inv_freq_matches_transformers_rope_init():
    config = TinyConfig.from_dir(model_dir("tiny-llama"))
    hf_config = AutoConfig.from_pretrained(model_dir("tiny-llama"))
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config)
    ours = rope_inv_freq(config)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)
    # The checkpoint is built so all three bands occur: kept, divided by `factor`, interpolated.
    plain = config.rope_theta ** -(torch.arange(0, config.head_dim, 2).float() / config.head_dim)
    ratio = plain / ours
    factor = config.rope_scaling["factor"]
    assert torch.isclose(ratio, torch.tensor(1.0)).any(), "fast frequencies must be kept"
    assert torch.isclose(ratio, torch.tensor(factor)).any(), "slow frequencies: divide by factor"
    assert ((ratio > 1.01) & (ratio < factor - 0.01)).any(), "middle band must be interpolated"


def test_apply_rope_matches_transformers_rotary():
    hf_config = AutoConfig.from_pretrained(model_dir("tiny-llama"))
    rotary = LlamaRotaryEmbedding(hf_config)
    torch.manual_seed(0)
    heads, seq, dim = 4, 7, hf_config.head_dim
    q, k = torch.randn(heads, seq, dim), torch.randn(2, seq, dim)
    positions = torch.arange(100, 100 + seq)  # not starting at 0, like a decode step
    cos, sin = rotary(q, positions[None])
    hf_q, hf_k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
    ours_q = apply_rope(q, positions, rotary.inv_freq)
    ours_k = apply_rope(k, positions, rotary.inv_freq)
    torch.testing.assert_close(ours_q, hf_q[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ours_k, hf_k[0], atol=ATOL, rtol=RTOL)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    dim = 64
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    q, k = torch.randn(1, dim), torch.randn(1, dim)

    def score(m: int, n: int) -> torch.Tensor:
        qm = apply_rope(q, torch.tensor([m]), inv_freq)
        kn = apply_rope(k, torch.tensor([n]), inv_freq)
        return (qm * kn).sum()

    torch.testing.assert_close(score(3, 1), score(40, 38), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(score(1, 3), score(17, 19), atol=ATOL, rtol=RTOL)
    assert not torch.isclose(score(3, 1), score(3, 2)), "rotation must depend on the distance"
    rotated = apply_rope(q, torch.tensor([25]), inv_freq)
    torch.testing.assert_close(rotated.norm(), q.norm(), atol=ATOL, rtol=RTOL)  # a pure rotation


# --- the model forward -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_MODELS)
def test_prefill_logits_match_transformers(name, engine, hf_model):
    eng = engine(name)
    ids = eng.tokenizer.encode("The capital of France is Paris, and the capital of Italy is")
    kv = KVCache(eng.model.config)
    ours = eng.model.forward(torch.tensor(ids), torch.arange(len(ids)), kv)
    with torch.no_grad():
        expected = hf_model(name)(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(ours, expected, atol=LOGITS_ATOL, rtol=RTOL)
    assert len(kv) == len(ids), "prefill must append one K/V entry per prompt token"


@pytest.mark.parametrize("name", TINY)
def test_prefill_in_chunks_and_decode_match_one_prefill(name, engine):
    """A query block attends causally to every cached key plus the new ones, so the KV cache
    makes later steps see exactly what a single full prefill sees."""
    model = engine(name).model
    ids = torch.tensor(engine(name).tokenizer.encode("one two three four five six seven eight"))
    full = model.forward(ids, torch.arange(len(ids)), KVCache(model.config))
    kv = KVCache(model.config)
    model.forward(ids[:3], torch.arange(0, 3), kv)  # first chunk
    model.forward(ids[3:-1], torch.arange(3, len(ids) - 1), kv)  # second chunk on top of the cache
    last = model.forward(ids[-1:], torch.arange(len(ids) - 1, len(ids)), kv)  # one decode step
    torch.testing.assert_close(last, full, atol=LOGITS_ATOL, rtol=RTOL)
    assert len(kv) == len(ids)


# --- greedy generation -----------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_greedy_matches_transformers_on_tiny_checkpoint(name, engine, hf_model):
    eng = engine(name)
    ids = eng.tokenizer.encode("Once upon a time, in a small village,")
    ours = eng.generate_ids(ids, TINY_NEW_TOKENS, ignore_eos=True)
    # Random weights may emit the EOS id at any step: both sides ignore EOS and run full length.
    expected = hf_generate(hf_model(name), ids, TINY_NEW_TOKENS, eos_token_id=None)
    assert len(expected) == TINY_NEW_TOKENS
    assert ours == expected


@pytest.mark.slow  # ~2 s on 2 CPU cores: 32 steps of a 135M model
def test_greedy_matches_transformers_on_smollm2(engine):
    eng = engine(SMOLLM2)
    ids = eng.tokenizer.encode("The capital of France is")
    ours = eng.generate_ids(ids, NEW_TOKENS, ignore_eos=True)
    expected = hf_greedy(model_dir(SMOLLM2), ids, NEW_TOKENS)
    assert len(expected) == NEW_TOKENS
    assert ours == expected


def test_greedy_stops_at_eos_like_transformers(engine, hf_model):
    eng = engine(SMOLLM2)
    chat = [{"role": "user", "content": "What is 2+2?"}]
    ids = eng.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
    ids = ids["input_ids"]
    limit = 64
    ours = eng.generate_ids(ids, limit)
    expected = hf_generate(hf_model(SMOLLM2), ids, limit)  # transformers stops at the config's EOS
    assert ours == expected
    assert len(ours) < limit and ours[-1] in eng.model.config.eos_token_ids, "must stop at EOS"


def test_capital_of_france_is_paris(engine):
    assert engine(SMOLLM2).generate("The capital of France is", 4).startswith(" Paris")


def test_engine_loads_a_model_dir_and_names_a_missing_one(tmp_path):
    # A real directory loads and generates...
    eng = TinyEngine(model_dir("tiny-llama"))
    assert len(eng.generate_ids([1, 2, 3], 2, ignore_eos=True)) == 2
    # ...and a missing one fails at once, naming the path and how to get the models.
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="provision") as err:
        TinyEngine(missing)
    assert str(missing) in str(err.value)


def test_rms_norm_adds_eps_under_the_root_so_tiny_and_zero_vectors_stay_finite():
    """eps goes inside the square root: it caps how far a tiny vector is scaled up, and makes an
    all-zero vector (x = 0) normalize to 0 instead of 0 * inf = NaN."""
    weight, eps = torch.ones(64), 1e-6
    tiny = torch.full((1, 64), 1e-4)  # mean square 1e-8, well below eps
    expected = tiny / torch.sqrt(tiny.pow(2).mean(-1, keepdim=True) + eps)
    torch.testing.assert_close(rms_norm(tiny, weight, eps), expected, atol=ATOL, rtol=RTOL)
    zeros = torch.zeros(2, 64)
    assert torch.equal(rms_norm(zeros, weight, eps), zeros)


def test_generate_returns_the_reply_without_its_special_tokens(engine):
    eng = engine(SMOLLM2)
    chat = [{"role": "user", "content": "What is 2+2?"}]
    prompt = eng.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = eng.generate_ids(eng.tokenizer.encode(prompt), 64)
    assert ids[-1] in eng.model.config.eos_token_ids, "the reply must end at EOS"
    text = eng.generate(prompt, 64)
    assert text == eng.tokenizer.decode(ids, skip_special_tokens=True)
    assert eng.tokenizer.decode(ids[-1:]) not in text, "the EOS token is not part of the text"
