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

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import TINY_MODELS, hf_greedy_cached, require_model, run_until_idle
from course.differential import Tolerance, call_differences, reference_function
from course.differential import use_reference_stubs
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ch17_gpu_attention import HostSyncGuard, gather_arguments, gather_inputs, page_batches

from minisgl.attention.fi import gather_page_indices as torch_gather_page_indices
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kernels import kv_store, step_inputs
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


def padded_pools(
    num_slots: int, kv_heads: int, head_dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's K and V pools with each head and each slot padded, filled with noise: index
    them with [:, :kv_heads, :head_dim] for pools whose strides are not what their shape says."""
    generator = torch.Generator().manual_seed(seed)
    shape = (num_slots, kv_heads + 1, head_dim + 3)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


@settings(max_examples=15)
@given(
    tokens=st.integers(1, 6),
    kv_heads=st.integers(1, 3),
    head_dim=st.integers(1, 24),
    extra_slots=st.integers(0, 8),
    seed=st.integers(0, 2**16),
)
def test_store_cache_follows_every_tensors_own_strides(
    tokens, kv_heads, head_dim, extra_slots, seed
):
    """k and v both strided views, pools whose slot and head strides are padded: only the
    rows (out_loc[token], head) of each pool change, to exactly that token's k and v row."""
    num_slots = tokens + extra_slots
    padded = padded_pools(num_slots, kv_heads, head_dim, seed)
    expected = [pool.clone() for pool in padded]
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, 3, kv_heads, head_dim + 2, generator=gen)
    k, v = qkv[:, 1, :, :head_dim], qkv[:, 2, :, 1 : head_dim + 1]
    out_loc = torch.randperm(num_slots, generator=gen)[:tokens].to(torch.int32)
    store_cache(*(pool[:, :kv_heads, :head_dim] for pool in padded), k, v, out_loc)
    for name, pool, want, rows in zip("KV", padded, expected, (k, v)):
        want[out_loc.long(), :kv_heads, :head_dim] = rows
        assert torch.equal(pool, want), (
            f"the {name} pool differs from storing row (token, head) at (out_loc[token], head), "
            "with each tensor's own strides (padding cells must stay as they were)"
        )


def test_store_cache_refuses_layouts_it_cannot_store():
    k_pool, v_pool = (pool[:, :2, :8] for pool in padded_pools(4, 2, 8, seed=0))
    k = v = torch.randn(2, 2, 8)
    out_loc = torch.tensor([1, 3], dtype=torch.int32)
    with pytest.raises(ValueError):  # K and V pools of different layouts
        store_cache(k_pool, v_pool.contiguous(), k, v, out_loc)
    every_other = torch.randn(2, 2, 16)[:, :, ::2]  # head rows with stride 2
    with pytest.raises(ValueError):
        store_cache(k_pool, v_pool, every_other, v, out_loc)
    with pytest.raises(ValueError):
        store_cache(k_pool, v_pool, k, every_other, out_loc)


def test_store_cache_reaches_slots_past_two_to_the_31_elements():
    """A pool of 2**29 + 8 slots of 8 halves: slot 2**29 + 3 starts at element 2**32 + 24,
    which int32 arithmetic wraps to slot 3. The pool is allocated lazily: only the pages
    written are backed by memory."""
    slots = 2**29 + 8
    k_pool = torch.empty(slots, 1, 8, dtype=torch.float16)
    v_pool = torch.empty(slots, 1, 8, dtype=torch.float16)
    k_pool[3], v_pool[3] = 0.0, 0.0
    k, v = torch.ones(1, 1, 8, dtype=torch.float16), torch.full((1, 1, 8), 2.0, dtype=torch.float16)
    store_cache(k_pool, v_pool, k, v, torch.tensor([2**29 + 3], dtype=torch.int32))
    assert bool((k_pool[3] == 0).all() and (v_pool[3] == 0).all()), (
        "slot 2**29 + 3 went to slot 3: slot * stride overflowed int32 (load the slot as int64)"
    )
    assert torch.equal(k_pool[2**29 + 3], k[0]) and torch.equal(v_pool[2**29 + 3], v[0])


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


class Launches:
    """A kernel of step_inputs, watched: each launch's grid is recorded and runs as library
    code (the interpreter's own host work is not the step's); so is each make_device_tensor."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kernel_name: str) -> None:
        self.grids: list[tuple[int, ...]] = []
        self.copies: list[torch.dtype] = []
        kernel = getattr(step_inputs, kernel_name)
        monkeypatch.setattr(step_inputs, kernel_name, self.watched(kernel))
        real_copy = step_inputs.make_device_tensor

        def copy(data: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            self.copies.append(dtype)
            with HostSyncGuard.library():
                return real_copy(data, dtype, device)

        monkeypatch.setattr(step_inputs, "make_device_tensor", copy)

    def watched(self, kernel: Any) -> Any:
        launches = self

        class Watched:
            def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
                def launch(*args: Any, **kwargs: Any) -> None:
                    launches.grids.append(tuple(grid))
                    with HostSyncGuard.library():
                        kernel[grid](*args, **kwargs)

                return launch

        return Watched()


@st.composite
def ledgers(draw: st.DrawFn, max_reqs: int, rows: int) -> list[tuple[int, int, int]]:
    """(table row, cached_len, device_len) of requests on distinct rows, prefills and decodes."""
    count = draw(st.integers(1, max_reqs))
    table_rows = draw(st.permutations(range(rows)))[:count]
    result = []
    for row in table_rows:
        cached = draw(st.integers(0, 2 * BLOCK))
        extend = draw(st.sampled_from([1, 2, BLOCK - 1, BLOCK, BLOCK + 1]))
        result.append((row, cached, cached + extend))
    return result


@settings(max_examples=15)
@given(reqs=ledgers(max_reqs=5, rows=8), page_size=st.sampled_from([1, 4]))
def test_prepare_inputs_is_one_copy_one_launch_and_gathers_any_batch(
    reqs: list[tuple[int, int, int]], page_size: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        launches = Launches(patch, "prepare_inputs_kernel")
        kernel_table, torch_table = table_pair(8, 4 * BLOCK, page_size, seed=len(reqs))
        batch, expected = Batch(make_reqs(reqs), "prefill"), Batch(make_reqs(reqs), "prefill")
        with HostSyncGuard("prepare_inputs", fatal=True):
            prepare_inputs(batch, kernel_table.token_pool, kernel_table.page_table)
    torch_table.prepare_inputs(expected)
    longest = max(device - cached for _, cached, device in reqs)
    assert launches.copies == [torch.int32], (
        f"host-to-device copies made: {launches.copies}; pack the four numbers per request into "
        "one int32 tensor with make_device_tensor"
    )
    assert launches.grids == [(len(reqs), -(-longest // BLOCK))], (
        "one launch on its documented grid"
    )
    for field in ("positions", "input_ids", "out_loc"):
        got, want = getattr(batch, field), getattr(expected, field)
        assert got.dtype == want.dtype, f"{field}: {got.dtype} != {want.dtype}"
        assert torch.equal(got, want), f"{field} differs from the torch gather"


@settings(max_examples=15)
@given(
    remaining=st.lists(
        st.sampled_from([0, 0, 1, 4]), min_size=1, max_size=2 * REQUESTS_PER_PROGRAM
    ),
    seed=st.integers(0, 2**16),
)
def test_write_next_tokens_is_one_copy_one_launch_and_writes_only_decoding_requests(
    remaining: list[int], seed: int
) -> None:
    """uids unlike the batch positions; requests with nothing left to sample (remain_len 0)
    scattered anywhere, all of them included."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(len(remaining) + 2, generator=gen).tolist()
    reqs = [
        Req(
            torch.arange(3 + i % 40, dtype=torch.int32),
            rows[i],
            0,
            left,
            1000 - i,
            SamplingParams(),
        )
        for i, left in enumerate(remaining)
    ]
    next_tokens = torch.randint(0, 50_000, (len(reqs),), generator=gen)
    kernel_table, torch_table = table_pair(len(reqs) + 2, 48, 1, seed=seed)
    batch = Batch(reqs, "decode")
    with pytest.MonkeyPatch.context() as patch:
        launches = Launches(patch, "write_next_tokens_kernel")
        with HostSyncGuard("write_next_tokens", fatal=True):
            write_next_tokens(batch, next_tokens, kernel_table.token_pool)
    torch_table.write_next_tokens(batch, next_tokens)
    writers = sum(req.can_decode for req in reqs)
    assert torch.equal(kernel_table.token_pool, torch_table.token_pool), (
        "the token pool differs from writing next_tokens[i] at (table_idx, device_len) of each "
        "request i that can still decode"
    )
    if writers:
        assert launches.copies == [torch.int32], f"host-to-device copies: {launches.copies}"
        assert launches.grids == [(-(-writers // REQUESTS_PER_PROGRAM),)]
    else:
        assert launches.grids == [] and launches.copies == [], "nothing to write: no launch"


@settings(max_examples=20)
@given(
    seq_lens=st.lists(st.integers(1, 64), min_size=1, max_size=6),
    page_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_gather_page_indices_kernel_gathers_what_chapter_17_gathers(
    seq_lens: list[int], page_size: int, seed: int
) -> None:
    """Requests on random pages and rows, in any order, some with more pages than one program
    gathers (pages of 1, up to 64 of them, in blocks of 16 here): the same int32 list as
    chapter 17's torch gather, in one launch on its documented grid, without waiting."""
    args, rows, _ = gather_arguments(seq_lens, page_size, seed)
    table, total_pages = args[0], args[4]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_inputs, "PAGES_PER_BLOCK", 16)
        launches = Launches(patch, "gather_page_indices_kernel")
        with HostSyncGuard("gather_page_indices", fatal=True):
            got = step_inputs.gather_page_indices(*args)
    want = torch_gather_page_indices(*args)
    assert got.dtype == torch.int32 and got.tolist() == want.tolist()
    most = min(total_pages, -(-table.shape[1] // page_size))
    assert launches.grids == [(len(rows), -(-most // 16))], "one launch on its documented grid"


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


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# Each launcher and each kernel is compared with the reference's on generated inputs, one stub
# at a time. A launcher (yours and the reference's) launches the reference's kernel: the
# results, the arguments after (pools, token pool, the batch's tensors), and the launches
# (grids) and host-to-device copies (dtype, size) must match. A kernel (yours and the
# reference's) is launched by the reference's launcher: the results and the arguments after
# must match. The block constants are made small, so that small inputs cross block edges.


def stub_name(module: types.ModuleType, name: str) -> str:
    """A manifest's name of module.name: "kernels/kv_store.py:store_cache"."""
    return f"{module.__name__.removeprefix('minisgl.').replace('.', '/')}.py:{name}"


def where(module: types.ModuleType, name: str) -> str:
    return f"{name} (minisgl/{module.__name__.removeprefix('minisgl.').replace('.', '/')}.py)"


class LaunchRecorder:
    """A module's kernel, watched: each launch on a grid of at least one program is noted
    (a launch on an empty grid runs nothing: launching it or not is the same), and so is each
    host-to-device copy made with the module's make_device_tensor."""

    def __init__(self, patch: pytest.MonkeyPatch, module: types.ModuleType, kernel: str) -> None:
        self.events: list[str] = []
        real_kernel = getattr(module, kernel)
        recorder = self

        class Watched:
            def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
                grid = tuple(grid)
                if all(n > 0 for n in grid):
                    recorder.events.append(f"launch of {kernel} on grid {grid}")
                return real_kernel[grid]

        patch.setattr(module, kernel, Watched())
        if hasattr(module, "make_device_tensor"):
            real_copy = module.make_device_tensor

            def copy(data: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
                tensor = real_copy(data, dtype, device)
                recorder.events.append(f"copy of {tensor.numel()} {dtype} values")
                return tensor

            patch.setattr(module, "make_device_tensor", copy)

    def side(self) -> None:
        self.events.append("")  # a side of the comparison starts


@contextlib.contextmanager
def reference_kernel(module: types.ModuleType, kernel: str, chapter: int = 19) -> Iterator[None]:
    """Within the block, the module's kernel is the reference's (a stub of `chapter`)."""
    with use_reference_stubs(chapter, only={stub_name(module, kernel)}):
        yield


def assert_same_launcher(
    module: types.ModuleType,
    launcher: str,
    kernel: str,
    build: Callable[[], tuple],
    tolerance: Tolerance = Tolerance(),
) -> None:
    """Your launcher against the reference's, both launching the reference's kernel."""
    with reference_kernel(module, kernel), pytest.MonkeyPatch.context() as patch:
        recorder = LaunchRecorder(patch, module, kernel)
        stub = getattr(module, launcher)
        found = call_differences(
            stub, build=lambda: (recorder.side(), build())[1], tolerance=tolerance
        )
    yours, reference = split_sides(recorder.events)
    if yours != reference:
        found.append(f"launches and copies: yours {yours}, the reference's {reference}")
    if found:
        raise AssertionError(
            f"{where(module, launcher)} differs from the reference:\n  " + "\n  ".join(found)
        )


def split_sides(events: list[str]) -> tuple[list[str], list[str]]:
    """The events of the two sides (yours first), each begun by an empty marker."""
    starts = [i for i, event in enumerate(events) if event == ""]
    assert len(starts) == 2, f"expected two sides, got {len(starts)}"
    return events[starts[0] + 1 : starts[1]], events[starts[1] + 1 :]


def assert_same_kernel(
    module: types.ModuleType,
    kernel: str,
    launch: Callable[..., Any],
    build: Callable[[], tuple],
    tolerance: Tolerance = Tolerance(),
    chapter: int = 19,
) -> None:
    """Your kernel against the reference's, both launched by `launch` (a function that looks
    the kernel up in `module` when it runs: the reference's launcher), on build()'s inputs."""

    @functools.wraps(launch)
    def with_reference_kernel(*args: Any) -> Any:
        with reference_kernel(module, kernel, chapter):
            return launch(*args)

    found = call_differences(
        launch, build=build, reference=with_reference_kernel, tolerance=tolerance
    )
    if found:
        raise AssertionError(
            f"{where(module, kernel)} differs from the reference's kernel, both launched by the "
            "reference's launcher:\n  " + "\n  ".join(found)
        )


@st.composite
def kv_stores(draw: st.DrawFn, bad_layouts: bool = False) -> dict[str, Any]:
    """store_cache's inputs: 0 to 6 tokens, 1 to 3 KV heads, head sizes 1 to 24 (powers of two
    and not), float32/bfloat16/float16, pools contiguous or with padded slots and heads, k and
    v strided views of one qkv tensor; with bad_layouts, sometimes pools of two layouts or
    head rows that are not contiguous (which store_cache refuses)."""
    layout = "ok"
    if bad_layouts:
        layout = draw(st.sampled_from(["ok", "ok", "pools differ", "k strided", "v strided"]))
    return dict(
        tokens=draw(st.integers(0, 6)),
        kv_heads=draw(st.integers(1, 3)),
        head_dim=draw(st.one_of(st.integers(1, 24), st.sampled_from([8, 16]))),
        extra_slots=draw(st.integers(0, 6)),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16])),
        padded_pools=draw(st.booleans()),
        layout=layout,
        seed=draw(st.integers(0, 2**16)),
    )


def kv_store_inputs(
    tokens: int,
    kv_heads: int,
    head_dim: int,
    extra_slots: int,
    dtype: torch.dtype,
    padded_pools: bool,
    layout: str,
    seed: int,
) -> tuple:
    """(k_cache, v_cache, k, v, out_loc) from kv_stores' description, noise everywhere."""
    gen = torch.Generator().manual_seed(seed)
    slots = tokens + extra_slots + 1
    pad = (1, 3) if padded_pools else (0, 0)
    k_cache, v_cache = torch.randn(2, slots, kv_heads + pad[0], head_dim + pad[1], generator=gen)
    k_cache, v_cache = (c[:, :kv_heads, :head_dim].to(dtype) for c in (k_cache, v_cache))
    if layout == "pools differ":
        v_cache = torch.randn(slots, kv_heads + 1, head_dim, generator=gen).to(dtype)[:, 1:]
    qkv = torch.randn(tokens, 3, kv_heads, 2 * head_dim + 1, generator=gen).to(dtype)
    k, v = qkv[:, 1, :, :head_dim], qkv[:, 2, :, 1 : head_dim + 1]
    if layout == "k strided":
        k = qkv[:, 1, :, : 2 * head_dim : 2]
    if layout == "v strided":
        v = qkv[:, 2, :, : 2 * head_dim : 2]
    out_loc = torch.randperm(slots, generator=gen)[:tokens].to(torch.int32)
    return k_cache, v_cache, k, v, out_loc


@settings(max_examples=10)
@given(spec=kv_stores(bad_layouts=True))
def test_store_cache_matches_the_reference(spec):
    assert_same_launcher(
        kv_store, "store_cache", "store_kv_kernel", lambda: kv_store_inputs(**spec)
    )


@settings(max_examples=10)
@given(spec=kv_stores())
def test_store_kv_kernel_matches_the_reference(spec):
    assert_same_kernel(
        kv_store,
        "store_kv_kernel",
        reference_function(kv_store, "store_cache"),
        lambda: kv_store_inputs(**spec),
    )


# Blocks of these comparisons: small enough that small inputs cross block edges, large enough
# for few programs (the interpreter's time goes by the program, not by the block's size).
SMALL_BLOCKS = dict(TOKENS_PER_PROGRAM=16, REQUESTS_PER_PROGRAM=4, PAGES_PER_BLOCK=16)
SMALL_BLOCK = SMALL_BLOCKS["TOKENS_PER_PROGRAM"]


@contextlib.contextmanager
def small_blocks() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, size in SMALL_BLOCKS.items():
            patch.setattr(step_inputs, name, size)
        yield


TABLE_ROWS, TABLE_LEN = 6, 48


@st.composite
def step_batches(draw: st.DrawFn) -> dict[str, Any]:
    """1 to 4 requests on distinct rows of a TABLE_ROWS x TABLE_LEN table: cached prefixes of
    0 to 20 tokens, up to 3 blocks of new tokens (a block exactly, one past it), up to a whole
    row; pages of 1 or 4 slots."""
    count = draw(st.integers(1, 4))
    rows = draw(st.permutations(range(TABLE_ROWS)))[:count]
    ledgers = []
    for row in rows:
        cached = draw(st.integers(0, 20))
        extend = draw(
            st.one_of(
                st.integers(1, 2 * SMALL_BLOCK + 1),
                st.sampled_from([SMALL_BLOCK, SMALL_BLOCK + 1]),
                st.just(TABLE_LEN - cached),
            )
        )
        ledgers.append((row, cached, min(TABLE_LEN, cached + extend)))
    return dict(
        ledgers=ledgers,
        page_size=draw(st.sampled_from([1, 4])),
        dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        phase=draw(st.sampled_from(["prefill", "decode"])),
        seed=draw(st.integers(0, 2**16)),
    )


def step_inputs_of(
    ledgers: list, page_size: int, dtype: torch.dtype, phase: str, seed: int
) -> tuple:
    """prepare_inputs' arguments: a batch of the ledgers, a random token pool and a paged
    table, both of `dtype` (a TableManager's token pool is zeros_like its page table)."""
    table = paged_table(TABLE_ROWS, TABLE_LEN, page_size, seed).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    token_pool = torch.randint(0, 50_000, table.shape, generator=gen, dtype=dtype)
    return Batch(make_reqs(ledgers), phase), token_pool, table


@settings(max_examples=10)
@given(spec=step_batches())
def test_prepare_inputs_matches_the_reference(spec):
    with small_blocks():
        assert_same_launcher(
            step_inputs, "prepare_inputs", "prepare_inputs_kernel", lambda: step_inputs_of(**spec)
        )


@settings(max_examples=10)
@given(spec=step_batches())
def test_prepare_inputs_kernel_matches_the_reference(spec):
    with small_blocks():
        assert_same_kernel(
            step_inputs,
            "prepare_inputs_kernel",
            reference_function(step_inputs, "prepare_inputs"),
            lambda: step_inputs_of(**spec),
        )


@st.composite
def sampled_steps(draw: st.DrawFn) -> dict[str, Any]:
    """1 to 10 requests (up to 3 programs of writers), each with 0 (it samples no token), 1
    or more tokens left to sample, on distinct rows; uids unlike their batch positions."""
    remaining = draw(st.lists(st.sampled_from([0, 0, 1, 4]), min_size=1, max_size=10))
    return dict(remaining=remaining, seed=draw(st.integers(0, 2**16)))


def sampled_inputs(remaining: list[int], seed: int) -> tuple:
    """write_next_tokens' arguments: a decode batch, its sampled tokens, a random token pool."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randperm(len(remaining) + 2, generator=gen).tolist()
    reqs = [
        Req(torch.arange(3 + i % 7, dtype=torch.int32), rows[i], 0, left, 50 - i, SamplingParams())
        for i, left in enumerate(remaining)
    ]
    next_tokens = torch.randint(0, 50_000, (len(reqs),), generator=gen)
    token_pool = torch.randint(0, 50_000, (len(reqs) + 2, 24), generator=gen, dtype=torch.int32)
    return Batch(reqs, "decode"), next_tokens, token_pool


@settings(max_examples=10)
@given(spec=sampled_steps())
def test_write_next_tokens_matches_the_reference(spec):
    with small_blocks():
        assert_same_launcher(
            step_inputs,
            "write_next_tokens",
            "write_next_tokens_kernel",
            lambda: sampled_inputs(**spec),
        )


@settings(max_examples=10)
@given(spec=sampled_steps())
def test_write_next_tokens_kernel_matches_the_reference(spec):
    with small_blocks():
        assert_same_kernel(
            step_inputs,
            "write_next_tokens_kernel",
            reference_function(step_inputs, "write_next_tokens"),
            lambda: sampled_inputs(**spec),
        )


@settings(max_examples=10)
@given(batch=page_batches(max_reqs=5), seed=st.integers(0, 2**16))
def test_gather_page_indices_matches_the_reference(batch, seed):
    """Chapter 17's page lists (an empty batch too), requests up to a whole table row."""
    seq_lens, _, page_size = batch
    with small_blocks():
        assert_same_launcher(
            step_inputs,
            "gather_page_indices",
            "gather_page_indices_kernel",
            lambda: gather_inputs(seq_lens, page_size, seed),
        )


@settings(max_examples=10)
@given(
    batch=page_batches(max_reqs=5),
    seed=st.integers(0, 2**16),
    pages_per_block=st.sampled_from([1, 2, 16]),
)
def test_gather_page_indices_on_rows_that_end_inside_a_page_matches_the_reference(
    batch, seed, pages_per_block
):
    """The page table cut to the longest request, so that a row may end inside a page (the
    pages a row holds are its length over page_size, rounded up), with blocks of 1, 2 or 16
    pages."""
    seq_lens, _, page_size = batch

    def inputs() -> tuple:
        table, *rest = gather_inputs(seq_lens, page_size, seed)
        return (table[:, : max(seq_lens, default=1)].contiguous(), *rest)

    with small_blocks(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_inputs, "PAGES_PER_BLOCK", pages_per_block)
        assert_same_launcher(
            step_inputs, "gather_page_indices", "gather_page_indices_kernel", inputs
        )


@settings(max_examples=10)
@given(batch=page_batches(max_reqs=5), seed=st.integers(0, 2**16))
def test_gather_page_indices_kernel_matches_the_reference(batch, seed):
    seq_lens, _, page_size = batch
    with small_blocks():
        assert_same_kernel(
            step_inputs,
            "gather_page_indices_kernel",
            reference_function(step_inputs, "gather_page_indices"),
            lambda: gather_inputs(seq_lens, page_size, seed),
        )
