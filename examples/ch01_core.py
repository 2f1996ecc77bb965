# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 1: a request is a ledger of three lengths
#
# The engine tracks each request with three numbers over its token sequence (prompt, then the
# tokens generated so far): `cached_len` tokens have their K/V in the KV cache, `device_len`
# tokens are known to the device, and `max_device_len` is where the request must stop. Every
# other length is derived from them. Here we walk one request through a prefill and its decode
# steps, print the ledger after each, and look at the errors that guard it.
#
# No model runs in this chapter: the "sampled" tokens are the tokenizer's own continuation of
# the prompt, so the text grows as it would in a real run.

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
from transformers import AutoTokenizer

from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx
from minisgl.utils import exit_on_error

MODEL = Path(os.environ.get("MINISGL_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct"))

# %% [markdown]
# ## Sampling parameters
#
# `temperature=0` means greedy (argmax); so does `top_k=1`, whatever the temperature. Values
# that make no sense are refused when the object is made, with a message naming the field.

# %%
for kwargs in [
    {},
    {"temperature": 0.7},
    {"temperature": 0.7, "top_k": 1},
    {"temperature": 1.0, "top_p": 0.9, "top_k": 50},
]:
    params = SamplingParams(**kwargs)
    print(
        f"SamplingParams({', '.join(f'{k}={v}' for k, v in kwargs.items())}):".ljust(58),
        f"greedy={params.is_greedy}",
    )

print()
for bad in [{"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": 0}]:
    try:
        SamplingParams(**bad)
        print(f"{bad}: accepted?!")
    except ValueError as error:
        print(f"{str(bad):22} -> ValueError: {error}")

# %% [markdown]
# ## One request, step by step
#
# Before each forward, the engine computes K/V for positions `[cached_len, device_len)`
# (`extend_len` tokens) and samples the token at position `device_len`. After it,
# `complete_one()` moves the ledger on and `append_host()` adds the token to the CPU copy.
# The first forward (prefill) covers the whole prompt; each decode step covers one token.

# %%
with exit_on_error():
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
prompt = "The capital of France is"
continuation = tokenizer.encode(prompt + " Paris, a city on the Seine.")
prompt_ids = tokenizer.encode(prompt)
replay = continuation[len(prompt_ids) :]  # what a model would sample, token by token
max_tokens = 5

req = Req(
    torch.tensor(prompt_ids, dtype=torch.int32),
    table_idx=0,
    cached_len=0,
    output_len=max_tokens,
    uid=0,
    sampling_params=SamplingParams(max_tokens=max_tokens),
)

header = (
    f"{'after':<10}{'cached_len':>11}{'device_len':>11}{'max_device':>11}"
    f"{'extend_len':>11}{'remain_len':>11}{'can_decode':>11}   text"
)
print(header)
print("-" * len(header))


def show(label: str) -> None:
    text = tokenizer.decode(req.input_ids.tolist())
    print(
        f"{label:<10}{req.cached_len:>11}{req.device_len:>11}{req.max_device_len:>11}"
        f"{req.extend_len:>11}{req.remain_len:>11}{str(req.can_decode):>11}   {text!r}"
    )


show("creation")
step = 0
while req.can_decode:
    phase = "prefill" if req.cached_len == 0 else f"decode {step}"
    req.complete_one()
    req.append_host(replay[step])
    step += 1
    show(phase)

print(
    f"\n{req}: {len(req.input_ids)} tokens on the host "
    f"({len(prompt_ids)} prompt + {max_tokens} generated in {step} forwards)"
)

# %% [markdown]
# `max_tokens` counts the token sampled by the prefill, so 5 tokens take 5 forwards (1 prefill +
# 4 decodes). At the end `device_len == max_device_len` and the last token's K/V were never
# computed (`cached_len` is one behind): nothing will ever attend to it.
#
# A request whose first tokens are already cached (a prefix-cache hit, chapter 9) starts with
# `cached_len > 0`: its prefill computes only the uncached tail.

# %%
hit = Req(
    torch.tensor(prompt_ids, dtype=torch.int32),
    table_idx=1,
    cached_len=3,
    output_len=max_tokens,
    uid=1,
    sampling_params=SamplingParams(max_tokens=max_tokens),
)
print(f"prefix hit: {hit}, extend_len={hit.extend_len} of {len(prompt_ids)} prompt tokens")

# %% [markdown]
# ## The invariant `0 <= cached_len < device_len <= max_device_len`
#
# A forward always has at least one token to compute, so a request cannot be created with its
# whole prompt cached; nor with an empty prompt, a negative cached length, or a negative budget.

# %%
ledgers = {
    "whole prompt cached": dict(cached_len=len(prompt_ids)),
    "negative cached_len": dict(cached_len=-1),
    "empty prompt": dict(prompt=[]),
    "output_len < 0": dict(output_len=-2),
}
for why, change in ledgers.items():
    ids = change.get("prompt", prompt_ids)
    cached, output_len = change.get("cached_len", 0), change.get("output_len", 4)
    ledger = f"0 <= {cached} < {len(ids)} <= {len(ids) + output_len}"
    try:
        Req(
            torch.tensor(ids, dtype=torch.int32),
            table_idx=0,
            cached_len=cached,
            output_len=output_len,
            uid=9,
            sampling_params=SamplingParams(max_tokens=4),
        )
        print(f"{why:20} {ledger:18} accepted?!")
    except (AssertionError, ValueError) as error:
        print(f"{why:20} {ledger:18} -> {type(error).__name__}: {error}")

# %% [markdown]
# ## The context of a forward
#
# Layers deep inside the model need the running batch (its positions, the KV pool, the
# attention backend). Instead of passing it through every call, the engine activates one
# `Context` for the duration of a forward, and layers read it with `get_global_ctx()`.

# %%
ctx = Context(
    page_size=1, kv_cache=None, page_table=torch.zeros(1, 16, dtype=torch.int32), attn_backend=None
)
batch = Batch([req], "decode")
print(f"batch: {batch.size} request(s), phase={batch.phase}, is_decode={batch.is_decode}")


def active() -> str:
    try:
        found = get_global_ctx()
        return f"active context holds batch of {found.batch.size} ({found.batch.phase})"
    except RuntimeError as error:
        return f"RuntimeError: {error}"


print("before forward_batch:", active())
with ctx.forward_batch(batch):
    print("inside forward_batch:", active())
    try:
        with ctx.forward_batch(Batch([hit], "prefill")):
            pass
    except RuntimeError as error:
        print("nested forward_batch:", f"RuntimeError: {error}")
print("after forward_batch: ", active())

try:
    with ctx.forward_batch(batch):
        raise KeyError("a layer failed mid-forward")
except KeyError:
    pass
print("after a failed forward:", active())
