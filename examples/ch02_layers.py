# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 2: the decoder's layers, one by one, against transformers
#
# We take SmolLM2's first decoder layer as transformers runs it, copy its weights into our
# layers, feed both the same hidden states of "The capital of France is", and measure how far
# apart the outputs are. Then we look at two properties of RoPE: its scores depend only on the
# distance between tokens, and Llama 3 rescales its frequencies in three bands.

# %%
import os
import sys
from pathlib import Path


def repo_root() -> Path:
    """The repository root: next to this script, or the notebook's working directory."""
    if "__file__" in globals():
        return Path(__file__).resolve().parent.parent
    cwd = Path.cwd()
    return cwd.parent if cwd.name == "examples" else cwd


ROOT = repo_root()
try:
    import minisgl  # noqa: F401  (the tree under test, or the installed package)
except ImportError:  # a plain checkout: use the reference engine next to this script
    sys.path.insert(0, str(ROOT / "solutions"))

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from transformers.utils import logging as hf_logging

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
from minisgl.layers.rotary import default_inv_freq, llama3_inv_freq

MODEL = Path(os.environ.get("MINISGL_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct"))
TINY_LLAMA = ROOT / "models" / "tiny-llama"  # built with Llama-3 RoPE scaling
torch.set_grad_enabled(False)
hf_logging.disable_progress_bar()

# %%
hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
cfg = hf.config
hf_layer = hf.model.layers[0]
tokenizer = AutoTokenizer.from_pretrained(MODEL)
ids = torch.tensor(tokenizer.encode("The capital of France is"))
positions = torch.arange(len(ids))
heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
q_size, kv_size = heads * head_dim, kv_heads * head_dim
print(
    f"{MODEL.name}: hidden {cfg.hidden_size}, {heads} query / {kv_heads} KV heads of "
    f"{head_dim}, MLP {cfg.intermediate_size}, vocab {cfg.vocab_size}; {len(ids)} prompt tokens"
)

# Float32 sums taken in another order (another kernel, CPU or thread count) differ in the last
# bits; a wrong RoPE base or a skipped norm is off by order one. The bound is what this chapter's
# tests demand (assert_close with these tolerances).
ATOL, RTOL = 1e-5, 1e-5
results: list[tuple[str, str, bool]] = []  # (our layer, transformers' module, within the bound)


def compare(ours: str, theirs: str, a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape, (ours, a.shape, b.shape)
    results.append((ours, theirs, torch.allclose(a, b, atol=ATOL, rtol=RTOL)))


# %% [markdown]
# ## A merged qkv projection
#
# q, k and v all multiply the same hidden state, so we stack their three weight matrices into
# one `Linear` with `output_sizes=[q, k, v]`. The checkpoint still stores them apart:
# `load_shard` copies each into its rows.

# %%
qkv = Linear(cfg.hidden_size, [q_size, kv_size, kv_size])
for shard, name in enumerate(["q_proj", "k_proj", "v_proj"]):
    tensor = getattr(hf_layer.self_attn, name).weight
    qkv.load_shard("weight", shard, tensor)
    start = sum(qkv.output_sizes[:shard])
    print(
        f"  {name}.weight {tuple(tensor.shape)} -> qkv_proj.weight rows "
        f"[{start}:{start + qkv.output_sizes[shard]}]"
    )
print(
    f"qkv_proj.weight: {tuple(qkv.weight.shape)} (output_sizes {qkv.output_sizes}), one matmul "
    "instead of three"
)
try:
    qkv.load_shard("weight", 1, hf_layer.self_attn.q_proj.weight)  # q's tensor into k's rows
except ValueError as error:
    print(f"loading q_proj into the k shard -> ValueError: {error}")

# %% [markdown]
# ## Layer by layer through SmolLM2's first decoder layer
#
# Each of our layers gets transformers' weights and transformers' input, so every row below
# measures one layer alone. The attention layer needs a running batch and a backend: a small
# dense causal one stands in for the paged backends of chapter 5.

# %%
emb = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
emb.weight.data.copy_(hf.model.embed_tokens.weight)
x = emb(ids)
compare("VocabEmbedding", "embed_tokens", x, hf.model.embed_tokens(ids))

norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
norm.weight.data.copy_(hf_layer.input_layernorm.weight)
h = norm(x)
compare("RMSNorm", "LlamaRMSNorm", h, hf_layer.input_layernorm(x))

q, k, v = qkv(h).split([q_size, kv_size, kv_size], dim=-1)
for out, name in zip((q, k, v), ("q_proj", "k_proj", "v_proj")):
    compare(f"Linear (qkv, {name[0]} rows)", name, out, getattr(hf_layer.self_attn, name)(h))

rotary = RotaryEmbedding(head_dim, cfg.rope_parameters["rope_theta"], cfg.max_position_embeddings)
q_rot, k_rot = rotary(positions, q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim))
cos, sin = hf.model.rotary_emb(x, positions[None])
hf_q, hf_k = apply_rotary_pos_emb(
    q.view(1, -1, heads, head_dim), k.view(1, -1, kv_heads, head_dim), cos, sin, unsqueeze_dim=2
)
compare("RotaryEmbedding (q)", "apply_rotary_pos_emb", q_rot, hf_q[0])
compare("RotaryEmbedding (k)", "apply_rotary_pos_emb", k_rot, hf_k[0])


class DenseCausalBackend:
    """One request, no KV cache: causal attention over the batch's own tokens."""

    def forward(self, q, k, v, layer_id, batch):  # noqa: ANN001, ANN201 - the backend interface
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        )
        return out.transpose(0, 1)


attn = AttentionLayer(0, heads, kv_heads, head_dim, rotary)
o_proj = Linear(q_size, [cfg.hidden_size])
o_proj.load_shard("weight", 0, hf_layer.self_attn.o_proj.weight)
ctx = Context(
    page_size=1,
    kv_cache=None,
    page_table=torch.zeros(1, 1, dtype=torch.int32),
    attn_backend=DenseCausalBackend(),
)
batch = Batch([], "prefill")
batch.positions = positions
with ctx.forward_batch(batch):
    attn_out = o_proj(attn(qkv(h)))
hf_attn_out = hf_layer.self_attn(h[None], position_embeddings=(cos, sin), attention_mask=None)[0][0]
compare("AttentionLayer + o_proj", "LlamaAttention", attn_out, hf_attn_out)

post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
post_norm.weight.data.copy_(hf_layer.post_attention_layernorm.weight)
h2, residual = post_norm.forward_residual(attn_out, x)
compare(
    "RMSNorm.forward_residual",
    "x + attn, then norm",
    h2,
    hf_layer.post_attention_layernorm(x + hf_attn_out),
)

gate_up = Linear(cfg.hidden_size, [cfg.intermediate_size] * 2)
gate_up.load_shard("weight", 0, hf_layer.mlp.gate_proj.weight)
gate_up.load_shard("weight", 1, hf_layer.mlp.up_proj.weight)
down = Linear(cfg.intermediate_size, [cfg.hidden_size])
down.load_shard("weight", 0, hf_layer.mlp.down_proj.weight)
act = silu_and_mul(gate_up(h2))
compare(
    "silu_and_mul",
    "silu(gate_proj) * up_proj",
    act,
    F.silu(hf_layer.mlp.gate_proj(h2)) * hf_layer.mlp.up_proj(h2),
)
compare("MLP (gate_up, act, down)", "LlamaMLP", down(act), hf_layer.mlp(h2))

head = LMHead(cfg.vocab_size, cfg.hidden_size, tied_to=emb)  # SmolLM2 ties its embeddings
compare("LMHead (tied)", "lm_head", head(h2), hf.lm_head(h2))

print(f"{'ours':<28}{'transformers':<28}equal within atol {ATOL:g}, rtol {RTOL:g}")
for ours, theirs, close in results:
    print(f"{ours:<28}{theirs:<28}{'yes' if close else 'NO'}")

# %% [markdown]
# ## RoPE: scores depend only on the distance
#
# Rotating the query at position m and the key at position n by angles proportional to m and n
# leaves their dot product a function of m - n alone. Below: a real query and key of head 0
# (token 1 of the prompt), placed at different positions.

# %%
q0, k0 = q.view(-1, heads, head_dim)[1:2, :1], k.view(-1, kv_heads, head_dim)[1:2, :1]


def score(m: int, n: int) -> float:
    qm, _ = rotary(torch.tensor([m]), q0, k0)
    _, kn = rotary(torch.tensor([n]), q0, k0)
    return (qm * kn).sum().item()


print(f"{'m':>6}{'n':>6}{'m - n':>7}{'q(m) . k(n)':>14}")
for m, n in [(3, 0), (10, 7), (500, 497), (8000, 7997), (3, 1), (3, 3), (0, 3)]:
    print(f"{m:>6}{n:>6}{m - n:>7}{score(m, n):>14.5f}")
rotated, _ = rotary(torch.tensor([1234]), q0, k0)
print(
    f"|q| = {q0.norm():.4f}, |q rotated to position 1234| = {rotated.norm():.4f} (a pure rotation)"
)

# %% [markdown]
# ## Llama 3's three frequency bands
#
# Llama 3 keeps the fast-rotating pairs (short wavelengths), divides the slow ones by `factor`
# (so positions far beyond the original context look like positions within it), and
# interpolates in between. tiny-llama uses an original context of 64 tokens so that all three
# bands occur in its 8 frequency pairs.

# %%
tiny = AutoConfig.from_pretrained(TINY_LLAMA)
scaling = {k: v for k, v in tiny.rope_parameters.items() if k != "rope_theta"}
theta, context = tiny.rope_parameters["rope_theta"], scaling["original_max_position_embeddings"]
plain = default_inv_freq(tiny.head_dim, theta)
scaled = llama3_inv_freq(tiny.head_dim, theta, scaling)
expected, _ = ROPE_INIT_FUNCTIONS["llama3"](tiny)
print(
    f"theta {theta:g}, factor {scaling['factor']}, original context {context}; "
    f"equal to transformers' within float32 rounding: "
    f"{torch.allclose(scaled, expected, atol=0, rtol=1e-6)}"
)
print(f"{'pair':>4}{'wavelength':>12}{'default':>12}{'llama3':>12}{'ratio':>8}  band")
for i, (p, s) in enumerate(zip(plain.tolist(), scaled.tolist())):
    wavelength = 2 * torch.pi / p
    band = (
        "kept"
        if wavelength < context / scaling["high_freq_factor"]
        else "divided by factor"
        if wavelength > context / scaling["low_freq_factor"]
        else "interpolated"
    )
    print(f"{i:>4}{wavelength:>12.1f}{p:>12.3e}{s:>12.3e}{p / s:>8.2f}  {band}")
