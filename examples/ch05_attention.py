# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 5: paged attention in plain PyTorch
#
# `TorchAttnBackend` gathers each request's keys and values from wherever the page table says
# they live in the KV pool, and attends with a causal mask by absolute position. We check it
# against dense attention written from the definition, for a prefill batch (one request with a
# cached prefix) and a decode batch, with SmolLM2's head shape (9 query heads sharing 3 KV
# heads), then show that where the slots sit in the pool changes nothing. Last, the real model:
# our layers, this backend and a scattered pool against transformers' logits.

# %%
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from minisgl.attention import TorchAttnBackend
from minisgl.core import Batch, Context, Req, SamplingParams
from minisgl.kvcache import MHAKVCache
from minisgl.models import ModelConfig, create_model, load_weights
from minisgl.scheduler.table import TableManager
from minisgl.utils import exit_on_error

ROOT = (
    Path(__file__).resolve().parent.parent
    if "__file__" in globals()  # a script
    else Path.cwd().parent
    if Path.cwd().name == "examples"
    else Path.cwd()
)  # a notebook
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2's attention shape
NUM_SLOTS, CPU = 512, torch.device("cpu")
# Float32 sums taken in another order (another kernel, CPU or thread count) differ in the last
# bits; a wrong slot or mask is off by order one. One attention layer stays within DENSE_ATOL,
# thirty layers of logits within LOGIT_ATOL.
DENSE_ATOL, LOGIT_ATOL = 1e-5, 1e-4


# %% [markdown]
# ## Against the definition
#
# The reference handles one request at a time: repeat each KV head for its group of query
# heads, then softmax(q k^T / sqrt(d)) where a query at position p sees keys at positions <= p.


# %%
def dense_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first_pos: int
) -> torch.Tensor:
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(q.shape[-1])
    query_pos = torch.arange(first_pos, first_pos + q.shape[0])
    future = torch.arange(keys.shape[0])[None, :] > query_pos[:, None]
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(future, -math.inf).softmax(-1), values)


def paged_vs_dense(
    ledgers: list[tuple[int, int]], phase: str, slots: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """ledgers: (device_len, cached_len) per request. Returns the backend's output and its
    max abs difference from the dense reference."""
    gen = torch.Generator().manual_seed(0)
    pool = MHAKVCache(NUM_SLOTS, 1, KV_HEADS, HEAD_DIM, torch.float32, CPU)
    page_table = torch.zeros(len(ledgers), 64, dtype=torch.int32)
    reqs, new_k, new_v, refs, queries = [], [], [], [], []
    for row, ((seq_len, cached), req_slots) in enumerate(
        zip(ledgers, slots.split([n for n, _ in ledgers]))
    ):
        k = torch.randn(seq_len, KV_HEADS, HEAD_DIM, generator=gen)
        v = torch.randn(seq_len, KV_HEADS, HEAD_DIM, generator=gen)
        q = torch.randn(seq_len - cached, HEADS, HEAD_DIM, generator=gen)
        page_table[row, :seq_len] = req_slots.to(torch.int32)
        pool.store_kv(k[:cached], v[:cached], req_slots[:cached], 0)  # the cached prefix
        reqs.append(
            Req(torch.zeros(seq_len, dtype=torch.int32), row, cached, 4, row, SamplingParams())
        )
        new_k.append(k[cached:]), new_v.append(v[cached:]), queries.append(q)
        refs.append(dense_attention(q, k, v, cached))
    batch = Batch(reqs, phase)
    batch.out_loc = torch.cat(
        [s[c:n] for s, (n, c) in zip(slots.split([n for n, _ in ledgers]), ledgers)]
    )
    backend = TorchAttnBackend(pool, page_table)
    backend.prepare_metadata(batch)
    if os.environ.get("MINISGL_CAPTURE_DIR") and phase == "prefill":  # for the site's figure
        meta = batch.attn_metadata
        Path(os.environ["MINISGL_CAPTURE_DIR"], "ch05_attention.gather_mask.json").write_text(
            json.dumps(
                {
                    "ledgers": ledgers,
                    "kv_indices": meta.kv_indices.tolist(),
                    "mask": meta.mask[:, 0].int().tolist(),
                }
            )
        )
    out = backend.forward(torch.cat(queries), torch.cat(new_k), torch.cat(new_v), 0, batch)
    return out, (out - torch.cat(refs)).abs().max().item()


def check_against_reference() -> None:
    cases = {
        "prefill": [(7, 0), (23, 0), (30, 18)],  # the last one has 18 tokens cached
        "decode": [(5, 4), (41, 40), (17, 16), (2, 1)],
    }
    for phase, ledgers in cases.items():
        total = sum(n for n, _ in ledgers)
        contiguous = torch.arange(total)
        scattered = torch.randperm(NUM_SLOTS, generator=torch.Generator().manual_seed(1))[:total]
        out_c, err_c = paged_vs_dense(ledgers, phase, contiguous)
        out_s, err_s = paged_vs_dense(ledgers, phase, scattered)
        within = f"< {DENSE_ATOL:g}"
        new_tokens = sum(n - c for n, c in ledgers)
        print(
            f"{phase:>7}: {len(ledgers)} requests (lengths {[n for n, _ in ledgers]}), "
            f"{new_tokens} new tokens"
        )
        print(
            f"         max |paged - dense| {within}: contiguous slots {err_c < DENSE_ATOL}, "
            f"scattered slots {err_s < DENSE_ATOL}"
        )
        print(f"         scattered == contiguous, bit for bit: {torch.equal(out_s, out_c)}")


# %% [markdown]
# ## The real model on a scattered pool
#
# Our chapter 3 model, run on this backend: two prompts prefilled in one batch on shuffled
# slots, then one decode step for both. Each request's last-token logits are compared with
# what transformers computes for the same tokens.


# %%
def real_model() -> None:
    config = ModelConfig.from_dir(MODEL)
    model = create_model(config, CPU, torch.float32)
    load_weights(model, MODEL, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()

    pool = MHAKVCache(
        1024, config.num_layers, config.num_kv_heads, config.head_dim, torch.float32, CPU
    )
    page_table = torch.zeros(2, 64, dtype=torch.int32)
    backend = TorchAttnBackend(pool, page_table)
    ctx, table = Context(1, pool, page_table, backend), TableManager(2, page_table)
    prompts = ["The capital of France is", "Paged attention lets a server"]
    reqs, free = [], torch.randperm(pool.num_slots).tolist()
    for uid, text in enumerate(prompts):
        ids = torch.tensor(tokenizer.encode(text), dtype=torch.int32)
        req = Req(ids, table.allocate(), 0, 8, uid, SamplingParams())
        page_table[req.table_idx, :64] = torch.tensor(free[:64])  # scattered slots
        free = free[64:]
        table.write_prompt(req)
        reqs.append(req)

    batch = Batch(reqs, "prefill")
    for step in range(2):
        table.prepare_inputs(batch)
        backend.prepare_metadata(batch)
        with torch.inference_mode(), ctx.forward_batch(batch):
            logits = model()
        next_tokens = logits.argmax(-1)
        table.write_next_tokens(batch, next_tokens)
        for req, logit, token in zip(reqs, logits, next_tokens.tolist()):
            with torch.inference_mode():
                expected = hf(req.input_ids[None].long()).logits[0, -1]
            close = (logit - expected).abs().max().item() < LOGIT_ATOL
            print(
                f"{batch.phase:>7} {tokenizer.decode(req.input_ids)!r:40} -> "
                f"{tokenizer.decode([token])!r:10} max |logits - transformers| < "
                f"{LOGIT_ATOL:g}: {close}, same argmax: {token == expected.argmax().item()}"
            )
            req.complete_one()
            req.append_host(token)
        batch = Batch(reqs, "decode")


# %%
if __name__ == "__main__":
    hf_logging.disable_progress_bar()  # keep the captured output to our own lines
    with exit_on_error():
        check_against_reference()
        print()
        real_model()
