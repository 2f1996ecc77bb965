# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 22: paged attention in Triton
#
# Our own kernels over minisgl's paged KV pool: a decode kernel that packs the query heads of
# a KV head into one program and cuts each context into chunks (split-KV), a merge of the
# chunks by their log-sum-exp, and a causal prefill kernel. Without a GPU, Triton's
# interpreter runs them on CPU tensors, so we can check each against chapter 5's torch
# backend, look at one request's partial results, and then generate text with
# `attention_backend="triton"`.

# %%
from __future__ import annotations

import json
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before minisgl.kernels imports triton's jit

from pathlib import Path

from minisgl.attention import TorchAttnBackend
from minisgl.attention.triton import TritonAttnBackend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kernels.paged_attention import (
    DEFAULT_DECODE,
    decode_attention,
    decode_partials,
    num_decode_splits,
)
from minisgl.kvcache import MHAKVCache
from minisgl.llm import LLM

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE = 6, 2, 16, 16  # 3 query heads per KV head
LENGTHS = [200, 37, 1]  # (device_len of) three decoding requests
TOLERANCE = 1e-5  # float32, summed in another order than torch's

# %% [markdown]
# ## A pool, a page table, three requests
#
# Random K/V in a one-layer pool; each request on random pages of 16 slots. Row 0 of the
# page table is request 0's, and so on: entry [row, pos] is the slot of token `pos`.

# %%
gen = torch.Generator().manual_seed(0)
pages_per_row = -(-max(LENGTHS) // PAGE_SIZE)
num_pages = len(LENGTHS) * pages_per_row + 1
pages = torch.randperm(num_pages, generator=gen)[: len(LENGTHS) * pages_per_row]
slots = pages.view(len(LENGTHS), pages_per_row, 1) * PAGE_SIZE + torch.arange(PAGE_SIZE)
page_table = slots.view(len(LENGTHS), -1).to(DEVICE, torch.int32)
pool = MHAKVCache(num_pages * PAGE_SIZE, 1, KV_HEADS, HEAD_DIM, torch.float32, DEVICE)
pool.k_cache(0).copy_(torch.randn(pool.k_cache(0).shape, generator=gen))
pool.v_cache(0).copy_(torch.randn(pool.v_cache(0).shape, generator=gen))
reqs = [
    Req(torch.zeros(n, dtype=torch.int32), row, n - 1, 4, row, SamplingParams())
    for row, n in enumerate(LENGTHS)
]
q = torch.randn(len(reqs), HEADS, HEAD_DIM, generator=gen).to(DEVICE)
print(f"requests of {LENGTHS} tokens, pages of {PAGE_SIZE}, {HEADS} query heads, {KV_HEADS} KV")
print("request 0's first pages:", (page_table[0, ::PAGE_SIZE][:4] // PAGE_SIZE).tolist())


def backend_output(backend: TorchAttnBackend | TritonAttnBackend, phase: str) -> torch.Tensor:
    """One layer of `backend` on the requests' new tokens (their K/V are already stored)."""
    batch = Batch(reqs, phase)
    batch.out_loc = torch.cat([page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs])
    k, v = pool.k_cache(0)[batch.out_loc.long()], pool.v_cache(0)[batch.out_loc.long()]
    backend.prepare_metadata(batch)
    return backend.forward(queries[phase], k, v, 0, batch)


queries = {"decode": q}

# %% [markdown]
# ## Decode: split-KV against the torch backend
#
# The same decode through chapter 5's torch backend (gather, pad, mask, SDPA) and through our
# two kernels, with 1, 3 and 8 chunks per context. Eight chunks of request 2's single token
# leave seven empty: they must change nothing.

# %%
reference = backend_output(TorchAttnBackend(pool, page_table), "decode")
rows = torch.arange(len(reqs), dtype=torch.int32, device=DEVICE)
seq_lens = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
for splits in (1, 3, 8):
    out = decode_attention(q, pool.k_cache(0), pool.v_cache(0), page_table, rows, seq_lens, splits)
    close = torch.allclose(out, reference, atol=TOLERANCE, rtol=0)
    print(f"{splits} split(s): equal to the torch backend within {TOLERANCE:g}: {close}")

# %% [markdown]
# ## One request's partials, and how they merge
#
# With 4 splits, request 0 (200 tokens) is cut into chunks of ceil(200 / 4) = 50 tokens,
# rounded up to the kernel's block of 64 keys: [0, 64), [64, 128), [128, 192), [192, 200).
# Each chunk's program writes its output (a softmax over the chunk alone) and its LSE; the
# merge weighs chunk s by exp(lse_s - max lse), normalised, which is exactly the share of the
# whole softmax that falls in the chunk.

# %%
SPLITS = 4
partial_out, partial_lse = decode_partials(
    q, pool.k_cache(0), pool.v_cache(0), page_table, rows, seq_lens, SPLITS
)
block = DEFAULT_DECODE.block_n
chunk = -(-(-(-LENGTHS[0] // SPLITS)) // block) * block
bounds = [(min(s * chunk, LENGTHS[0]), min((s + 1) * chunk, LENGTHS[0])) for s in range(SPLITS)]
lse = partial_lse[0, 0].cpu()
weights = torch.softmax(lse, 0)  # exp(lse_s - max) / sum: the merge's weights
print("request 0, query head 0:")
print(f"{'chunk':>12}{'LSE':>8}{'weight':>8}")
for (start, end), value, weight in zip(bounds, lse.tolist(), weights.tolist()):
    print(f"{f'[{start}, {end})':>12}{value:>8.3f}{weight:>8.3f}")
merged = (weights[:, None] * partial_out[0, 0, :, :HEAD_DIM].cpu()).sum(0)
unsplit = reference[0, 0].cpu()
close = torch.allclose(merged, unsplit, atol=TOLERANCE, rtol=0)
print(f"merged by hand equals one softmax over all 200 keys within {TOLERANCE:g}: {close}")
if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws the chunks and their weights
    Path(os.environ["MINISGL_CAPTURE_DIR"], "ch22_paged_attention.splits.json").write_text(
        json.dumps(
            {
                "seq_len": LENGTHS[0],
                "block_n": block,
                "bounds": bounds,
                "lse": [round(x, 4) for x in lse.tolist()],
                "weights": [round(x, 4) for x in weights.tolist()],
            }
        )
    )

# %% [markdown]
# ## How many chunks: enough programs to fill the GPU
#
# Without splitting, a decode launches batch x KV heads programs. For Qwen3-0.6B (8 KV heads)
# on an H200 (132 SMs) the heuristic asks for two programs per SM; it reads no length, so a
# CUDA graph of each batch size keeps one grid.

# %%
print(f"{'batch':>6}{'splits':>8}{'programs':>10}")
for batch_size in (1, 4, 16, 33, 64, 256):
    splits = num_decode_splits(batch_size, 8, 132)
    print(f"{batch_size:>6}{splits:>8}{batch_size * 8 * splits:>10}")

# %% [markdown]
# ## Prefill: new tokens over a cached prefix, causally
#
# Now the requests are prefills: request 0 has 190 of its 200 tokens cached and computes 10,
# request 1 computes all 37 (no prefix), request 2 its single token.

# %%
for req, cached in zip(reqs, (190, 0, 0)):
    req.cached_len = cached
extend = sum(r.extend_len for r in reqs)
queries["prefill"] = torch.randn(extend, HEADS, HEAD_DIM, generator=gen).to(DEVICE)
torch_prefill = backend_output(TorchAttnBackend(pool, page_table), "prefill")
triton_prefill = backend_output(TritonAttnBackend(pool, page_table, KV_HEADS), "prefill")
close = torch.allclose(triton_prefill, torch_prefill, atol=TOLERANCE, rtol=0)
print(f"prefill of {extend} new tokens: equal to the torch backend within {TOLERANCE:g}: {close}")

# %% [markdown]
# ## The engine on attention_backend="triton"
#
# SmolLM2 (9 query heads, 3 KV heads of 64) with every attention layer on our kernels, against
# the torch backend: the same greedy text, token for token.

# %%
PROMPT = "The capital of France is"
texts = {}
for backend in ("torch", "triton"):
    with LLM(
        str(MODEL),
        attention_backend=backend,
        device=DEVICE.type,
        page_size=PAGE_SIZE,
        num_pages=64,
        max_running_req=2,
        show_progress=False,
    ) as llm:
        out = llm.generate([PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    texts[backend] = out["token_ids"]
    print(f"{backend:>7}: {PROMPT!r} -> {out['text']!r}")
print("same tokens:", texts["torch"] == texts["triton"])
