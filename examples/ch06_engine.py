# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 6: the engine, one batch forward and sampling
#
# The `Engine` owns the model, the KV pool (sized to a memory budget), the page table and the
# sampler, and runs one prepared batch at a time. We size its pool, let it refuse a request
# that can never fit, run a hand-assembled batch of four prompts (the stage 1 milestone's loop),
# and then look at sampling: first the sampler alone on a five-word vocabulary, then the model
# continuing one prompt greedily and with temperature, top-k and top-p.

# %%
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer
from transformers.utils import logging as hf_logging

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig, Sampler
from minisgl.utils import RequestTooLongError, exit_on_error

ROOT = (
    Path(__file__).resolve().parent.parent
    if "__file__" in globals()  # a script
    else Path.cwd().parent
    if Path.cwd().name == "examples"
    else Path.cwd()
)  # a notebook
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
sys.path.insert(0, str(ROOT / "examples"))
from stage1_milestone import generate_hand_batched  # noqa: E402  (the milestone's loop)

KV_CACHE_GIB = 0.25  # a small budget: the pool gets as many pages as fit in it
SEED = 42


# %% [markdown]
# ## The engine and its limits
#
# With `num_pages` unset, the pool takes as many pages as fit in `kv_cache_gib`.
# `check_request_fits` refuses, with a clear message, a request that could never be served.


# %%
def build_engine() -> Engine:
    engine = Engine(
        EngineConfig(
            MODEL, kv_cache_gib=KV_CACHE_GIB, max_running_req=8, seed=SEED, show_progress=False
        )
    )
    c = engine.model_config
    print(
        f"model: {Path(MODEL).name}, {c.num_layers} layers, vocab {c.vocab_size}, "
        f"{engine.dtype} on {engine.device}"
    )
    print(
        f"KV pool: {KV_CACHE_GIB} GiB / {engine.kv_bytes_per_token:,} bytes per token = "
        f"{engine.num_pages:,} pages of {engine.page_size} token(s); "
        f"max_seq_len {engine.max_seq_len}"
    )
    for prompt_len, max_tokens in [(1000, 24), (6000, 24), (8190, 24)]:
        try:
            engine.check_request_fits(prompt_len, max_tokens)
            print(f"  prompt {prompt_len} + max_tokens {max_tokens}: fits")
        except RequestTooLongError as error:
            print(f"  prompt {prompt_len} + max_tokens {max_tokens}: refused: {error}")
    return engine


# %% [markdown]
# ## A hand-assembled batch
#
# One prefill step computes all four prompts at once; every decode step then adds one token
# to each request.


# %%
def greedy_batch(engine: Engine, tokenizer) -> None:  # noqa: ANN001 - a transformers tokenizer
    prompts = [
        "The capital of France is",
        "The three primary colors are",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea,",
    ]
    ids = [tokenizer.encode(p) for p in prompts]
    start = time.perf_counter()
    outputs, log = generate_hand_batched(engine, ids, SamplingParams(max_tokens=24))
    elapsed = time.perf_counter() - start
    print("\n".join(log[:2] + ["    ..."]))
    for prompt, out in zip(prompts, outputs):
        print(f"{prompt!r} -> {tokenizer.decode(out)!r}")
    total = sum(len(o) for o in outputs)
    print(
        f"{len(prompts)} requests, {total} tokens in {len(log)} steps, {elapsed:.2f} s: "
        f"{total / elapsed:.1f} tokens/s"
    )


# %% [markdown]
# ## The sampler on its own
#
# Five words with fixed logits, 10,000 rows per setting in one seeded call. Temperature
# sharpens (< 1) or flattens (> 1) the softmax; top-k keeps the k likeliest words; top-p keeps
# the likeliest words until they hold top_p of the probability mass.


# %%
def sampler_alone() -> None:
    words = ["cat", "dog", "fish", "bird", "ant"]
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0])
    print(f"{'setting':<26}" + "".join(f"{w:>7}" for w in words))
    print(f"{'softmax(logits)':<26}" + "".join(f"{p:7.3f}" for p in logits.softmax(-1)))
    draws = 10_000
    settings = {
        "greedy": SamplingParams(),
        "temperature 0.5": SamplingParams(temperature=0.5),
        "temperature 2.0": SamplingParams(temperature=2.0),
        "top_k 2": SamplingParams(temperature=1.0, top_k=2),
        "top_p 0.8": SamplingParams(temperature=1.0, top_p=0.8),
    }
    for name, params in settings.items():
        sampler = Sampler(torch.device("cpu"), len(words), SEED)
        reqs = [Req(torch.tensor([0], dtype=torch.int32), 0, 0, 1, i, params) for i in range(draws)]
        args = sampler.prepare(Batch(reqs, "decode"))
        tokens = sampler.sample(logits.repeat(draws, 1), args)
        freq = torch.bincount(tokens, minlength=len(words)) / draws
        print(f"{name:<26}" + "".join(f"{f:7.3f}" for f in freq))


# %% [markdown]
# ## The model, sampled
#
# The same prompt under each setting. The sampler is re-seeded before each run, so running a
# setting twice gives the same text; greedy ignores the seed.


# %%
def model_samples(engine: Engine, tokenizer) -> None:  # noqa: ANN001
    ids = [tokenizer.encode("My favourite animal is")]
    settings = {
        "greedy": SamplingParams(max_tokens=16),
        "temperature 0.8": SamplingParams(temperature=0.8, max_tokens=16),
        "temperature 1.2, top_k 20": SamplingParams(temperature=1.2, top_k=20, max_tokens=16),
        "temperature 1.0, top_p 0.9": SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16),
    }
    for name, params in settings.items():
        runs = []
        for _ in range(2):
            engine.sampler = Sampler(engine.device, engine.model_config.vocab_size, SEED)
            runs.append(generate_hand_batched(engine, ids, params)[0][0])
        same = "same both runs" if runs[0] == runs[1] else "DIFFERENT"
        print(f"{name:<28} ({same}): {tokenizer.decode(runs[0])!r}")


# %%
if __name__ == "__main__":
    hf_logging.set_verbosity_error()  # keep the captured output to our own lines
    with exit_on_error():
        engine = build_engine()
        tokenizer = AutoTokenizer.from_pretrained(MODEL)
        print()
        greedy_batch(engine, tokenizer)
        print()
        sampler_alone()
        print()
        model_samples(engine, tokenizer)
