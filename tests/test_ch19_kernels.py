"""Chapter 19 tests: the Triton kernels against the torch code they replace.

Without a GPU, Triton's interpreter runs the kernels: TRITON_INTERPRET=1 must be set before
`minisgl.kernels` is imported (its `@triton.jit` decides then), so this file sets it first and
keeps its shapes small. Each kernel's output is compared with the torch code of chapter 4 on the
same inputs, over shapes that hit the masks at block edges (head sizes that are not powers of
two, requests longer than one program's block, more requests than one program writes), GQA
layouts where k and v are views of one qkv tensor, and page tables with pages of several slots.
Last, a real scheduler runs with the kernels forced on the CPU and must produce transformers'
greedy tokens.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before minisgl.kernels imports triton's jit

import pytest
import torch
from conftest import TINY_MODELS, hf_greedy_cached, require_model, run_until_idle

from minisgl.core import Batch, Req, SamplingParams
from minisgl.kernels.kv_store import KernelKVCache, store_cache
from minisgl.kernels.step_inputs import KernelTableManager, prepare_inputs, write_next_tokens
from minisgl.kernels.step_inputs import REQUESTS_PER_PROGRAM, TOKENS_PER_PROGRAM
from minisgl.kvcache import MHAKVCache
from minisgl.scheduler import Scheduler, SchedulerConfig, TableManager

CPU = torch.device("cpu")


def random_pools(
    num_slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int
) -> tuple[MHAKVCache, MHAKVCache]:
    """Two identical 2-layer pools filled with noise, so a write to a wrong cell shows."""
    pools = [MHAKVCache(num_slots, 2, kv_heads, head_dim, dtype, CPU) for _ in range(2)]
    noise = torch.randn(
        2, num_slots, kv_heads, head_dim, generator=torch.Generator().manual_seed(seed)
    )
    for pool in pools:
        for layer in range(2):
            pool.k_cache(layer).copy_(noise[0])
            pool.v_cache(layer).copy_(-noise[1])
    return pools[0], pools[1]


def qkv_views(
    tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as the attention layer sees them: v a strided view of the fused qkv output,
    k a fresh contiguous tensor (as after the rotary embedding), so their strides differ."""
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed)).to(dtype)
    _, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return k.reshape(tokens, kv_heads, head_dim) * 2, v.view(tokens, kv_heads, head_dim)


@pytest.mark.parametrize(
    "tokens, heads, kv_heads, head_dim, dtype",
    [
        (1, 4, 2, 16, torch.float32),  # one decode token, GQA 4/2
        (7, 6, 3, 12, torch.float32),  # head_dim 12 in a block of 16: the mask matters
        (33, 8, 1, 20, torch.bfloat16),  # one KV head (MQA), bf16, a block of 32
        (64, 4, 4, 8, torch.float16),  # plain multi-head attention, a whole block
    ],
)
def test_store_kv_kernel_writes_what_the_torch_store_writes(
    tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    kernel_pool, torch_pool = random_pools(3 * tokens + 5, kv_heads, head_dim, dtype, seed=tokens)
    k, v = qkv_views(tokens, heads, kv_heads, head_dim, dtype, seed=head_dim)
    out_loc = torch.randperm(3 * tokens + 5, generator=torch.Generator().manual_seed(1))
    out_loc = out_loc[:tokens].to(torch.int32)  # the page table's dtype
    layer = 1
    store_cache(kernel_pool.k_cache(layer), kernel_pool.v_cache(layer), k, v, out_loc)
    torch_pool.store_kv(k, v, out_loc, layer)
    for layer_id in (0, 1):  # layer 0 must be untouched, layer 1 equal cell by cell
        assert torch.equal(kernel_pool.k_cache(layer_id), torch_pool.k_cache(layer_id))
        assert torch.equal(kernel_pool.v_cache(layer_id), torch_pool.v_cache(layer_id))
    assert torch.equal(kernel_pool.k_cache(layer)[out_loc.long()], k)


def paged_table(rows: int, row_len: int, page_size: int, seed: int) -> torch.Tensor:
    """A page table whose rows are random pages of `page_size` consecutive slots."""
    generator = torch.Generator().manual_seed(seed)
    pages_per_row = -(-row_len // page_size)
    pages = torch.randperm(rows * pages_per_row + 3, generator=generator)[: rows * pages_per_row]
    slots = pages.view(rows, pages_per_row, 1) * page_size + torch.arange(page_size)
    return slots.view(rows, -1)[:, :row_len].to(torch.int32).contiguous()


def table_pair(rows: int, row_len: int, page_size: int, seed: int) -> tuple[TableManager, ...]:
    """Two table managers over one paged table, with the same random token pool."""
    table = paged_table(rows, row_len, page_size, seed)
    tokens = torch.randint(0, 50_000, table.shape, generator=torch.Generator().manual_seed(seed))
    managers = (TableManager(rows, table), TableManager(rows, table))
    for manager in managers:
        manager.token_pool.copy_(tokens)
    return managers


def make_reqs(ledgers: list[tuple[int, int, int]]) -> list[Req]:
    """Requests from (table row, cached_len, device_len), each with 4 tokens left to sample."""
    return [
        Req(torch.arange(device, dtype=torch.int32), row, cached, 4, uid, SamplingParams())
        for uid, (row, cached, device) in enumerate(ledgers)
    ]


BLOCK = TOKENS_PER_PROGRAM
PREPARE_CASES = {
    # (row, cached_len, device_len) of each request
    "decode": [(5, 40, 41), (0, 2, 3), (3, 99, 100), (6, 0, 1)],
    "prefill at block edges": [(1, 0, BLOCK - 1), (4, 3, 3 + BLOCK), (2, 10, 11 + BLOCK)],
    "long after a prefix": [(7, BLOCK + 5, 3 * BLOCK + 2), (0, 0, 2)],
}


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("case", sorted(PREPARE_CASES))
def test_prepare_inputs_kernel_gathers_what_torch_gathers(case: str, page_size: int) -> None:
    kernel_table, torch_table = table_pair(8, 4 * BLOCK, page_size, seed=page_size)
    reqs = make_reqs(PREPARE_CASES[case])
    kernel_batch, torch_batch = Batch(reqs, "prefill"), Batch(reqs, "prefill")
    prepare_inputs(kernel_batch, kernel_table.token_pool, kernel_table.page_table)
    torch_table.prepare_inputs(torch_batch)
    for field in ("positions", "input_ids", "out_loc"):
        got, expected = getattr(kernel_batch, field), getattr(torch_batch, field)
        assert got.dtype == expected.dtype, f"{field}: {got.dtype} != {expected.dtype}"
        assert torch.equal(got, expected), f"{field} differs from the torch gather"


def test_write_next_tokens_kernel_writes_only_where_torch_writes() -> None:
    num_reqs = 2 * REQUESTS_PER_PROGRAM - 1  # two programs, the second one partly masked
    kernel_table, torch_table = table_pair(num_reqs + 2, 64, 1, seed=3)
    rows = torch.randperm(num_reqs + 2, generator=torch.Generator().manual_seed(4)).tolist()
    # every fifth request reached max_tokens (output_len 0): it samples no token, and its
    # row must keep the prompt token that sits at its device_len
    reqs = [
        Req(
            torch.arange(5 + i % 50, dtype=torch.int32),
            rows[i],
            0,
            4 * (i % 5 > 0),
            i,
            SamplingParams(),
        )
        for i in range(num_reqs)
    ]
    writers = [req for req in reqs if req.can_decode]
    assert REQUESTS_PER_PROGRAM < len(writers) < len(reqs)
    next_tokens = torch.randint(0, 50_000, (num_reqs,), generator=torch.Generator().manual_seed(5))
    batch = Batch(reqs, "decode")
    write_next_tokens(batch, next_tokens, kernel_table.token_pool)
    torch_table.write_next_tokens(batch, next_tokens)
    assert torch.equal(kernel_table.token_pool, torch_table.token_pool)
    last = writers[-1]
    assert kernel_table.token_pool[last.table_idx, last.device_len] == next_tokens[last.uid]


QWEN3 = TINY_MODELS["qwen3"]
ENGINE_PROMPTS = [[1, 15, 27, 300, 4, 19, 88], [1, 99, 7], [1, 8, 8, 8, 8, 8, 8, 2048, 5, 6, 7]]


@pytest.mark.parametrize("page_size", [1, 4])
def test_scheduler_with_the_kernels_forced_gives_transformers_greedy_tokens(
    page_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINISGL_KERNELS", "triton")  # what CUDA does by default, here on the CPU
    scheduler = Scheduler(
        SchedulerConfig(
            str(require_model(QWEN3)),
            device="cpu",  # the interpreter's home, even where there is a GPU
            num_pages=256,
            max_running_req=4,
            page_size=page_size,
            max_extend_tokens=8,  # a chunked prompt: one request of a step samples no token
            show_progress=False,
        )
    )
    assert isinstance(scheduler.engine.kv_cache, KernelKVCache)
    assert isinstance(scheduler.table_manager, KernelTableManager)
    uids = [
        scheduler.add_request(ids, SamplingParams(max_tokens=6, ignore_eos=True))
        for ids in ENGINE_PROMPTS
    ]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    for outputs in run_until_idle(scheduler):
        for out in outputs:
            tokens[out.uid].append(out.token)
    for uid, ids in zip(uids, ENGINE_PROMPTS):
        assert tokens[uid] == hf_greedy_cached(QWEN3, ids, 6), f"prompt {ids}"
