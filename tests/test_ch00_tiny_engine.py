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
from course.differential import Tolerance, assert_same_call
from hypothesis import given, settings
from hypothesis import strategies as st
from minisgl.tiny_engine import (
    KVCache,
    TinyConfig,
    TinyEngine,
    TinyModel,
    apply_rope,
    rms_norm,
    rope_inv_freq,
)

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


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. Floats match within the rounding of another order of
# operations; token ids, lengths and the calls a model receives match exactly.

# torch.testing's defaults for half precision: about one rounding of the result in that dtype.
HALF_TOLERANCE = {torch.bfloat16: Tolerance(1.6e-2, 1e-5), torch.float16: Tolerance(1e-3, 1e-5)}
FLOAT32_TOLERANCE = Tolerance(RTOL, ATOL)
LOGITS_TOLERANCE = Tolerance(RTOL, LOGITS_ATOL)
SEEDS = st.integers(0, 2**16)
HEAD_DIMS = st.integers(1, 64).map(lambda half: 2 * half)  # even, 2 to 128


def random_tensor(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


def tolerance_of(dtype: torch.dtype) -> Tolerance:
    return HALF_TOLERANCE.get(dtype, FLOAT32_TOLERANCE)


def tiny_config(
    head_dim: int = 8,
    num_layers: int = 2,
    num_kv_heads: int = 2,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    eos_token_ids: tuple[int, ...] = (2,),
) -> TinyConfig:
    """A TinyConfig of the given shape; the fields no tested stub reads get plain values."""
    return TinyConfig(
        model_type="llama",
        hidden_size=64,
        num_layers=num_layers,
        num_heads=2 * num_kv_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=False,
        qkv_bias=False,
        qk_norm=False,
        eos_token_ids=eos_token_ids,
    )


@given(
    leading=st.lists(st.integers(0, 4), max_size=2),
    dim=st.integers(1, 96),
    scale=st.sampled_from([1e-4, 1.0, 30.0]),  # 1e-4: mean square far below eps
    eps=st.sampled_from([1e-6, 1e-5, 0.5]),
    zero_rows=st.booleans(),
    seed=SEEDS,
)
@settings(max_examples=40)
def test_rms_norm_matches_the_reference(leading, dim, scale, eps, zero_rows, seed):
    """Any leading shape (empty too), vectors of one element up, tiny and all-zero vectors."""
    x = random_tensor(seed, *leading, dim, scale=scale)
    if zero_rows and x.numel():
        x.view(-1, dim)[::2] = 0.0
    weight = random_tensor(seed + 1, dim)
    assert_same_call(rms_norm, x, weight, eps, tolerance=FLOAT32_TOLERANCE)


LLAMA3_SCALING = st.fixed_dictionaries(
    {
        "factor": st.floats(1.0, 32.0),
        "low_freq_factor": st.floats(0.5, 2.0),
        "high_freq_factor": st.floats(2.5, 8.0),
        "original_max_position_embeddings": st.sampled_from([16, 64, 100, 2048, 8192]),
    }
)


@given(
    head_dim=HEAD_DIMS,
    rope_theta=st.sampled_from([10000.0, 500000.0, 1e6]) | st.floats(100.0, 1e7),
    rope_scaling=st.none() | LLAMA3_SCALING,
)
@settings(max_examples=40)
def test_rope_inv_freq_matches_the_reference(head_dim, rope_theta, rope_scaling):
    """Plain RoPE and Llama-3 scaling over head sizes, bases and scaling parameters whose
    bands fall anywhere (all kept, all divided, or split three ways). A pow computed another
    way rounds differently: relative 1e-5."""
    config = tiny_config(head_dim=head_dim, rope_theta=rope_theta, rope_scaling=rope_scaling)
    assert_same_call(rope_inv_freq, config, tolerance=Tolerance(rtol=1e-5))


@given(
    heads=st.sampled_from([(), (1,), (3,), (2, 2)]),
    seq=st.integers(0, 6),
    head_dim=st.integers(1, 32).map(lambda half: 2 * half),
    start=st.sampled_from([0, 1, 63, 1000]),
    shuffled=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=SEEDS,
)
@settings(max_examples=40)
def test_apply_rope_matches_the_reference(heads, seq, head_dim, start, shuffled, dtype, seed):
    """x [..., seq, head_dim] of any leading shape (none too), empty and single-token
    sequences, positions from 0 or deep into a sequence, in any order, in three dtypes."""
    x = random_tensor(seed, *heads, seq, head_dim).to(dtype)
    positions = torch.arange(start, start + seq)
    if shuffled:
        positions = positions[torch.randperm(seq, generator=torch.Generator().manual_seed(seed))]
    inv_freq = rope_inv_freq_of(head_dim, seed)
    assert_same_call(apply_rope, x, positions, inv_freq, tolerance=tolerance_of(dtype))


def rope_inv_freq_of(head_dim: int, seed: int) -> torch.Tensor:
    """Plain RoPE speeds of a random base: what apply_rope is given (its own values)."""
    base = [10000.0, 500000.0, 1e6][seed % 3]
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


@given(
    num_layers=st.integers(1, 3),
    num_kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([2, 8]),
    cached=st.lists(st.integers(0, 4), min_size=3, max_size=3),
    layer=st.integers(0, 2),
    new=st.integers(0, 4),
    seed=SEEDS,
)
@settings(max_examples=40)
def test_kv_cache_append_matches_the_reference(
    num_layers, num_kv_heads, head_dim, cached, layer, new, seed
):
    """Into an empty layer or on top of earlier tokens, zero or more new tokens, while the
    other layers hold other lengths (a forward fills the layers one after another)."""
    config = tiny_config(head_dim=head_dim, num_layers=num_layers, num_kv_heads=num_kv_heads)
    layer = layer % num_layers

    def build() -> tuple:
        kv = KVCache(config)
        for i in range(num_layers):
            kv.k[i] = random_tensor(seed + i, num_kv_heads, cached[i], head_dim)
            kv.v[i] = random_tensor(seed - i, num_kv_heads, cached[i], head_dim)
        k = random_tensor(seed + 7, num_kv_heads, new, head_dim)
        return kv, layer, k, random_tensor(seed + 8, num_kv_heads, new, head_dim)

    assert_same_call(KVCache.append, build=build)


@pytest.fixture(scope="module")
def tiny_model():
    """tiny_model(name) -> our TinyModel of a tiny checkpoint with uneven norm weights, loaded
    once per module (inside the test: its __init__ calls your rope_inv_freq)."""
    cache: dict[str, TinyModel] = {}

    def load(name: str) -> TinyModel:
        if name not in cache:
            model = TinyModel(model_dir(name))
            # The tiny checkpoints' norm weights are all ones, and a norm of unit weight does
            # not care where (or whether) its weight is applied, nor, on q and k, whether it
            # comes before or after RoPE (a rotation keeps a head's RMS): uneven weights
            # make each norm's place and weight show in the logits.
            gen = torch.Generator().manual_seed(len(name))
            for key, weight in model.w.items():
                if key.endswith("norm.weight"):
                    model.w[key] = 1 + 0.5 * torch.randn(weight.shape, generator=gen)
            cache[name] = model
        return cache[name]

    return load


@given(
    name=st.sampled_from(TINY),
    cached=st.sampled_from([0, 1, 5]),
    new=st.sampled_from([1, 2, 7]),
    seed=SEEDS,
)
@settings(max_examples=8)
def test_model_forward_matches_the_reference(tiny_model, name, cached, new, seed):
    """Llama (with Llama-3 RoPE), Qwen2 (q/k/v bias) and Qwen3 (q/k norm): a prefill from an
    empty cache, a chunk or one decode token on top of cached keys and values (random ones: the
    cache holds whatever earlier steps put there). Compared: the logits, and the cache after."""
    model = tiny_model(name)
    cfg = model.config
    vocab = model.lm_head.shape[0]
    ids = torch.randint(0, vocab, (new,), generator=torch.Generator().manual_seed(seed))

    def build() -> tuple:
        kv = KVCache(cfg)
        for i in range(cfg.num_layers):
            kv.k[i] = random_tensor(seed + i, cfg.num_kv_heads, cached, cfg.head_dim)
            kv.v[i] = random_tensor(seed - i, cfg.num_kv_heads, cached, cfg.head_dim)
        return model, ids.clone(), torch.arange(cached, cached + new), kv

    def observe(logits, model, ids, positions, kv) -> tuple:  # noqa: ANN001 - the model's
        return logits, ids, positions, kv.k, kv.v  # the weights are shared: not compared

    assert_same_call(TinyModel.forward, build=build, observe=observe, tolerance=LOGITS_TOLERANCE)


VOCAB = 50  # the scripted model's vocabulary


class ScriptedModel(TinyModel):
    """A stand-in for the model in generate_ids: its i-th forward returns logits whose argmax is
    `script[i]`, and it records what each forward is given (ids, positions, the cache's length,
    and whether it is the cache of the first forward). It appends zeros to the cache, one entry
    per new token and layer, as the real model does."""

    def __init__(self, config: TinyConfig, script: list[int]) -> None:  # no weights to load
        self.config = config
        self.script = script
        self.calls: list[tuple[list[int], list[int], int, bool]] = []
        self._first_kv: KVCache | None = None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv: KVCache
    ) -> torch.Tensor:
        if self._first_kv is None:  # (an empty cache is falsy: it has a length)
            self._first_kv = kv
        self.calls.append((input_ids.tolist(), positions.tolist(), len(kv), kv is self._first_kv))
        cfg, n = self.config, len(input_ids)
        for layer in range(cfg.num_layers):  # as KVCache.append does, without calling yours
            new = torch.zeros(cfg.num_kv_heads, n, cfg.head_dim)
            kv.k[layer] = torch.cat((kv.k[layer], new), dim=1)
            kv.v[layer] = torch.cat((kv.v[layer], new), dim=1)
        logits = torch.zeros(VOCAB)
        logits[self.script[min(len(self.calls), len(self.script)) - 1]] = 1.0
        return logits


def scripted_engine(script: list[int], eos: tuple[int, ...], tokenizer=None) -> TinyEngine:  # noqa: ANN001
    engine = TinyEngine.__new__(TinyEngine)  # no checkpoint to load: the model is scripted
    engine.model = ScriptedModel(tiny_config(eos_token_ids=eos), script)
    engine.tokenizer = tokenizer
    return engine


SCRIPTS = st.lists(st.sampled_from([2, 7, 11, 12, 13]), min_size=1, max_size=10)
EOS_IDS = st.sampled_from([(2,), (2, 7), ()])


@given(
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
    max_new_tokens=st.integers(1, 9),
    script=SCRIPTS,
    eos=EOS_IDS,
    ignore_eos=st.booleans(),
)
@settings(max_examples=50)
def test_generate_ids_matches_the_reference(prompt, max_new_tokens, script, eos, ignore_eos):
    """Prompts of one token up, max_new_tokens from 1, EOS at any step (or never, or two EOS
    ids), ignored or not. Compared: the tokens, and every forward's ids, positions and cache."""
    assert_same_call(
        TinyEngine.generate_ids,
        build=lambda: (scripted_engine(script, eos), prompt, max_new_tokens, ignore_eos),
    )


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir("tiny-qwen3"))


@given(
    prompt=st.sampled_from(["Hi", "The capital of France is", "<|im_start|>user\nhello", " a"]),
    max_new_tokens=st.integers(1, 6),
    script=st.lists(st.sampled_from([0, 1, 2, 11, 12, 13, 30]), min_size=1, max_size=7),
    eos=EOS_IDS,
)
@settings(max_examples=30)
def test_generate_matches_the_reference(tiny_tokenizer, prompt, max_new_tokens, script, eos):
    """The text of scripted tokens, special ones among them (0, 1, 2), ending at EOS or at
    max_new_tokens; and the ids the prompt was tokenized into (the first forward's)."""

    def observe(text, engine, *_) -> tuple:  # noqa: ANN001, ANN002 - the tokenizer is shared
        return text, engine.model.calls

    assert_same_call(
        TinyEngine.generate,
        build=lambda: (scripted_engine(script, eos, tiny_tokenizer), prompt, max_new_tokens),
        observe=observe,
    )
