# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Stage 1 milestone: a hand-assembled batch through the Engine
#
# No scheduler yet: we play its part by hand. Each request gets a row of the page table and a
# fixed, contiguous stretch of the KV pool (chapter 8 replaces this with paging). Then one
# prefill step computes every prompt at once, and decode steps add one token per request
# until each has its `max_tokens`.

# %%
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.scheduler import TableManager
from minisgl.utils import RequestTooLongError, exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))


def generate_hand_batched(
    engine: Engine, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], list[str]]:
    """Run all prompts as one batch: one prefill, then decode steps until every request is done.

    Returns each request's generated ids and a log line per step.
    """
    table = TableManager(engine.config.max_running_req, engine.page_table)
    reqs, next_free_slot = [], 0
    for uid, ids in enumerate(prompts):
        engine.check_request_fits(len(ids), params.max_tokens)
        span = len(ids) + params.max_tokens
        if next_free_slot + span > engine.kv_cache.num_slots:
            raise RequestTooLongError(
                f"the KV pool ({engine.kv_cache.num_slots} slots) cannot "
                f"hold all {len(prompts)} requests at once"
            )
        req = Req(
            torch.tensor(ids, dtype=torch.int32),
            table.allocate(),
            cached_len=0,
            output_len=params.max_tokens,
            uid=uid,
            sampling_params=params,
        )
        # Static reservation: this request owns slots [next_free_slot, next_free_slot + span).
        engine.page_table[req.table_idx, :span] = torch.arange(
            next_free_slot, next_free_slot + span
        )
        next_free_slot += span
        table.write_prompt(req)
        reqs.append(req)

    eos = set(engine.model_config.eos_token_ids)
    outputs: list[list[int]] = [[] for _ in prompts]
    log: list[str] = []
    batch = Batch(reqs, "prefill")
    while batch.reqs:
        table.prepare_inputs(batch)
        engine.prepare_batch(batch)
        output = engine.forward_batch(batch, engine.sampler.prepare(batch))
        table.write_next_tokens(batch, output.next_tokens_gpu)
        log.append(f"{batch.phase:>7}: {batch.size} requests, {len(batch.input_ids)} tokens")
        if output.copy_done_event is not None:
            output.copy_done_event.synchronize()
        for req, token in zip(batch.reqs, output.next_tokens_cpu.tolist()):
            req.complete_one()
            req.append_host(token)
            outputs[req.uid].append(token)
        running = [
            req
            for req in batch.reqs
            if req.can_decode and (params.ignore_eos or outputs[req.uid][-1] not in eos)
        ]
        for req in set(batch.reqs) - set(running):
            table.free(req.table_idx)
        batch = Batch(running, "decode")
    return outputs, log


def main() -> None:
    engine = Engine(EngineConfig(MODEL, max_running_req=8, num_pages=4096))  # checks MODEL first
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = [
        "The capital of France is",
        "The three primary colors are",
        "def fibonacci(n):",
        "Once upon a time, in a small village by the sea,",
    ]
    ids = [tokenizer.encode(p) for p in prompts]
    params = SamplingParams(max_tokens=24)
    start = time.perf_counter()
    outputs, log = generate_hand_batched(engine, ids, params)
    elapsed = time.perf_counter() - start
    print(
        f"model: {Path(MODEL).name}, {engine.model_config.num_layers} layers, "
        f"KV pool: {engine.kv_cache.num_slots} slots"
    )
    print("\n".join(log[:3] + ["    ..."] + log[-1:]))
    for prompt, out in zip(prompts, outputs):
        print(f"\n{prompt!r} -> {tokenizer.decode(out)!r}")
    total = sum(len(o) for o in outputs)
    print(
        f"\n{len(prompts)} requests, {total} generated tokens in {len(log)} steps, "
        f"{elapsed:.2f} s ({total / elapsed:.1f} tokens/s)"
    )


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
