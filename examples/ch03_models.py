# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 3: a whole model from a checkpoint directory
#
# `ModelConfig` reads config.json, `create_model` picks the decoder class for the architecture,
# `load_weights` streams the safetensors file into it (merging q/k/v and gate/up on the way),
# and one forward over a prompt gives next-token logits, which we check against transformers.
# The batch is assembled by hand (the scheduler comes in chapter 7) on the KV pool and the
# torch attention backend, brought in early from chapters 4 and 5.

# %%
import os
import sys
import time
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

import dataclasses

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from minisgl.attention.torch_backend import TorchAttnBackend
from minisgl.core import Batch, Context, Req, SamplingParams
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.models import ModelConfig, create_model, load_weights
from minisgl.models.weight import map_weight_name
from minisgl.utils import MinisglError, exit_on_error

MODEL = Path(os.environ.get("MINISGL_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct"))
PROMPT = "The capital of France is"
hf_logging.disable_progress_bar()

# %% [markdown]
# ## The config: shapes and a few switches
#
# Llama, Qwen2 and Qwen3 share one decoder. What differs is a handful of switches derived from
# config.json, so the decoder code never asks "which model am I?".

# %%
with exit_on_error():
    config = ModelConfig.from_dir(MODEL)
for field in dataclasses.fields(config):
    print(f"  {field.name:<24}{getattr(config, field.name)}")

print(
    f"\n{'model':<24}{'architecture':<20}{'qkv_bias':>9}{'o_bias':>7}{'qk_norm':>8}{'tied':>6}"
    f"{'rope_theta':>11}  rope_scaling"
)
for name in ["SmolLM2-135M-Instruct", "tiny-llama", "tiny-qwen2", "tiny-qwen3"]:
    if (ROOT / "models" / name / "config.json").is_file():
        c = ModelConfig.from_dir(ROOT / "models" / name)
        rope = (c.rope_scaling or {}).get("rope_type", "-")
        print(
            f"{name:<24}{c.architecture:<20}{c.qkv_bias!s:>9}{c.o_bias!s:>7}{c.qk_norm!s:>8}"
            f"{c.tie_word_embeddings!s:>6}{c.rope_theta:>11.0f}  {rope}"
        )

# %% [markdown]
# ## Build the model, then load the checkpoint into it
#
# The checkpoint names q, k and v (and gate, up) apart; our model has one merged matrix for
# each group. `map_weight_name` says where each tensor goes.

# %%
model = create_model(config, torch.device("cpu"), torch.float32)  # uninitialised weights
layer0 = "model.layers.0."
with safe_open(MODEL / "model.safetensors", framework="pt") as f:
    keys = list(f.keys())
    for key in sorted(k for k in keys if k.startswith(layer0)):
        ours, shard = map_weight_name(key, model.WEIGHT_NAME_MAP)
        where = f"  (shard {shard})" if shard is not None else ""
        shape = tuple(f.get_slice(key).get_shape())
        print(f"  {key[len(layer0) :]:<34}{shape!s:<13}-> {ours[len(layer0) :]}{where}")

start = time.perf_counter()
load_weights(model, MODEL, progress=False)
seconds = time.perf_counter() - start
params = sum(p.numel() for p in model.parameters())
print(
    f"\n{len(keys)} checkpoint tensors -> {len(list(model.parameters()))} parameters "
    f"({params / 1e6:.1f} M numbers) in {seconds:.2f} s; "
    f"lm_head {'shares the embedding' if config.tie_word_embeddings else 'has its own weight'}"
)
print(
    f"layer 0 qkv_proj.weight {tuple(model.model.layers[0].self_attn.qkv_proj.weight.shape)}, "
    f"gate_up_proj.weight {tuple(model.model.layers[0].mlp.gate_up_proj.weight.shape)}"
)

# %% [markdown]
# ## One forward: the next token after the prompt
#
# One request, whose page-table row maps positions 0..n-1 to KV slots 0..n-1. The model reads
# the batch from the context and returns the logits of each request's last token only.

# %%
tokenizer = AutoTokenizer.from_pretrained(MODEL)
ids = tokenizer.encode(PROMPT)
n = len(ids)
kv_cache = MHAKVCache(
    n, config.num_layers, config.num_kv_heads, config.head_dim, torch.float32, torch.device("cpu")
)
page_table = torch.arange(n, dtype=torch.int32)[None]  # row 0: position i -> slot i
backend = TorchAttnBackend(kv_cache, page_table)
ctx = Context(1, kv_cache, page_table, backend)
req = Req(
    torch.tensor(ids, dtype=torch.int32),
    table_idx=0,
    cached_len=0,
    output_len=1,
    uid=0,
    sampling_params=SamplingParams(max_tokens=1),
)
batch = Batch([req], "prefill")
batch.input_ids = req.input_ids
batch.positions = torch.arange(n)
batch.out_loc = page_table[0, :n]
backend.prepare_metadata(batch)
start = time.perf_counter()
with torch.inference_mode(), ctx.forward_batch(batch):
    logits = model()
print(
    f"{PROMPT!r}: {n} tokens, logits {tuple(logits.shape)} in "
    f"{(time.perf_counter() - start) * 1000:.0f} ms"
)

probs = logits[0].softmax(-1)
top = probs.topk(5)
for rank, (p, token) in enumerate(zip(top.values.tolist(), top.indices.tolist()), 1):
    print(
        f"  {rank}. {tokenizer.decode([token])!r:<12} p = {p:.3f}  logit = {logits[0, token]:.3f}"
    )

# %% [markdown]
# ## The same logits as transformers?

# %%
hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
with torch.inference_mode():
    expected = hf(torch.tensor([ids])).logits[0, -1]
# Thirty layers of float32 sums in another order move a logit by ~1e-5; a wrong RoPE base, a
# skipped norm or a misloaded weight moves it by whole units.
LOGIT_ATOL = 1e-4
diff = (logits[0] - expected).abs().max().item()
print(
    f"max |logit diff| vs transformers < {LOGIT_ATOL:g}: {diff < LOGIT_ATOL} (logits range "
    f"{expected.min():.1f} .. {expected.max():.1f}); same argmax: "
    f"{logits[0].argmax().item() == expected.argmax().item()}"
)

# %% [markdown]
# ## Clear errors
#
# A model directory that does not exist, and an architecture no decoder implements, are the
# user's mistakes, not bugs: they raise a `MinisglError` that names the problem.

# %%
for attempt in [
    lambda: ModelConfig.from_dir("no-such-model"),
    lambda: create_model(
        dataclasses.replace(config, architecture="GPT2LMHeadModel"),
        torch.device("cpu"),
        torch.float32,
    ),
]:
    try:
        attempt()
    except MinisglError as error:
        print(f"{type(error).__name__}: {error}")
