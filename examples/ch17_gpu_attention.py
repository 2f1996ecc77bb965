# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 17: FlashInfer's paged attention
#
# FlashInfer's kernels read the KV pool page by page; all they need is each batch described
# in CSR form (`kv_indptr`, `kv_indices`, `last_page_len`, and `qo_indptr` for a prefill),
# planned once per batch. We describe a hand-built batch on scattered pages, check that the
# backend's logits equal the torch backend's, then generate with both backends.
#
# On a machine with CUDA and flashinfer this runs FlashInfer's real kernels (in bfloat16). On
# the CPU, FlashInfer cannot run: a **test double** stands in for its two wrappers (the
# `FakeFlashInfer` of tests/test_ch17_gpu_attention.py), which computes paged attention in plain
# torch from exactly the lists that were planned. Your page lists are what it reads.

# %%
from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.llm import LLM

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
ON_GPU = torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None
PAGE_SIZE = 4
# request -> (pages it owns, in order, tokens, tokens already cached)
PLACEMENT = {"A": ([5, 2, 9], 10, 6), "B": ([0], 3, 0), "C": ([7, 3], 8, 0)}

if ON_GPU:
    print("CUDA and flashinfer found: FlashInfer's real kernels, bfloat16")
    fake = None
else:
    sys.path.insert(0, str(ROOT / "tests"))
    import pytest
    from test_ch17_gpu_attention import FakeFlashInfer, use_fake_flashinfer

    print("no GPU: FlashInfer's wrappers are the CPU test double FakeFlashInfer, float32")
    fake = FakeFlashInfer()
    use_fake_flashinfer(pytest.MonkeyPatch(), fake)  # the engine's "flashinfer" uses the double


def engine(backend: str) -> Engine:
    return Engine(
        EngineConfig(
            MODEL,
            attention_backend=backend,
            page_size=PAGE_SIZE,
            num_pages=16,
            max_running_req=4,
            max_seq_len=64,
            cuda_graph_max_bs=0,
            show_progress=False,
        )
    )


def hand_batch(target: Engine) -> Batch:
    """Requests A, B, C on the pages of PLACEMENT; the tokens after A's cached prefix."""
    gen = torch.Generator().manual_seed(0)
    reqs = []
    for row, (pages, n, cached) in enumerate(PLACEMENT.values()):
        slots = (torch.tensor(pages)[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE)).flatten()
        target.page_table[row, : len(slots)] = slots.to(target.device, torch.int32)
        ids = torch.randint(100, 5000, (n,), generator=gen, dtype=torch.int32)
        reqs.append(Req(ids, row, cached, 4, row, SamplingParams()))
    batch = Batch(reqs, "prefill")
    batch.input_ids = torch.cat([r.input_ids[r.cached_len :] for r in reqs]).to(target.device)
    positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
    batch.positions = positions.to(target.device)
    batch.out_loc = target.page_table[rows.to(target.device), batch.positions]
    return batch


# %% [markdown]
# ## A batch in CSR form
#
# A has 10 tokens on pages 5, 2, 9 (6 cached: this prefill computes 4); B has 3 tokens on
# page 0; C has 8 on pages 7, 3. The backend describes the batch from the ledgers and the
# page table.

# %%
fi_engine = engine("flashinfer")
batch = hand_batch(fi_engine)
described = fi_engine.attn_backend.describe(batch)
for name in ("qo_indptr", "kv_indptr", "kv_indices", "last_page_len"):
    print(f"{name:>14} = {getattr(described, name).tolist()}")
if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws the lists from this
    Path(os.environ["MINISGL_CAPTURE_DIR"], "ch17_gpu_attention.page_lists.json").write_text(
        json.dumps(
            {
                "page_size": PAGE_SIZE,
                "reqs": [
                    {"name": name, "tokens": n, "cached": cached}
                    for name, (_, n, cached) in PLACEMENT.items()
                ],
                **{
                    name: getattr(described, name).tolist()
                    for name in ("qo_indptr", "kv_indptr", "kv_indices", "last_page_len")
                },
            }
        )
    )

# %% [markdown]
# ## The same logits as the torch backend
#
# Both engines get the same random K/V in their pools (A's cached prefix must be there), then
# run the batch. FlashInfer's wrapper is planned once and run in every layer.


# %%
def logits_of(target: Engine) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    for layer in range(target.model_config.num_layers):
        for cache in (target.kv_cache.k_cache(layer), target.kv_cache.v_cache(layer)):
            cache.copy_(torch.randn(cache.shape, generator=gen).to(cache))
    hand = hand_batch(target)
    target.prepare_batch(hand)
    with torch.inference_mode():
        return target.run_model(hand).float()


ours, reference = logits_of(fi_engine), logits_of(engine("torch"))
error = ((ours - reference).norm() / reference.norm()).item()
bound = 10 ** math.ceil(math.log10(error))  # an order of magnitude: the digits vary by machine
print(f"logits vs the torch backend: relative error < {bound:g}")
print(f"next tokens: flashinfer {ours.argmax(-1).tolist()}, torch {reference.argmax(-1).tolist()}")
if fake is not None:
    plans = [call for call in fake.log if call[1] == "plan"]
    runs = [call for call in fake.log if call[1] == "run"]
    print(f"wrapper calls for this batch: {len(plans)} plan, {len(runs)} runs (one per layer)")

# %% [markdown]
# ## Generation with both backends
#
# Three prompts, greedy. In float32 on the CPU the tokens are the same; in bfloat16 on a
# GPU a near-tie may go either way (chapter 17's page reports the H200 numbers).

# %%
prompts = ["The capital of France is", "List three fruits:", "Water boils at"]
outputs = {}
for backend in ("torch", "flashinfer"):
    config = dict(page_size=PAGE_SIZE, num_pages=256, max_running_req=4, show_progress=False)
    with LLM(MODEL, attention_backend=backend, **config) as llm:
        start = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
        outputs[backend] = [out["token_ids"] for out in outs]
        print(f"{backend:>10}: {time.perf_counter() - start:.2f} s")
        if backend == "flashinfer":
            for prompt, out in zip(prompts, outs):
                print(f"{prompt!r:>28} -> {out['text']!r}")
same = sum(a == b for x, y in zip(outputs["flashinfer"], outputs["torch"]) for a, b in zip(x, y))
total = sum(len(ids) for ids in outputs["torch"])
print(f"tokens equal to the torch backend's: {same} of {total}")
auto = engine("auto").backend_name
print(f"attention_backend='auto' picks {auto!r} here ({fi_engine.device}, {fi_engine.dtype})")
