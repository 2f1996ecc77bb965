"""Chapter 2 tests: the decoder's layers (minisgl.layers) against Hugging Face transformers.

Every expected value is computed at test time: by transformers' own Llama modules
(LlamaRMSNorm, LlamaRotaryEmbedding, ROPE_INIT_FUNCTIONS, apply_rotary_pos_emb, rotate_half) or by
the plain torch formula of the layer. RoPE settings come from the provisioned models' config.json.
The attention layer runs inside a real `minisgl.core.Context` with a recording fake backend, so
these tests need nothing from later chapters.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from course.differential import (
    Tolerance,
    assert_same_call,
    differences,
    use_reference_stubs,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

from minisgl.core import Batch, Context
from minisgl.layers import (
    AttentionLayer,
    Linear,
    LMHead,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
    silu_and_mul,
)
from minisgl.layers.rotary import default_inv_freq, llama3_inv_freq, rotate_half

# float32 on CPU: our ops and transformers' differ at most in summation order.
ATOL, RTOL = 1e-5, 1e-5
INV_FREQ_RTOL = 1e-6  # inv_freq is a handful of pow/div ops: must agree to float32 rounding
# Non-contiguous positions, as in a batch of decode steps; 64 and beyond cross tiny-llama's
# original context for Llama-3 scaling, 1000 is far from 0.
POSITIONS = torch.tensor([0, 1, 5, 63, 64, 200, 1000])
MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def filled(module: torch.nn.Module) -> torch.nn.Module:
    """Our layers start uninitialised (they are always loaded): give every parameter values."""
    for param in module.parameters():
        param.data.copy_(torch.randn_like(param) * 0.5 + 1.0)
    return module


def hf_config_of(name: str):
    path = MODELS / name
    assert (path / "config.json").is_file(), (
        f"{path} is missing: run `.venv/bin/python tools/provision.py`"
    )
    return AutoConfig.from_pretrained(path)


def rope_settings(hf_config) -> tuple[float, dict | None]:
    """(rope_theta, our `scaling` argument) from a transformers config's rope_parameters."""
    params = dict(hf_config.rope_parameters)
    theta = params.pop("rope_theta")
    return theta, (None if params.get("rope_type", "default") == "default" else params)


def our_rotary(hf_config) -> RotaryEmbedding:
    theta, scaling = rope_settings(hf_config)
    return RotaryEmbedding(hf_config.head_dim, theta, hf_config.max_position_embeddings, scaling)


def hf_rope(
    hf_config, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' RoPE on our layout: q [tokens, heads, head_dim],
    k [tokens, kv_heads, head_dim]."""
    cos, sin = LlamaRotaryEmbedding(hf_config)(q, positions[None])  # [1, tokens, head_dim]
    hf_q, hf_k = apply_rotary_pos_emb(q[None], k[None], cos, sin, unsqueeze_dim=2)
    return hf_q[0], hf_k[0]


# --- Linear --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_linear_forward_matches_f_linear(bias):
    layer = filled(Linear(16, [24], bias=bias))
    x = torch.randn(3, 5, 16)  # any leading dimensions
    expected = x @ layer.weight.T + (layer.bias if bias else 0)
    out = layer(x)
    assert out.shape == (3, 5, 24)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_load_shard_stacks_q_k_v_into_one_merged_projection():
    hidden, q_size, kv_size = 16, 8, 4
    qkv = Linear(hidden, [q_size, kv_size, kv_size], bias=True)
    assert qkv.weight.shape == (q_size + 2 * kv_size, hidden)
    weights = {
        "q": torch.randn(q_size, hidden),
        "k": torch.randn(kv_size, hidden),
        "v": torch.randn(kv_size, hidden),
    }
    biases = {name: torch.randn(w.shape[0]) for name, w in weights.items()}
    for shard, name in [(2, "v"), (0, "q"), (1, "k")]:  # the checkpoint's order is arbitrary
        qkv.load_shard("weight", shard, weights[name])
        qkv.load_shard("bias", shard, biases[name])
    torch.testing.assert_close(
        qkv.weight.data, torch.cat([weights["q"], weights["k"], weights["v"]]), atol=0, rtol=0
    )
    torch.testing.assert_close(
        qkv.bias.data, torch.cat([biases["q"], biases["k"], biases["v"]]), atol=0, rtol=0
    )
    # One merged matmul computes the three separate projections.
    x = torch.randn(5, hidden)
    q, k, v = qkv(x).split([q_size, kv_size, kv_size], dim=-1)
    for name, out in zip("qkv", (q, k, v)):
        torch.testing.assert_close(
            out, F.linear(x, weights[name], biases[name]), atol=ATOL, rtol=RTOL
        )


def test_load_shard_fills_a_single_shard_linear_whole():
    layer = Linear(8, [6])
    tensor = torch.randn(6, 8)
    layer.load_shard("weight", 0, tensor)
    torch.testing.assert_close(layer.weight.data, tensor, atol=0, rtol=0)


# ValueError, because load_weights (chapter 3) catches it to name the checkpoint tensor.
@pytest.mark.parametrize(
    "shape", [(5, 16), (4, 15), (4,), (1, 16)], ids=["rows", "cols", "rank", "broadcastable"]
)
def test_load_shard_rejects_a_tensor_of_the_wrong_shape(shape):
    qkv = Linear(16, [8, 4, 4])
    with pytest.raises(ValueError):
        qkv.load_shard("weight", 1, torch.randn(*shape))


# --- embedding and LM head -----------------------------------------------------------------------


def test_vocab_embedding_looks_up_one_row_per_token():
    emb = filled(VocabEmbedding(50, 8))
    ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
    out = emb(ids)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, F.embedding(ids, emb.weight), atol=0, rtol=0)
    torch.testing.assert_close(out[1, 0], emb.weight[7], atol=0, rtol=0)


def test_lm_head_projects_hidden_states_to_vocab_logits():
    head = filled(LMHead(50, 8))
    hidden = torch.randn(4, 8)
    logits = head(hidden)
    assert logits.shape == (4, 50)
    torch.testing.assert_close(logits, hidden @ head.weight.T, atol=ATOL, rtol=RTOL)


def test_tied_lm_head_uses_the_embedding_matrix():
    emb = filled(VocabEmbedding(50, 8))
    head = LMHead(50, 8, tied_to=emb)
    hidden = torch.randn(4, 8)
    torch.testing.assert_close(head(hidden), hidden @ emb.weight.T, atol=ATOL, rtol=RTOL)
    # Shared, not copied: loading the embedding later also changes the head.
    emb.weight.data.mul_(-2.0)
    torch.testing.assert_close(head(hidden), hidden @ emb.weight.T, atol=ATOL, rtol=RTOL)


# --- RMSNorm -------------------------------------------------------------------------------------


def hf_rmsnorm(ours: RMSNorm) -> LlamaRMSNorm:
    ref = LlamaRMSNorm(ours.weight.shape[0], eps=ours.eps)
    ref.weight.data.copy_(ours.weight.data)
    return ref.to(ours.weight.dtype)


@pytest.mark.parametrize(
    "shape", [(7, 64), (2, 5, 64), (3, 4, 64)], ids=["tokens", "batch_tokens", "tokens_heads"]
)
def test_rmsnorm_matches_transformers_llama_rmsnorm(shape):
    norm = filled(RMSNorm(64, eps=1e-6))
    x = torch.randn(*shape) * 3
    with torch.no_grad():
        expected = hf_rmsnorm(norm)(x)
    out = norm(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL)


def test_rmsnorm_uses_its_eps():
    norm = filled(RMSNorm(64, eps=0.5))  # large enough to change every output
    x = torch.randn(3, 64) * 0.1
    with torch.no_grad():
        expected = hf_rmsnorm(norm)(x)
    torch.testing.assert_close(norm(x), expected, atol=ATOL, rtol=RTOL)


def test_rmsnorm_in_bfloat16_matches_transformers_and_keeps_the_dtype():
    norm = filled(RMSNorm(64, eps=1e-6)).to(torch.bfloat16)
    x = (torch.randn(5, 64) * 3).to(torch.bfloat16)
    with torch.no_grad():
        expected = hf_rmsnorm(norm)(x)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)  # bfloat16's default tolerance


def test_rmsnorm_forward_residual_adds_then_normalizes():
    norm = filled(RMSNorm(64, eps=1e-6))
    x, residual = torch.randn(6, 64), torch.randn(6, 64)
    normed, new_residual = norm.forward_residual(x, residual)
    torch.testing.assert_close(new_residual, x + residual, atol=ATOL, rtol=RTOL)
    with torch.no_grad():
        expected = hf_rmsnorm(norm)(x + residual)
    torch.testing.assert_close(normed, expected, atol=ATOL, rtol=RTOL)


# --- RoPE ----------------------------------------------------------------------------------------


def test_default_inv_freq_matches_transformers(tiny_model_dir: Path):
    hf_config = AutoConfig.from_pretrained(tiny_model_dir)
    expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_config)
    theta, _ = rope_settings(hf_config)
    ours = default_inv_freq(hf_config.head_dim, theta)
    assert ours.shape == (hf_config.head_dim // 2,) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, atol=0, rtol=INV_FREQ_RTOL)


def llama31_config() -> LlamaConfig:
    """The RoPE settings of a real Llama-3.1 checkpoint (head_dim 128, 8k original context)."""
    return LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        head_dim=128,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )


@pytest.mark.parametrize("which", ["tiny-llama", "llama-3.1"])
def test_llama3_inv_freq_matches_transformers_rope_init(which):
    hf_config = hf_config_of("tiny-llama") if which == "tiny-llama" else llama31_config()
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config)
    theta, scaling = rope_settings(hf_config)
    ours = llama3_inv_freq(hf_config.head_dim, theta, scaling)
    torch.testing.assert_close(ours, expected, atol=0, rtol=INV_FREQ_RTOL)
    # All three bands occur: fast frequencies kept, slow ones divided by `factor`, the middle
    # interpolated. (tiny-llama's original context is 64 tokens so that they do.)
    ratio = default_inv_freq(hf_config.head_dim, theta) / ours
    factor = scaling["factor"]
    assert torch.isclose(ratio, torch.tensor(1.0)).any(), "fast frequencies must be kept"
    assert torch.isclose(ratio, torch.tensor(factor)).any(), (
        "slow frequencies must be divided by factor"
    )
    assert ((ratio > 1.01) & (ratio < factor - 0.01)).any(), "the middle band must be interpolated"


def test_rotate_half_matches_transformers():
    x = torch.randn(3, 4, 16)
    out = rotate_half(x)
    torch.testing.assert_close(out, hf_rotate_half(x), atol=0, rtol=0)
    torch.testing.assert_close(rotate_half(out), -x, atol=0, rtol=0)  # two quarter turns


def test_rotary_forward_matches_transformers_apply_rotary_pos_emb(tiny_model_dir: Path):
    hf_config = AutoConfig.from_pretrained(tiny_model_dir)
    rotary = our_rotary(hf_config)
    tokens, dim = len(POSITIONS), hf_config.head_dim
    q = torch.randn(tokens, hf_config.num_attention_heads, dim)
    k = torch.randn(tokens, hf_config.num_key_value_heads, dim)
    ours_q, ours_k = rotary(POSITIONS, q, k)
    assert ours_q.shape == q.shape and ours_k.shape == k.shape
    with torch.no_grad():
        hf_q, hf_k = hf_rope(hf_config, POSITIONS, q, k)
    torch.testing.assert_close(ours_q, hf_q, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ours_k, hf_k, atol=ATOL, rtol=RTOL)


def test_rope_scores_depend_only_on_relative_position():
    rotary = RotaryEmbedding(64, 10000.0, max_position=128)
    q, k = torch.randn(1, 1, 64), torch.randn(1, 1, 64)

    def score(m: int, n: int) -> torch.Tensor:
        qm, _ = rotary(torch.tensor([m]), q, k)
        _, kn = rotary(torch.tensor([n]), q, k)
        return (qm * kn).sum()

    torch.testing.assert_close(score(3, 1), score(40, 38), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(score(1, 3), score(97, 99), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(score(5, 5), (q * k).sum(), atol=1e-4, rtol=1e-4)  # distance 0
    assert not torch.isclose(score(3, 1), score(3, 2)), "scores must depend on the distance"
    rotated, _ = rotary(torch.tensor([25]), q, k)
    torch.testing.assert_close(rotated.norm(), q.norm(), atol=1e-4, rtol=1e-4)  # a pure rotation


# --- SiLU and mul --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 2 * 24), (2, 3, 2 * 24)], ids=["tokens", "batch_tokens"])
def test_silu_and_mul_matches_silu_of_gate_times_up(shape):
    gate_up = torch.randn(*shape)
    gate, up = gate_up[..., :24], gate_up[..., 24:]
    out = silu_and_mul(gate_up)
    assert out.shape == (*shape[:-1], 24)
    torch.testing.assert_close(out, F.silu(gate) * up, atol=ATOL, rtol=RTOL)


# --- the attention layer -------------------------------------------------------------------------


class RecordingBackend:
    """A fake attention backend: records what the layer hands it, returns 2 * tanh(q)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def forward(self, q, k, v, layer_id, batch):  # noqa: ANN001, ANN201 - the backend interface
        self.calls.append(
            {"q": q.clone(), "k": k.clone(), "v": v.clone(), "layer_id": layer_id, "batch": batch}
        )
        return 2 * torch.tanh(q)


LAYER_ID = 3


@pytest.fixture(scope="module")
def qwen3_config():
    """Qwen3's attention shape (4 query / 2 KV heads of 16) and RoPE settings."""
    return hf_config_of("tiny-qwen3")


def run_attention(hf_config, qk_norm: bool, positions: torch.Tensor = POSITIONS):
    """Build an AttentionLayer for `hf_config`, run it on random qkv inside a real Context."""
    heads, kv_heads, dim = (
        hf_config.num_attention_heads,
        hf_config.num_key_value_heads,
        hf_config.head_dim,
    )
    layer = AttentionLayer(
        LAYER_ID,
        heads,
        kv_heads,
        dim,
        our_rotary(hf_config),
        qk_norm_eps=hf_config.rms_norm_eps if qk_norm else None,
    )
    if qk_norm:
        filled(layer)  # the q/k norm weights
    backend = RecordingBackend()
    ctx = Context(
        page_size=1,
        kv_cache=None,
        page_table=torch.zeros(1, 1, dtype=torch.int32),
        attn_backend=backend,
    )
    batch = Batch([], "decode")
    batch.positions = positions
    qkv = torch.randn(len(positions), (heads + 2 * kv_heads) * dim)
    with ctx.forward_batch(batch):
        out = layer(qkv)
    return layer, backend, batch, qkv, out


def split_heads(hf_config, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    heads, kv_heads, dim = (
        hf_config.num_attention_heads,
        hf_config.num_key_value_heads,
        hf_config.head_dim,
    )
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return (q.reshape(-1, heads, dim), k.reshape(-1, kv_heads, dim), v.reshape(-1, kv_heads, dim))


def test_attention_layer_splits_qkv_into_heads_for_the_backend(qwen3_config):
    _, backend, batch, qkv, _ = run_attention(qwen3_config, qk_norm=False)
    assert len(backend.calls) == 1
    call = backend.calls[0]
    tokens, heads, kv_heads, dim = (
        len(POSITIONS),
        qwen3_config.num_attention_heads,
        qwen3_config.num_key_value_heads,
        qwen3_config.head_dim,
    )
    assert call["q"].shape == (tokens, heads, dim)
    assert call["k"].shape == (tokens, kv_heads, dim)
    assert call["v"].shape == (tokens, kv_heads, dim)
    assert call["layer_id"] == LAYER_ID and call["batch"] is batch
    _, _, v = split_heads(qwen3_config, qkv)
    torch.testing.assert_close(call["v"], v, atol=0, rtol=0)  # v is neither normed nor rotated


def test_attention_layer_applies_rope_at_the_batch_positions(qwen3_config):
    layer, backend, _, qkv, _ = run_attention(qwen3_config, qk_norm=False)
    assert layer.q_norm is None and layer.k_norm is None
    q, k, _ = split_heads(qwen3_config, qkv)
    with torch.no_grad():
        expected_q, expected_k = hf_rope(qwen3_config, POSITIONS, q, k)
    torch.testing.assert_close(backend.calls[0]["q"], expected_q, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(backend.calls[0]["k"], expected_k, atol=ATOL, rtol=RTOL)


def test_attention_layer_normalizes_each_q_and_k_head_before_rope_when_configured(qwen3_config):
    layer, backend, _, qkv, _ = run_attention(qwen3_config, qk_norm=True)
    q, k, _ = split_heads(qwen3_config, qkv)
    with torch.no_grad():
        normed_q, normed_k = hf_rmsnorm(layer.q_norm)(q), hf_rmsnorm(layer.k_norm)(k)
        expected_q, expected_k = hf_rope(qwen3_config, POSITIONS, normed_q, normed_k)
        unnormed_q, _ = hf_rope(qwen3_config, POSITIONS, q, k)
    torch.testing.assert_close(backend.calls[0]["q"], expected_q, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(backend.calls[0]["k"], expected_k, atol=ATOL, rtol=RTOL)
    assert not torch.allclose(backend.calls[0]["q"], unnormed_q, atol=1e-2), "q norm was skipped"


def test_attention_layer_returns_the_backend_output_flattened_per_token(qwen3_config):
    _, backend, _, qkv, out = run_attention(qwen3_config, qk_norm=False)
    tokens, heads, dim = len(POSITIONS), qwen3_config.num_attention_heads, qwen3_config.head_dim
    assert out.shape == (tokens, heads * dim)
    expected = 2 * torch.tanh(backend.calls[0]["q"])  # what the fake backend returned
    torch.testing.assert_close(out, expected.reshape(tokens, heads * dim), atol=0, rtol=0)


def test_load_shard_rejects_a_transposed_tensor_of_the_right_size():
    # A [in, out] tensor for an [out, in] shard has the right number of elements: only its
    # shape tells them apart, and load_weights needs the ValueError to name the tensor.
    qkv = Linear(16, [8, 4, 4])
    with pytest.raises(ValueError):
        qkv.load_shard("weight", 0, torch.randn(16, 8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_in_half_precision_rounds_before_the_weight_like_transformers(dtype):
    # transformers rounds the normalized x to the input dtype, then multiplies by the weight:
    # rounding once at the end instead changes the last bit of many outputs.
    norm = filled(RMSNorm(64, eps=1e-6)).to(dtype)
    x = (torch.randn(5, 64) * 3).to(dtype)
    with torch.no_grad():
        expected = hf_rmsnorm(norm)(x)
    torch.testing.assert_close(norm(x), expected, atol=0, rtol=0)


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. Floats match within the rounding of another order of
# operations (float32: 1e-5; bfloat16 and float16: a few roundings of values up to about 8).
# RoPE's cos/sin lookup and the attention layer show only over several calls or inside a
# forward: they are compared as runs, yours against the same run with the reference's body.

HALF_TOLERANCE = {torch.bfloat16: Tolerance(1.6e-2, 6e-2), torch.float16: Tolerance(1e-3, 8e-3)}
FLOAT32_TOLERANCE = Tolerance(RTOL, ATOL)
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
SEEDS = st.integers(0, 2**16)
LEADING = st.lists(st.integers(0, 4), max_size=2)  # any leading shape, empty ones too


def tolerance_of(dtype: torch.dtype) -> Tolerance:
    return HALF_TOLERANCE.get(dtype, FLOAT32_TOLERANCE)


def random_tensor(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


def seeded(module: torch.nn.Module, seed: int, dtype: torch.dtype = torch.float32):  # noqa: ANN201
    """`module` with every parameter drawn from `seed`, in `dtype`: norm weights around 1,
    projections scaled by 1/sqrt(fan-in) so that outputs stay O(1) (and half-precision rounding
    small). Buffers (RoPE's cos/sin tables) stay as built."""
    for i, param in enumerate(module.parameters()):
        values = random_tensor(seed + i, *param.shape)
        scale = 1.0 / param.shape[-1] ** 0.5 if param.dim() == 2 else 0.3
        param.data = (values * scale + (1.0 if param.dim() == 1 else 0.0)).to(dtype)
    return module


def assert_same_run(chapter: int, stub: str, run, what: str, tolerance: Tolerance) -> None:  # noqa: ANN001
    """`run()` with your code, then with the reference's body of `stub` ("path:Class.method")
    alone in its place: their results (any exception as its type) must match."""

    def outcome() -> object:
        try:
            return run()
        except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
            return f"raised {type(error).__name__}"

    yours = outcome()
    with use_reference_stubs(chapter, only={stub}):
        reference = outcome()
    assert reference != "raised NotImplementedError", f"{what}: it calls code not written yet"
    found = differences(yours, reference, "result", tolerance)
    assert not found, f"{stub} differs from the reference on {what}:\n  " + "\n  ".join(found)


@given(
    input_size=st.integers(1, 48),
    output_sizes=st.lists(st.integers(1, 24), min_size=1, max_size=3),
    bias=st.booleans(),
    leading=LEADING,
    dtype=DTYPES,
    seed=SEEDS,
)
@settings(max_examples=30)
def test_linear_forward_matches_the_reference(input_size, output_sizes, bias, leading, dtype, seed):
    """Plain and merged (several shards) projections, with and without bias, on inputs of any
    leading shape (none, one token, zero tokens), in three dtypes."""
    layer = seeded(Linear(input_size, output_sizes, bias=bias), seed, dtype)
    x = random_tensor(seed - 1, *leading, input_size).to(dtype)
    assert_same_call(Linear.forward, layer, x, tolerance=tolerance_of(dtype))


def checkpoint_shape(rows: int, cols: int | None, wrong: str | None) -> tuple[int, ...]:
    """The shape a shard of `rows` (x `cols` for a weight) should have, or a wrong one."""
    right = (rows, cols) if cols is not None else (rows,)
    wrong_shapes = {
        "one row more": (rows + 1, *right[1:]),
        "one row less": (rows - 1, *right[1:]),
        "one column more": (rows, cols + 1) if cols is not None else (rows, 1),
        "transposed": (cols, rows) if cols is not None else (1, rows),
        "flattened": (rows * (cols or 1),) if cols is not None else (rows, 1),
        "broadcastable": (1, cols) if cols is not None else (1,),
    }
    return wrong_shapes[wrong] if wrong is not None else right


@given(
    input_size=st.integers(1, 6),
    output_sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    bias=st.booleans(),
    on_bias=st.booleans(),
    shard=st.integers(0, 3),
    wrong=st.sampled_from(
        [None, None, "one row more", "one row less", "one column more", "transposed"]
        + ["flattened", "broadcastable"]
    ),
    checkpoint_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
@settings(max_examples=60)
def test_load_shard_matches_the_reference(
    input_size, output_sizes, bias, on_bias, shard, wrong, checkpoint_dtype, seed
):
    """Every shard of merged and plain projections, weight and bias, in either dtype of a
    checkpoint; and tensors of a wrong shape (also ones copy_ would broadcast, and a transposed
    one of the right size), which must raise ValueError and leave the parameter alone.
    Compared: the parameters after the call (yours may write them any way) and the tensor."""
    shard %= len(output_sizes)
    param_name = "bias" if bias and on_bias else "weight"
    cols = None if param_name == "bias" else input_size
    shape = checkpoint_shape(output_sizes[shard], cols, wrong)
    tensor = random_tensor(seed, *shape).to(checkpoint_dtype)
    layer = seeded(Linear(input_size, output_sizes, bias=bias), seed + 1)

    def observe(result, layer, name, shard, tensor) -> tuple:  # noqa: ANN001
        return result, layer.weight, layer.bias, tensor

    assert_same_call(Linear.load_shard, layer, param_name, shard, tensor, observe=observe)


@given(
    vocab=st.integers(1, 60),
    hidden=st.integers(1, 16),
    shape=st.lists(st.integers(0, 5), max_size=3),
    id_dtype=st.sampled_from([torch.int64, torch.int32]),
    dtype=DTYPES,
    seed=SEEDS,
)
@settings(max_examples=30)
def test_vocab_embedding_forward_matches_the_reference(vocab, hidden, shape, id_dtype, dtype, seed):
    """Ids of any shape (a scalar, empty, batches), int64 or int32, the first and last row."""
    embedding = seeded(VocabEmbedding(vocab, hidden), seed, dtype)
    ids = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))
    if ids.numel():
        ids.view(-1)[0], ids.view(-1)[-1] = 0, vocab - 1
    assert_same_call(VocabEmbedding.forward, embedding, ids.to(id_dtype))


@given(
    vocab=st.integers(1, 60),
    hidden=st.integers(1, 32),
    tied=st.booleans(),
    leading=LEADING,
    dtype=DTYPES,
    seed=SEEDS,
)
@settings(max_examples=30)
def test_lm_head_forward_matches_the_reference(vocab, hidden, tied, leading, dtype, seed):
    """Its own matrix or the embedding's (tied), on hidden states of any leading shape."""
    embedding = seeded(VocabEmbedding(vocab, hidden), seed, dtype) if tied else None
    head = seeded(LMHead(vocab, hidden, tied_to=embedding), seed + 1, dtype)
    hidden_states = random_tensor(seed - 1, *leading, hidden).to(dtype)
    assert_same_call(LMHead.forward, head, hidden_states, tolerance=tolerance_of(dtype))


NORM_INPUTS = dict(
    size=st.integers(1, 96),
    eps=st.sampled_from([1e-6, 1e-5, 0.5]),
    leading=st.sampled_from([(), (1,), (5,), (3, 4), (0,)]),  # (3, 4): tokens x heads
    scale=st.sampled_from([1e-3, 1.0, 30.0]),  # 1e-3: mean square below eps
    zero_rows=st.booleans(),
    dtype=DTYPES,
    seed=SEEDS,
)


def norm_input(leading: tuple, size: int, scale: float, zero_rows: bool, dtype, seed: int):  # noqa: ANN001, ANN201
    x = random_tensor(seed, *leading, size, scale=scale)
    if zero_rows and x.numel():
        x.view(-1, size)[::2] = 0.0
    return x.to(dtype)


@given(**NORM_INPUTS)
@settings(max_examples=40)
def test_rmsnorm_forward_matches_the_reference(size, eps, leading, scale, zero_rows, dtype, seed):
    """Any leading shape, vectors of one element up, tiny and all-zero vectors, in float32 and
    half precision (normalized in float32, returned in x's dtype)."""
    norm = seeded(RMSNorm(size, eps), seed, dtype)
    x = norm_input(leading, size, scale, zero_rows, dtype, seed + 1)
    assert_same_call(RMSNorm.forward, norm, x, tolerance=tolerance_of(dtype))


@given(**NORM_INPUTS)
@settings(max_examples=40)
def test_rmsnorm_forward_residual_matches_the_reference(
    size, eps, leading, scale, zero_rows, dtype, seed
):
    """(normed, new residual) as the reference returns them. Whether x and residual may be
    overwritten in place (a fused kernel does) the contract leaves open: only the returned
    pair is compared."""
    norm = seeded(RMSNorm(size, eps), seed, dtype)
    x = norm_input(leading, size, scale, zero_rows, dtype, seed + 1)
    residual = norm_input(leading, size, 1.0, False, dtype, seed + 2)

    def returned(result, *_) -> object:  # noqa: ANN001, ANN002
        return result

    assert_same_call(
        RMSNorm.forward_residual,
        norm,
        x,
        residual,
        tolerance=tolerance_of(dtype),
        observe=returned,
    )


HEAD_DIMS = st.integers(1, 128).map(lambda half: 2 * half)
BASES = st.sampled_from([10000.0, 500000.0, 1e6]) | st.floats(100.0, 1e7)
# Relative 1e-5: a pow computed another way (float64, or base**-e) rounds differently.
INV_FREQ_TOLERANCE = Tolerance(rtol=1e-5)


@given(head_dim=HEAD_DIMS, base=BASES)
@settings(max_examples=40)
def test_default_inv_freq_matches_the_reference(head_dim, base):
    assert_same_call(default_inv_freq, head_dim, base, tolerance=INV_FREQ_TOLERANCE)


LLAMA3_SCALING = st.fixed_dictionaries(
    {
        "rope_type": st.just("llama3"),
        "factor": st.floats(1.0, 32.0),
        "low_freq_factor": st.floats(0.5, 2.0),
        "high_freq_factor": st.floats(2.5, 8.0),
        "original_max_position_embeddings": st.sampled_from([16, 64, 100, 2048, 8192]),
    }
)


@given(head_dim=HEAD_DIMS, base=BASES, scaling=LLAMA3_SCALING)
@settings(max_examples=40)
def test_llama3_inv_freq_matches_the_reference(head_dim, base, scaling):
    """Scaling parameters whose bands fall anywhere: all frequencies kept, all divided by
    factor, or split three ways with the middle interpolated; the dict left as it was."""
    assert_same_call(llama3_inv_freq, head_dim, base, scaling, tolerance=INV_FREQ_TOLERANCE)


@given(
    leading=LEADING,
    half=st.integers(1, 32),
    dtype=DTYPES,
    seed=SEEDS,
)
@settings(max_examples=30)
def test_rotate_half_matches_the_reference(leading, half, dtype, seed):
    """Exact: a permutation and a sign change, in any dtype and leading shape."""
    assert_same_call(rotate_half, random_tensor(seed, *leading, 2 * half).to(dtype))


POSITION_REUSE = st.sampled_from(["a new tensor", "the same tensor", "an equal copy"])


@given(
    head_dim=st.sampled_from([2, 8, 16, 64]),
    scaling=st.none() | LLAMA3_SCALING,
    heads=st.sampled_from([(1, 1), (4, 2), (4, 1), (3, 3)]),
    calls=st.lists(st.tuples(st.integers(0, 6), POSITION_REUSE), min_size=1, max_size=3),
    dtype=DTYPES,
    seed=SEEDS,
)
@settings(max_examples=30)
def test_rotary_forward_matches_the_reference(head_dim, scaling, heads, calls, dtype, seed):
    """A run of forwards on one module, as the layers of a forward and then the next forward
    make them: positions of zero tokens up, in any order, at the table's ends; each call with a
    new positions tensor, the very tensor of the call before (what every layer of one forward
    passes), or an equal copy of it. Compared: every call's rotated q and k."""
    num_heads, num_kv_heads = heads
    generator = torch.Generator().manual_seed(seed)

    def run() -> list:
        rotary = RotaryEmbedding(head_dim, 10000.0, 64, scaling)
        outputs, positions = [], torch.tensor([], dtype=torch.int64)
        for i, (tokens, reuse) in enumerate(calls):
            if reuse == "an equal copy":
                positions = positions.clone()
            elif reuse == "a new tensor" or len(positions) != tokens:
                positions = torch.randint(0, 64, (tokens,), generator=generator)
                if tokens:
                    positions[-1] = 63  # the table's last row
            q = random_tensor(seed + i, len(positions), num_heads, head_dim).to(dtype)
            k = random_tensor(seed - i, len(positions), num_kv_heads, head_dim).to(dtype)
            outputs.append(rotary(positions, q, k))
        return outputs

    def reseeded_run() -> list:
        generator.manual_seed(seed)  # both runs draw the same positions
        return run()

    assert_same_run(
        2,
        "layers/rotary.py:RotaryEmbedding.forward",
        reseeded_run,
        "a run of forwards",
        tolerance_of(dtype),
    )


@given(leading=LEADING, size=st.integers(1, 32), dtype=DTYPES, seed=SEEDS)
@settings(max_examples=30)
def test_silu_and_mul_matches_the_reference(leading, size, dtype, seed):
    gate_up = random_tensor(seed, *leading, 2 * size, scale=3.0).to(dtype)
    assert_same_call(silu_and_mul, gate_up, tolerance=tolerance_of(dtype))


@given(
    heads=st.sampled_from([(4, 2), (2, 2), (4, 1), (6, 3)]),
    head_dim=st.sampled_from([2, 8, 16]),
    qk_norm=st.booleans(),
    tokens=st.integers(0, 5),
    layer_id=st.integers(0, 3),
    dtype=DTYPES,
    seed=SEEDS,
)
@settings(max_examples=30)
def test_attention_layer_forward_matches_the_reference(
    heads, head_dim, qk_norm, tokens, layer_id, dtype, seed
):
    """Inside a real forward_batch with a recording backend: grouped-query shapes, q/k norm on
    and off, zero tokens up, at random positions. Compared: the output, and every call of the
    backend (its q, k, v, layer_id, and whether it got the running batch)."""
    num_heads, num_kv_heads = heads
    positions = torch.randint(0, 64, (tokens,), generator=torch.Generator().manual_seed(seed))
    qkv = random_tensor(seed, tokens, (num_heads + 2 * num_kv_heads) * head_dim).to(dtype)

    def run() -> tuple:
        rotary = RotaryEmbedding(head_dim, 10000.0, 64)
        eps = 1e-6 if qk_norm else None
        layer = AttentionLayer(layer_id, num_heads, num_kv_heads, head_dim, rotary, eps)
        seeded(layer, seed + 1, dtype)
        backend = RecordingBackend()
        ctx = Context(1, None, torch.zeros(1, 1, dtype=torch.int32), backend)
        batch = Batch([], "decode")
        batch.positions = positions
        with ctx.forward_batch(batch):
            out = layer(qkv.clone())
        calls = [{**call, "batch": call["batch"] is batch} for call in backend.calls]
        return out, calls

    assert_same_run(
        2, "layers/attention.py:AttentionLayer.forward", run, "a forward", tolerance_of(dtype)
    )
