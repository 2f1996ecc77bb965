# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 19: Triton kernels for the KV store and the step's index work
#
# Three pieces of a step are many tiny torch operations: the KV store of every layer (two
# `index_copy_` and their index conversions), the gather of a step's positions, token ids and
# KV slots (one small tensor per request, then advanced indexing), and the write-back of the
# sampled tokens. Each becomes one Triton kernel. Without a GPU, Triton's interpreter runs them
# on CPU tensors, so we can check each against the torch code of chapter 4, print the grid it
# launches and how many lanes its masks switch off, and then run a tiny Qwen3 with the kernels
# forced on. On a GPU the main also times kernel against torch with CUDA events.

# %%
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before minisgl.kernels imports triton's jit

from pathlib import Path

import triton

from minisgl.benchmark import read_results_dir
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kernels.kv_store import KernelKVCache, store_cache
from minisgl.kernels.step_inputs import KernelTableManager, prepare_inputs, write_next_tokens
from minisgl.kernels.step_inputs import REQUESTS_PER_PROGRAM, TOKENS_PER_PROGRAM
from minisgl.kvcache import MHAKVCache
from minisgl.scheduler import Scheduler, SchedulerConfig, TableManager

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = ROOT / "models" / "tiny-qwen3"
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 12  # GQA, and a head that does not fill its block of 16


def seeded(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


# %% [markdown]
# ## The KV store: one program per (token, KV head)
#
# k is a fresh tensor (as after the rotary embedding), v a strided view of the fused qkv
# projection: the kernel reads each with its own strides. The torch pool below runs chapter 4's
# `store_kv`; the other pool gets the kernel. Both start from the same noise, so a write to a
# wrong cell would show as a difference anywhere in the pool.


# %%
def store_demo(tokens: int = 5, num_slots: int = 32) -> None:
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=DEVICE, generator=seeded(0))
    _, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    k, v = k.reshape(tokens, KV_HEADS, HEAD_DIM) * 2, v.view(tokens, KV_HEADS, HEAD_DIM)
    out_loc = torch.randperm(num_slots, device=DEVICE, generator=seeded(1))[:tokens].int()
    noise = torch.randn(num_slots, KV_HEADS, HEAD_DIM, device=DEVICE, generator=seeded(2))
    pools = [MHAKVCache(num_slots, 1, KV_HEADS, HEAD_DIM, torch.float32, DEVICE) for _ in (0, 1)]
    for pool in pools:
        pool.k_cache(0).copy_(noise)
        pool.v_cache(0).copy_(-noise)
    kernel_pool, torch_pool = pools
    store_cache(kernel_pool.k_cache(0), kernel_pool.v_cache(0), k, v, out_loc)
    torch_pool.store_kv(k, v, out_loc, 0)
    block = triton.next_power_of_2(HEAD_DIM)
    print(f"k {tuple(k.shape)} strides {k.stride()}, v strides {v.stride()} (a view of qkv)")
    print(f"out_loc = {out_loc.tolist()}")
    print(
        f"grid = (tokens, kv_heads) = ({tokens}, {KV_HEADS}): {tokens * KV_HEADS} programs, "
        f"BLOCK_DIM = {block}: {block - HEAD_DIM} of {block} lanes masked off in each"
    )
    changed = (kernel_pool.k_cache(0) != noise).sum() + (kernel_pool.v_cache(0) != -noise).sum()
    print(f"pool cells written: {changed.item()} (= 2 x {tokens} x {KV_HEADS} x {HEAD_DIM})")
    same = torch.equal(kernel_pool.k_cache(0), torch_pool.k_cache(0)) and torch.equal(
        kernel_pool.v_cache(0), torch_pool.v_cache(0)
    )
    print(f"kernel pool == torch pool: {same}")


store_demo()


# %% [markdown]
# ## The step's inputs: one program per (request, block of new tokens)
#
# A prefill batch: one request with a cached prefix and a prompt longer than one block, two
# short ones. Pages hold 4 slots. The host packs four numbers per request (row, cached_len,
# extend_len, where its tokens start in the batch) into one tensor; the kernel does the rest.


# %%
def paged_table(rows: int, row_len: int, page_size: int) -> torch.Tensor:
    pages_per_row = row_len // page_size
    pages = torch.randperm(rows * pages_per_row, device=DEVICE, generator=seeded(3))
    slots = pages.view(rows, pages_per_row, 1) * page_size + torch.arange(page_size, device=DEVICE)
    return slots.view(rows, row_len).int()


def step_demo() -> None:
    table = paged_table(rows=4, row_len=4 * TOKENS_PER_PROGRAM, page_size=4)
    managers = [TableManager(4, table) for _ in (0, 1)]
    tokens = torch.randint(0, 49_152, table.shape, device=DEVICE, generator=seeded(4)).int()
    for manager in managers:
        manager.token_pool.copy_(tokens)
    kernel_table, torch_table = managers
    ledgers = [(2, 6, 6 + TOKENS_PER_PROGRAM + 3), (0, 0, 5), (3, 17, 18)]  # row, cached, device
    reqs = [
        Req(torch.arange(device, dtype=torch.int32), row, cached, 4, uid, SamplingParams())
        for uid, (row, cached, device) in enumerate(ledgers)
    ]
    batches = [Batch(reqs, "prefill") for _ in (0, 1)]
    prepare_inputs(batches[0], kernel_table.token_pool, kernel_table.page_table)
    torch_table.prepare_inputs(batches[1])
    extend = [req.extend_len for req in reqs]
    blocks = triton.cdiv(max(extend), TOKENS_PER_PROGRAM)
    print(f"extend_lens = {extend}: grid = ({len(reqs)}, {blocks}), BLOCK = {TOKENS_PER_PROGRAM}")
    for req, n in zip(reqs, extend):
        active = [
            min(TOKENS_PER_PROGRAM, max(0, n - b * TOKENS_PER_PROGRAM)) for b in range(blocks)
        ]
        print(f"  request {req.uid} (row {req.table_idx}): active lanes per program {active}")
    kernel_batch = batches[0]
    print(f"positions[:8] = {kernel_batch.positions[:8].tolist()}")
    print(f"out_loc[:8]   = {kernel_batch.out_loc[:8].tolist()} (pages of 4 slots)")
    for field in ("positions", "input_ids", "out_loc"):
        same = torch.equal(getattr(batches[0], field), getattr(batches[1], field))
        print(f"kernel {field} == torch {field}: {same}")

    # after sampling: request 1's prompt is done, so it writes; mark request 2 as finished
    reqs[2].max_device_len = reqs[2].device_len
    sampled = torch.tensor([101, 202, 303], device=DEVICE)
    write_next_tokens(batches[0], sampled, kernel_table.token_pool)
    torch_table.write_next_tokens(batches[1], sampled)
    writers = sum(req.can_decode for req in reqs)
    print(
        f"write-back: {writers} of {len(reqs)} requests write, "
        f"{triton.cdiv(writers, REQUESTS_PER_PROGRAM)} program of {REQUESTS_PER_PROGRAM} lanes; "
        f"token pools equal: {torch.equal(kernel_table.token_pool, torch_table.token_pool)}"
    )


step_demo()


# %% [markdown]
# ## The engine with the kernels
#
# On CUDA the engine builds its KV pool and table manager with the kernels by default
# (`MINISGL_KERNELS=torch` keeps chapter 4's torch code). `MINISGL_KERNELS=triton` uses them on
# any device: here, on the CPU too, we compare the greedy tokens of a tiny Qwen3 with and
# without them. The switch is read when an engine is built.


# %%
def generate(kernels: str) -> list[list[int]]:
    os.environ["MINISGL_KERNELS"] = kernels  # read when the engine is built
    scheduler = Scheduler(
        SchedulerConfig(
            str(MODEL),
            num_pages=128,
            page_size=4,
            max_running_req=4,
            cuda_graph_max_bs=0,
            show_progress=False,
        )
    )
    del os.environ["MINISGL_KERNELS"]
    prompts = [[1, 15, 27, 300, 4], [1, 99, 7, 7, 7, 7, 7, 7, 7]]
    uids = [
        scheduler.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts
    ]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    while scheduler.has_work:
        for out in scheduler.step():
            tokens[out.uid].append(out.token)
    return [tokens[uid] for uid in uids]


with_kernels, with_torch = generate("triton"), generate("torch")
for i, (a, b) in enumerate(zip(with_kernels, with_torch)):
    print(f"prompt {i}: kernels {a}, torch {b}, equal: {a == b}")


# %% [markdown]
# ## On a GPU: how long does each take?
#
# CUDA events around many repetitions of each, after a warm-up that compiles the kernels:
# Qwen3-0.6B's KV shape (8 KV heads of 128, bf16) for one decode token and for a batch of
# 256, and the step inputs of 256 decoding requests.


# %%
def time_ms(fn, repeats: int = 200) -> float:  # noqa: ANN001 - a callable of no arguments
    """Mean device time of fn() in milliseconds (CUDA events)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def kernel_vs_torch(with_kernel, with_torch) -> tuple[float, float]:  # noqa: ANN001
    """Time the kernel version of a call, then chapter 4's torch one: (triton ms, torch ms)."""
    return time_ms(with_kernel), time_ms(with_torch)


def benchmark() -> list[tuple[str, float, float]]:
    """(what, triton ms, torch ms) of the three kernels at Qwen3-0.6B's shapes.

    The events time the device's timeline, gaps included: when the host cannot launch fast
    enough, the device waits, and that wait counts, as it does in a real step.
    """
    rows = []
    pools = [cls(65_536, 1, 8, 128, torch.bfloat16, DEVICE) for cls in (KernelKVCache, MHAKVCache)]
    for tokens in (1, 256):
        kv = torch.randn(tokens, 8, 128, device=DEVICE, dtype=torch.bfloat16)
        loc = torch.randperm(65_536, device=DEVICE)[:tokens].int()
        times = kernel_vs_torch(*[lambda p=p: p.store_kv(kv, kv, loc, 0) for p in pools])
        rows.append((f"store_kv, {tokens} tokens", *times))
    table = paged_table(rows=256, row_len=1024, page_size=16)
    managers = [cls(256, table) for cls in (KernelTableManager, TableManager)]
    reqs = [
        Req(torch.arange(513, dtype=torch.int32), row, 512, 64, row, SamplingParams())
        for row in range(256)
    ]
    batch = Batch(reqs, "decode")
    sampled = torch.zeros(256, dtype=torch.int64, device=DEVICE)
    times = kernel_vs_torch(*[lambda m=m: m.prepare_inputs(batch) for m in managers])
    rows.append(("prepare_inputs, 256 requests", *times))
    times = kernel_vs_torch(*[lambda m=m: m.write_next_tokens(batch, sampled) for m in managers])
    rows.append(("write_next_tokens, 256 requests", *times))
    return rows


if CUDA:
    for what, kernel_ms, torch_ms in benchmark():
        print(f"{what:34s} triton {kernel_ms * 1e3:8.1f} us   torch {torch_ms * 1e3:8.1f} us")
else:
    print("no CUDA here: the timings need a GPU (tests/test_gpu_kernels.py prints them)")


# %% [markdown]
# ## On an H200: where a decode step goes
#
# The committed results of `python -m benchmark decode-step --parts` (run by `benchmark/run_gpu.sh
# steps`): a Qwen3-0.6B-shaped model in bf16, with this chapter's kernels and CUDA graphs, at
# batch 1, 64 and 256 with 512-token contexts. "step" is the wall time of one scheduler step,
# "replay" the device time of the forward's graph; under it, the milliseconds of each part of
# the step by the step clock of `python -m benchmark offline`: scheduling the next batch (its pages,
# inputs and attention plan), launching it, waiting for the previous batch's tokens, and
# processing them. A step that waits is bound by the device; one that hardly waits, by the host.

# %%
results = ROOT / "benchmark" / "results"
steps = read_results_dir(results, on="H200", benchmark="decode_step", variant="graphs")
newest = max(r["date"] for r in steps)
print(f"$ {steps[-1]['command']}\n  {steps[-1]['machine']}, {newest[:10]}")
for row in (r for r in steps if r["date"][:16] == newest[:16]):
    batch = row["batch"]
    step_ms, replay_ms = row["step_s"] * 1e3, row["forward_s"] * 1e3
    rate = batch / row["step_s"]
    print(
        f"batch {batch:>3}: step {step_ms:.2f} ms, replay {replay_ms:.2f} ms, {rate:,.0f} tokens/s"
    )
    parts = read_results_dir(results, benchmark="decode_step_parts", batch=batch)
    for part in (p for p in parts if p["date"][:16] == newest[:16]):
        clock = ("schedule", "launch", "wait", "process")  # the step clock's parts, in order
        print("    " + ", ".join(f"{name} {part[f'{name}_ms']:.2f} ms" for name in clock))
