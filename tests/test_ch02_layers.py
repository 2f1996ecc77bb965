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
