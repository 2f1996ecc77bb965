"""Chapter 17 tests: the host side of the FlashInfer backend, on the CPU.

CI has no GPU and no flashinfer, so `FakeFlashInfer` below stands in for the flashinfer module.
Its two wrappers keep FlashInfer's contract and refuse what FlashInfer refuses: plan(...) takes
the batch's CSR lists (int32 tensors, kept by reference as FlashInfer keeps them, not copied)
with the head counts, head size, page size and dtypes, and run(q, (k pages, v pages)) must agree
with that plan in every layer, with q contiguous; a wrapper built for CUDA graphs copies the
plan into the fixed buffers it was given and insists on its batch size (`fast_decode_plan`
plans such a wrapper again without writing its buffers, and only once plan has set it up). They
compute paged attention in plain torch from exactly what was planned, as FlashInfer's kernels
would, so wrong page lists give wrong tokens. The backend's step path (prepare_metadata,
forward) runs under a `HostSyncGuard` that records every call that would make the host wait for
the GPU (`.item()`, `.tolist()`, a tensor's truth value, `nonzero`, `repeat_interleave` without
`output_size`, ...): on a GPU each one stalls the step and ends the overlap of chapter 13, and
the tests demand none. The page lists are also checked against a walk over the page table, token
by token, and the gather on the meta device (tensors without data, standing in for a GPU's: a
host tensor mixed in raises).
"""

from __future__ import annotations

import itertools
import math
import random
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial, partialmethod, wraps
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY_MODELS, greedy, guarded_llm, require_model
from course.differential import Tolerance, assert_same_call, use_reference_stubs
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import minisgl
from minisgl.attention import ATTENTION_BACKENDS
from minisgl.attention.base import AttnSetup
from minisgl.attention import fi
from minisgl.attention.fi import (
    FlashInferBackend,
    create_flashinfer_backend,
    gather_page_indices,
    page_lists,
)
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.kvcache import MHAKVCache

MODEL = TINY_MODELS["qwen3"]


# ----- what a GPU step may not do: wait for the device -----------------------------------------

# Tensor methods whose result is a host value: the host waits for the device to compute it.
HOST_VALUE_METHODS = {
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "equal",
    "allclose",
    "is_nonzero",
}
# Ops whose output size depends on the data: the host reads it back to allocate the output.
DATA_DEPENDENT_OPS = {
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "unique_consecutive",
    "bincount",
}


def host_sync(func: Callable, args: tuple, kwargs: dict) -> str | None:
    """Why calling func(*args, **kwargs) makes the host wait for a GPU, or None."""
    name = getattr(func, "__name__", "")
    if name in HOST_VALUE_METHODS:
        return f"{name} reads a value back to the host"
    if name in DATA_DEPENDENT_OPS or (name == "where" and len(args) + len(kwargs) == 1):
        return f"{name} has an output size that depends on the data"
    if name == "repeat_interleave" and kwargs.get("output_size") is None:
        repeats = args[0] if len(args) == 1 else args[1] if len(args) > 1 else kwargs["repeats"]
        if isinstance(repeats, torch.Tensor):
            return "repeat_interleave without output_size reads the repeats' sum back to the host"
    if name in ("__getitem__", "__setitem__", "index_put", "index_put_"):
        index = args[1] if len(args) > 1 else kwargs.get("indices")
        masks = [t for t in tree_leaves(index) if isinstance(t, torch.Tensor)]
        if any(t.dtype in (torch.bool, torch.uint8) for t in masks):
            return f"{name} with a boolean mask has an output size that depends on the data"
    return None


MINISGL_DIR = Path(minisgl.__file__).parent


def student_line() -> str:
    """Where the engine's code made the current call: its innermost frame in minisgl."""
    frames = [f for f in traceback.extract_stack() if Path(f.filename).is_relative_to(MINISGL_DIR)]
    if not frames:
        return "outside minisgl"
    frame = frames[-1]
    return f"{Path(frame.filename).relative_to(MINISGL_DIR)}:{frame.lineno} `{frame.line}`"


class HostSyncError(RuntimeError):
    """A call that a CUDA graph capture refuses (the stream is capturing)."""


class HostSyncGuard(TorchFunctionMode):
    """Watches the torch calls of a region for host syncs (see `host_sync`).

    fatal: raise at the first one, as a CUDA graph capture does; otherwise record each one in
    `syncs` and let it run (the step path: a GPU runs it, slowly). Calls made inside
    `HostSyncGuard.library()` are FlashInfer's own (its planning on the host, its kernels on the
    device) and are not the engine's syncs.
    """

    library_depth = 0  # > 0 while a test double runs what the library runs

    def __init__(self, region: str, fatal: bool) -> None:
        super().__init__()
        self.region, self.fatal = region, fatal
        self.syncs: list[str] = []

    @staticmethod
    @contextmanager
    def library() -> Iterator[None]:
        HostSyncGuard.library_depth += 1
        try:
            yield
        finally:
            HostSyncGuard.library_depth -= 1

    def __torch_function__(
        self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        reason = None if HostSyncGuard.library_depth else host_sync(func, args, kwargs)
        if reason is not None:
            sync = f"{reason}, at {student_line()}"
            if self.fatal:
                raise HostSyncError(f"{self.region} cannot wait for the device: {sync}")
            self.syncs.append(sync)
        return func(*args, **kwargs)


# ----- the test double -------------------------------------------------------------------------


def paged_attention(
    q: torch.Tensor,
    paged_kv: tuple[torch.Tensor, torch.Tensor],
    qo_indptr: list[int],
    kv_indptr: list[int],
    kv_indices: list[int],
    last_page_len: list[int],
    causal: bool,
) -> torch.Tensor:
    """What FlashInfer's paged kernels compute, per request, from the planned lists alone.

    Request r's keys are the slots of pages kv_indices[kv_indptr[r]:kv_indptr[r + 1]], all of
    them but the last page's unused tail: (pages - 1) * page_size + last_page_len[r] keys. Its
    queries are rows qo_indptr[r]:qo_indptr[r + 1] of q, aligned to the end of its keys (causal).
    """
    k_pages, v_pages = paged_kv  # [pages, page_size, kv_heads, head_dim], checked by the plan
    page_size, group = k_pages.shape[1], q.shape[1] // k_pages.shape[2]
    out = torch.empty_like(q)
    for r in range(len(last_page_len)):
        pages = kv_indices[kv_indptr[r] : kv_indptr[r + 1]]
        kv_len = (len(pages) - 1) * page_size + last_page_len[r]
        keys = k_pages[pages].flatten(0, 1)[:kv_len].repeat_interleave(group, dim=1)
        values = v_pages[pages].flatten(0, 1)[:kv_len].repeat_interleave(group, dim=1)
        queries = q[qo_indptr[r] : qo_indptr[r + 1]]
        scores = torch.einsum("qhd,khd->hqk", queries, keys) / math.sqrt(q.shape[-1])
        if causal:
            query_pos = kv_len - len(queries) + torch.arange(len(queries))
            scores = scores.masked_fill(torch.arange(kv_len) > query_pos[:, None], float("-inf"))
        out[qo_indptr[r] : qo_indptr[r + 1]] = torch.einsum(
            "hqk,khd->qhd", scores.softmax(-1), values
        )
    return out


@dataclass
class Plan:
    """What a wrapper was planned with, checked against every run's tensors."""

    qo_indptr: torch.Tensor | None  # None for decode: one query per request
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    causal: bool

    def __post_init__(self) -> None:
        names = ("qo_indptr", "kv_indptr", "kv_indices", "last_page_len")
        for name in names:
            tensor = getattr(self, name)
            if tensor is not None and tensor.dtype != torch.int32:
                raise TypeError(
                    f"plan: {name} must be int32 (FlashInfer's index type), got {tensor.dtype}"
                )

    def check_run(self, q: torch.Tensor, paged_kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Raise as FlashInfer's run does when q or the KV pages disagree with the plan."""
        if not q.is_contiguous():  # the kernels index q by its shape alone
            raise ValueError(f"run: q must be contiguous, got strides {q.stride()}")
        if q.dtype != self.q_dtype:
            raise ValueError(f"run: q is {q.dtype}, the plan said {self.q_dtype}")
        if tuple(q.shape[1:]) != (self.num_qo_heads, self.head_dim):
            raise ValueError(
                f"run: q is {list(q.shape)}, the plan said [tokens, {self.num_qo_heads} heads, "
                f"head_dim {self.head_dim}]"
            )
        rows = len(self.last_page_len) if self.qo_indptr is None else int(self.qo_indptr[-1])
        if len(q) != rows:
            raise ValueError(f"run: q has {len(q)} rows, the plan has {rows} queries")
        pages_shape = (self.page_size, self.num_kv_heads, self.head_dim)
        for name, pages in zip(("k", "v"), paged_kv):
            if pages.dtype != self.kv_dtype:
                raise ValueError(
                    f"run: the {name} cache is {pages.dtype}, the plan said {self.kv_dtype}"
                )
            if tuple(pages.shape[1:]) != pages_shape:
                raise ValueError(
                    f"run: the {name} pages are {list(pages.shape)}, the plan said [pages, "
                    f"page_size {self.page_size}, {self.num_kv_heads} KV heads, head_dim "
                    f"{self.head_dim}]"
                )

    def attend(self, q: torch.Tensor, paged_kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The kernel: checks the run, then reads the planned tensors as they are now."""
        self.check_run(q, paged_kv)
        qo_indptr = list(range(len(q) + 1)) if self.qo_indptr is None else self.qo_indptr.tolist()
        lists = (self.kv_indptr.tolist(), self.kv_indices.tolist(), self.last_page_len.tolist())
        return paged_attention(q, paged_kv, qo_indptr, *lists, self.causal)


def data_type(dtype: torch.dtype | None, default: torch.dtype) -> torch.dtype:
    return default if dtype is None else dtype


class FakePrefillWrapper:
    """flashinfer.BatchPrefillWithPagedKVCacheWrapper's contract, in plain torch."""

    def __init__(self, workspace: torch.Tensor, kv_layout: str, backend: str, log: list) -> None:
        assert kv_layout == "NHD"
        self.device, self.log = workspace.device, log
        self.planned: Plan | None = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        causal: bool = False,
        q_data_type: torch.dtype | None = None,
        kv_data_type: torch.dtype | None = None,
        non_blocking: bool = True,
    ) -> None:
        self.log.append(("prefill", "plan"))
        q_dtype = data_type(q_data_type, torch.float16)  # FlashInfer's defaults
        # Like FlashInfer, keep the tensors (moved to the device: on the CPU, the same tensors).
        to_device = partial(torch.Tensor.to, device=self.device, non_blocking=non_blocking)
        self.planned = Plan(
            *map(to_device, (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)),
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            page_size,
            q_dtype,
            data_type(kv_data_type, q_dtype),
            causal,
        )

    def run(self, q: torch.Tensor, paged_kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert self.planned is not None, "run before plan"
        self.log.append(("prefill", "run"))
        with HostSyncGuard.library():
            return self.planned.attend(q, paged_kv)


class FakeDecodeWrapper:
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper's contract, in plain torch. With
    use_cuda_graph, plan copies into the fixed buffers and run reads them (as a replayed graph
    does), and the batch size is the fixed buffer's. The split of the work that plan computes
    holds for the pages per request it was planned with (kv_indptr): a run over buffers that
    say otherwise raises, where FlashInfer's kernels would read the wrong pages."""

    def __init__(
        self,
        workspace: torch.Tensor,
        kv_layout: str,
        log: list,
        use_tensor_cores: bool = False,
        use_cuda_graph: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
    ) -> None:
        assert kv_layout == "NHD"
        self.device, self.log, self.use_cuda_graph = workspace.device, log, use_cuda_graph
        self.buffers = (
            paged_kv_indptr_buffer,
            paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer,
        )
        self.planned: Plan | None = None
        self.split_for: list[int] = []  # the kv_indptr of the last plan (graphs)

    def _plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        q_data_type: torch.dtype | None = None,
        kv_data_type: torch.dtype | None = None,
        non_blocking: bool = True,
        *,
        fast: bool,
    ) -> None:
        """plan, or (fast) flashinfer.fast_decode_plan: the same plan, for a wrapper that plan
        has set up, leaving a graph wrapper's fixed buffers as they are (its caller writes
        them)."""
        if fast and self.planned is None:  # FlashInfer's fails on the missing set-up
            raise AttributeError("fast_decode_plan: the wrapper was never planned with plan")
        self.log.append(("graph decode" if self.use_cuda_graph else "decode", "plan"))
        q_dtype = data_type(q_data_type, torch.float16)  # FlashInfer's defaults
        plan = partial(
            Plan,
            None,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            q_dtype=q_dtype,
            kv_dtype=data_type(kv_data_type, q_dtype),
            causal=False,
        )
        if not self.use_cuda_graph:
            # Like FlashInfer, keep the tensors (moved to the device: on the CPU, the same ones).
            to_device = partial(torch.Tensor.to, device=self.device, non_blocking=non_blocking)
            self.planned = plan(*map(to_device, (indptr, indices, last_page_len)))
            return
        plan(indptr, indices, last_page_len)  # checks the index types
        indptr_buf, indices_buf, last_buf = self.buffers
        if len(last_page_len) != len(last_buf):  # FlashInfer's own check
            raise ValueError(
                f"the batch size should be fixed in cudagraph mode: {len(last_page_len)} rows "
                f"planned, {len(last_buf)} in the buffers"
            )
        with HostSyncGuard.library():
            if not fast:
                indptr_buf.copy_(indptr)
                indices_buf[: len(indices)].copy_(indices)
                last_buf.copy_(last_page_len)
            self.split_for = indptr.tolist()
        self.planned = plan(*self.buffers)

    plan = partialmethod(_plan, fast=False)

    def run(self, q: torch.Tensor, paged_kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert self.planned is not None, "run before plan"
        self.log.append(("graph decode" if self.use_cuda_graph else "decode", "run"))
        with HostSyncGuard.library():
            if self.use_cuda_graph and self.buffers[0].tolist() != self.split_for:
                raise ValueError(
                    f"run: the buffers hold kv_indptr {self.buffers[0].tolist()}, but this "
                    f"wrapper's work was split for {self.split_for}: plan again when the pages "
                    "per request change"
                )
            return self.planned.attend(q, paged_kv)


class FakeFlashInfer:
    """A stand-in for the flashinfer module: its two paged wrappers, logging plans and runs,
    and the host syncs of the backends built over it (`use_fake_flashinfer`)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []  # (wrapper, "plan" | "run"), in order
        self.syncs: list[str] = []  # the step path's host syncs, each with where it happened
        self.BatchPrefillWithPagedKVCacheWrapper = partial(FakePrefillWrapper, log=self.log)
        self.BatchDecodeWithPagedKVCacheWrapper = partial(FakeDecodeWrapper, log=self.log)

    @staticmethod
    def fast_decode_plan(wrapper: FakeDecodeWrapper, *args: Any, **kwargs: Any) -> None:
        wrapper._plan(*args, fast=True, **kwargs)

    def watch(self, step: Callable) -> Callable:
        """`step` recording its host syncs into self.syncs."""

        @wraps(step)
        def watched(*args: Any, **kwargs: Any) -> Any:
            guard = HostSyncGuard(step.__name__, fatal=False)
            try:
                with guard:
                    return step(*args, **kwargs)
            finally:
                self.syncs += [f"{step.__name__}: {sync}" for sync in guard.syncs]

        return watched


# The backend's methods that run at every step, on the host, ahead of the GPU.
STEP_PATH = ("prepare_metadata", "forward", "prepare_for_graph")


def use_fake_flashinfer(monkeypatch: pytest.MonkeyPatch, fake: FakeFlashInfer) -> None:
    """Make the engine's "flashinfer" backend a FlashInferBackend over `fake`, its step path
    watched for host syncs."""
    entry = ATTENTION_BACKENDS["flashinfer"]

    def create(setup: AttnSetup) -> Any:
        backend = create_flashinfer_backend(setup, wrappers=fake)
        for name in STEP_PATH:
            setattr(backend, name, fake.watch(getattr(backend, name)))
        return backend

    # features.ATTENTION_BACKENDS finds the entry at this name of its module at each lookup.
    monkeypatch.setattr(fi, "FLASHINFER_BACKEND", replace(entry, create=create))


# ----- page lists ------------------------------------------------------------------------------


def random_placement(
    seq_lens: list[int], page_size: int, num_pages: int, seed: int
) -> tuple[torch.Tensor, list[int]]:
    """A page table with each request (row 2i + 1) on random distinct pages of a pool of
    num_pages; the rows."""
    rng = random.Random(seed)
    rows = [2 * i + 1 for i in range(len(seq_lens))]
    table = torch.full((2 * len(seq_lens) + 1, 64), -1, dtype=torch.int32)
    pages = rng.sample(range(num_pages), sum(-(-n // page_size) for n in seq_lens))
    for row, n in zip(rows, seq_lens):
        for pos in range(n):
            if pos % page_size == 0:
                page = pages.pop()
            table[row, pos] = page * page_size + pos % page_size
    return table, rows


def gather_arguments(
    seq_lens: list[int], page_size: int, seed: int
) -> tuple[tuple[Any, ...], list[int], list[int]]:
    """Requests on random pages and random table rows, in any order: gather_page_indices'
    arguments as the backend passes them (int64 rows, int32 counts and offsets), and the
    requests' rows and lengths in that order."""
    table, rows = random_placement(seq_lens, page_size, 1000, seed=seed)
    order = random.Random(seed).sample(range(len(rows)), len(rows))
    rows, seq_lens = [rows[i] for i in order], [seq_lens[i] for i in order]
    lists = page_lists(seq_lens, seq_lens, page_size)
    args = (
        table,
        torch.tensor(rows),
        torch.tensor(lists.num_pages, dtype=torch.int32),
        torch.tensor(lists.kv_indptr, dtype=torch.int32),
        lists.kv_indptr[-1],
        page_size,
    )
    return args, rows, seq_lens


def pages_by_walking(table: torch.Tensor, row: int, seq_len: int, page_size: int) -> list[int]:
    """A request's pages in order, from the slot of every one of its tokens."""
    pages: list[int] = []
    for pos in range(seq_len):
        page = int(table[row, pos]) // page_size
        if not pages or pages[-1] != page:
            pages.append(page)
    return pages


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_lists_match_a_walk_over_the_page_table(page_size):
    rng = random.Random(page_size)
    seq_lens = [rng.randint(1, 60) for _ in range(6)] + [page_size, 2 * page_size]
    extend_lens = [rng.randint(1, n) for n in seq_lens]
    table, rows = random_placement(seq_lens, page_size, 1000, seed=page_size)
    walked = [pages_by_walking(table, row, n, page_size) for row, n in zip(rows, seq_lens)]

    lists = page_lists(seq_lens, extend_lens, page_size)

    assert lists.num_pages == [len(p) for p in walked]
    assert lists.kv_indptr == [sum(len(p) for p in walked[:i]) for i in range(len(walked) + 1)]
    assert lists.qo_indptr == [sum(extend_lens[:i]) for i in range(len(seq_lens) + 1)]
    # The last page's slots in use: the tokens that fall on it.
    in_last_page = [
        sum(int(table[row, pos]) // page_size == pages[-1] for pos in range(n))
        for row, n, pages in zip(rows, seq_lens, walked)
    ]
    assert lists.last_page_len == in_last_page
    got = gather_page_indices(
        table,
        torch.tensor(rows),
        torch.tensor(lists.num_pages),
        torch.tensor(lists.kv_indptr),
        lists.kv_indptr[-1],
        page_size,
    )
    assert got.dtype == torch.int32
    assert got.tolist() == [page for pages in walked for page in pages]


@settings(max_examples=60)
@given(
    rows=st.lists(st.tuples(st.integers(1, 200), st.integers(1, 200)), max_size=12),
    page_size=st.sampled_from([1, 2, 4, 16, 64]),
)
def test_page_lists_of_any_batch_follow_the_documented_formulas(rows, page_size):
    seq_lens = [seq for seq, _ in rows]
    extend_lens = [min(new, seq) for seq, new in rows]
    lists = page_lists(seq_lens, extend_lens, page_size)
    pages = [-(-n // page_size) for n in seq_lens]
    assert lists.num_pages == pages, "a request of n tokens fills div_ceil(n, page_size) pages"
    assert lists.kv_indptr == [sum(pages[:i]) for i in range(len(rows) + 1)], (
        "kv_indptr starts at 0 and adds up num_pages"
    )
    assert lists.qo_indptr == [sum(extend_lens[:i]) for i in range(len(rows) + 1)], (
        "qo_indptr starts at 0 and adds up extend_lens"
    )
    assert lists.last_page_len == [n - (p - 1) * page_size for n, p in zip(seq_lens, pages)]
    assert all(1 <= used <= page_size for used in lists.last_page_len), (
        "a last page holds between 1 and page_size slots in use, never 0"
    )


@settings(max_examples=30)
@given(
    seq_lens=st.lists(st.integers(1, 64), min_size=1, max_size=6),
    page_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_gather_page_indices_of_any_placement_without_waiting(seq_lens, page_size, seed):
    """Requests on random pages and random table rows, the tensors typed as the backend
    passes them (int64 rows, int32 counts and offsets): the walked pages, int32, no sync."""
    args, rows, seq_lens = gather_arguments(seq_lens, page_size, seed)
    table = args[0]
    walked = [pages_by_walking(table, row, n, page_size) for row, n in zip(rows, seq_lens)]
    with HostSyncGuard("gather_page_indices", fatal=True):
        got = gather_page_indices(*args)
    assert got.dtype == torch.int32, f"kv_indices are {got.dtype}: FlashInfer takes int32"
    assert got.tolist() == [page for pages in walked for page in pages]


class OneDevice(TorchFunctionMode):
    """Refuses any torch call whose tensors live on more than one device (0-d host tensors,
    Python scalars in disguise, aside): on a GPU such a call fails, or copies and waits."""

    def __torch_function__(
        self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        tensors = [t for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)]
        devices = {t.device for t in tensors if t.dim() > 0}
        if len(devices) > 1:
            raise RuntimeError(
                f"{getattr(func, '__name__', func)} mixes tensors on {sorted(map(str, devices))}"
                f", at {student_line()}"
            )
        return func(*args, **(kwargs or {}))


META = torch.device("meta")  # tensors without data: a GPU's stand-in that a host tensor can't join


def test_gather_page_indices_stays_on_the_page_tables_device():
    table = torch.empty(8, 64, dtype=torch.int32, device=META)
    rows = torch.empty(3, dtype=torch.int64, device=META)
    counts = torch.empty(3, dtype=torch.int32, device=META)
    indptr = torch.empty(4, dtype=torch.int32, device=META)
    with OneDevice():
        got = gather_page_indices(table, rows, counts, indptr, 11, 4)
    assert got.device == META and got.dtype == torch.int32 and got.shape == (11,)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_prepare_metadata_leaves_the_kernels_inputs_on_the_device(phase):
    """A backend whose pool and page table live on the meta device: the planned pages and
    the metadata's last_indices (the LM head's index) must be device tensors too."""
    pool = MHAKVCache(64, 1, 2, 64, torch.bfloat16, META)
    table = torch.empty(4, 32, dtype=torch.int32, device=META)
    backend = FlashInferBackend(pool, table, 4, 4, 2, 64, wrappers=FakeFlashInfer())
    ids = [torch.arange(n, dtype=torch.int32) for n in (9, 3, 14)]
    reqs = [
        Req(t, row, len(t) - 1 if phase == "decode" else 0, 4, row, SamplingParams())
        for row, t in enumerate(ids)
    ]
    batch = Batch(reqs, phase)
    with OneDevice():
        backend.prepare_metadata(batch)
    planned = batch.attn_metadata.wrapper.planned
    assert planned.kv_indices.device == META, "the pages must be gathered on the device"
    assert batch.attn_metadata.last_indices.device == META, "last_indices must be on the device"


@pytest.fixture
def fake() -> FakeFlashInfer:
    return FakeFlashInfer()


def hand_engine(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeFlashInfer,
    backend: str,
    page_size: int,
    dtype: torch.dtype = torch.float32,
) -> Engine:
    use_fake_flashinfer(monkeypatch, fake)
    return Engine(
        EngineConfig(
            str(require_model(MODEL)),
            device="cpu",  # the stand-ins are CPU code, whatever the machine
            attention_backend=backend,
            page_size=page_size,
            dtype=dtype,
            num_pages=64,
            max_running_req=4,
            max_seq_len=64,
            show_progress=False,
        )
    )


def hand_batch(engine: Engine, seq_lens: list[int], cached: list[int], phase: str) -> Batch:
    """Requests on random pages of the engine's page table, their new tokens in a batch."""
    table, rows = random_placement(seq_lens, engine.page_size, engine.num_pages, sum(seq_lens))
    engine.page_table[: len(rows)] = table[rows, : engine.page_table.shape[1]]
    gen = torch.Generator().manual_seed(0)
    reqs = [
        Req(
            torch.randint(10, 5000, (n,), generator=gen, dtype=torch.int32),
            i,
            c,
            4,
            i,
            SamplingParams(),
        )
        for i, (n, c) in enumerate(zip(seq_lens, cached))
    ]
    batch = Batch(reqs, phase)
    batch.input_ids = torch.cat([r.input_ids[r.cached_len :] for r in reqs])
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    rows_of_tokens = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
    batch.out_loc = engine.page_table[rows_of_tokens, batch.positions]
    return batch


def fill_pool(engine: Engine) -> None:
    """The same random K/V in every engine's pool: the cached prefixes' keys and values."""
    gen = torch.Generator().manual_seed(0)
    for layer in range(engine.model_config.num_layers):
        for cache in (engine.kv_cache.k_cache(layer), engine.kv_cache.v_cache(layer)):
            cache.copy_(torch.randn(cache.shape, generator=gen))


# bfloat16 as on a GPU, where FlashInfer raises when q is not the dtype it was planned for. The
# logits' spread is about 1.6; bfloat16 sums in another order differ by a few of its steps.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (0.25, 0.02)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_logits_equal_the_torch_backend_and_each_batch_is_planned_once(
    monkeypatch, fake, phase, dtype
):
    """The same hand-built batch (on a cached prefix) through both backends. The wrapper of
    the batch's phase is planned once, before the layers, and run once in every layer, and
    the step never waits for the device."""
    seq_lens = [13, 7, 24]
    cached = [0, 3, 8] if phase == "prefill" else [n - 1 for n in seq_lens]
    logits = {}
    for backend in ("torch", "flashinfer"):
        engine = hand_engine(monkeypatch, fake, backend, page_size=4, dtype=dtype)
        fill_pool(engine)
        batch = hand_batch(engine, seq_lens, cached, phase)
        engine.prepare_batch(batch)
        with torch.inference_mode():
            logits[backend] = engine.run_model(batch)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(logits["flashinfer"], logits["torch"], atol=atol, rtol=rtol)
    layers = engine.model_config.num_layers
    assert fake.log == [(phase, "plan")] + [(phase, "run")] * layers
    assert fake.syncs == [], "the step waited for the device:\n" + "\n".join(fake.syncs)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_prepare_metadata_describes_once_and_stores_the_planned_wrapper(monkeypatch, fake, phase):
    engine = hand_engine(monkeypatch, fake, "flashinfer", page_size=4)
    backend = engine.attn_backend
    seq_lens = [13, 7, 24]
    cached = [0, 3, 8] if phase == "prefill" else [n - 1 for n in seq_lens]
    batch = hand_batch(engine, seq_lens, cached, phase)
    described = []
    real_describe = backend.describe

    def describe(*args: Any, **kwargs: Any) -> Any:
        described.append(real_describe(*args, **kwargs))
        return described[-1]

    monkeypatch.setattr(backend, "describe", describe)
    backend.prepare_metadata(batch)
    assert len(described) == 1, f"described the batch {len(described)} times, not once"
    meta = batch.attn_metadata
    expected = backend.prefill_wrapper if phase == "prefill" else backend.decode_wrapper
    assert meta.wrapper is expected, f"a {phase} batch runs the {phase} wrapper"
    assert fake.log == [(phase, "plan")]
    assert meta.wrapper.planned.kv_indices is described[0].kv_indices, "plan the described batch"
    ends = list(itertools.accumulate(n - c for n, c in zip(seq_lens, cached)))
    assert meta.last_indices.tolist() == [end - 1 for end in ends], (
        "last_indices: each request's last new token in the batch"
    )


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_forward_stores_first_then_runs_on_a_contiguous_q(monkeypatch, fake, phase):
    """One layer's forward on a strided q (a view of a wider tensor, as a fused projection
    gives) against the torch backend's: the new K/V stored once through the pool's store_kv
    at out_loc, and the new tokens attending to themselves."""
    seq_lens = [13, 7, 24]
    cached = [0, 3, 8] if phase == "prefill" else [n - 1 for n in seq_lens]
    outputs, pools, stores = {}, {}, []
    for backend in ("torch", "flashinfer"):
        engine = hand_engine(monkeypatch, fake, backend, page_size=4)
        fill_pool(engine)
        batch = hand_batch(engine, seq_lens, cached, phase)
        engine.attn_backend.prepare_metadata(batch)
        config = engine.model_config
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        gen = torch.Generator().manual_seed(1)
        tokens = len(batch.out_loc)
        q = torch.randn(tokens, heads, head_dim + 5, generator=gen)[..., :head_dim]
        k, v = torch.randn(2, tokens, kv_heads, head_dim, generator=gen)
        if backend == "flashinfer":
            real_store = engine.kv_cache.store_kv
            record = lambda *args: stores.append(args) or real_store(*args)  # noqa: E731
            monkeypatch.setattr(engine.kv_cache, "store_kv", record)
        forward = engine.attn_backend.forward
        outputs[backend] = forward(q if backend == "flashinfer" else q.contiguous(), k, v, 1, batch)
        pools[backend] = (engine.kv_cache.k_cache(1).clone(), engine.kv_cache.v_cache(1).clone())
    assert len(stores) == 1, f"store_kv called {len(stores)} times in one layer's forward"
    stored_k, stored_v, out_loc, layer = stores[0]
    assert layer == 1 and stored_k is k and stored_v is v and out_loc is batch.out_loc
    for name, got, want in zip("KV", pools["flashinfer"], pools["torch"]):
        assert torch.equal(got, want), f"the {name} pool differs after the forward"
    torch.testing.assert_close(outputs["flashinfer"], outputs["torch"], atol=1e-4, rtol=1e-4)


def prompts(count: int, seed: int) -> list[list[int]]:
    """Random prompts, every third one starting with a shared 21-token prefix (radix hits)."""
    rng = random.Random(seed)
    shared = [rng.randrange(10, 5000) for _ in range(21)]
    return [
        (shared if i % 3 == 0 else [])
        + [rng.randrange(10, 5000) for _ in range(rng.randint(2, 40))]
        for i in range(count)
    ]


@pytest.mark.parametrize(
    "config",
    [dict(page_size=4, max_extend_tokens=32), dict(page_size=1), dict(page_size=16)],
    ids=["page-4-chunked", "page-1", "page-16"],
)
def test_greedy_tokens_equal_the_torch_backend(monkeypatch, fake, config):
    """LLM.generate on tiny-qwen3 with the FlashInfer backend (the CPU stand-in) against the
    torch backend: prefills on cached prefixes, chunks, decodes, requests ending at different
    steps. Any wrong page list changes the tokens."""
    use_fake_flashinfer(monkeypatch, fake)
    batch = prompts(7, seed=sum(config.values()))
    params = [greedy(6 + 3 * i) for i in range(len(batch))]
    tokens = {}
    for backend in ("torch", "flashinfer"):
        llm = guarded_llm(
            require_model(MODEL),
            device="cpu",  # the stand-ins are CPU code, whatever the machine
            attention_backend=backend,
            num_pages=512,
            max_running_req=4,
            show_progress=False,
            **config,
        )
        with llm:
            tokens[backend] = [out["token_ids"] for out in llm.generate(batch, params)]
    assert ("decode", "plan") in fake.log and ("prefill", "plan") in fake.log
    assert tokens["flashinfer"] == tokens["torch"]
    assert fake.syncs == [], "the step waited for the device:\n" + "\n".join(fake.syncs)


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. The backend's stubs run over FakeFlashInfer, whose wrappers
# keep what they were planned with and log every plan and run: a plan of other lists, a plan
# too many, or a run of the wrong wrapper shows.

ROW_LEN = 64  # tokens of a page-table row: the longest request the tests place
DIFF_HEADS, DIFF_KV_HEADS, DIFF_HEAD_DIM = 4, 2, 8
PAGE_SIZES = [1, 2, 4, 16]
CPU_DEVICE = torch.device("cpu")
GREEDY = SamplingParams()
# describe() calls these two: the tests of the backend's methods run the reference's of them,
# so that each test compares one stub (yours of them have their own tests).
PAGE_LIST_STUBS = {"attention/fi.py:page_lists", "attention/fi.py:gather_page_indices"}


@st.composite
def page_batches(draw: st.DrawFn, max_reqs: int = 6) -> tuple[list[int], list[int], int]:
    """(seq_lens, extend_lens, page_size): lengths from 1 to a whole page-table row, many of
    them exactly at a page boundary or one token either side of it; new tokens from 1 to all."""
    page_size = draw(st.sampled_from(PAGE_SIZES))
    at_boundary = st.builds(
        lambda pages, offset: min(ROW_LEN, max(1, pages * page_size + offset)),
        st.integers(1, ROW_LEN // page_size),
        st.sampled_from([-1, 0, 1]),
    )
    seq_lens = draw(
        st.lists(
            st.one_of(st.integers(1, ROW_LEN), at_boundary, st.just(ROW_LEN)), max_size=max_reqs
        )
    )
    extend_lens = [draw(st.one_of(st.integers(1, n), st.just(n))) for n in seq_lens]
    return seq_lens, extend_lens, page_size


@settings(max_examples=50)
@given(batch=page_batches(max_reqs=10))
def test_page_lists_matches_the_reference(batch):
    """Empty batches too; every length class around a page's end."""
    seq_lens, extend_lens, page_size = batch
    assert_same_call(page_lists, seq_lens, extend_lens, page_size)


def placed_requests(
    seq_lens: list[int], page_size: int, seed: int
) -> tuple[torch.Tensor, list[int], int]:
    """A page table ([2n + 1, ROW_LEN] int32, -1 where no request is) with each request on
    random distinct pages of a pool just large enough, in random distinct rows; the rows and
    the pool's page count."""
    rng = random.Random(seed)
    pages_needed = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_needed) + 2
    table = torch.full((2 * len(seq_lens) + 1, ROW_LEN), -1, dtype=torch.int32)
    rows = rng.sample(range(len(table)), len(seq_lens))
    free = rng.sample(range(num_pages), sum(pages_needed))
    for row, n in zip(rows, seq_lens):
        for pos in range(n):
            if pos % page_size == 0:
                page = free.pop()
            table[row, pos] = page * page_size + pos % page_size
    return table, rows, num_pages


def gather_inputs(seq_lens: list[int], page_size: int, seed: int) -> tuple[Any, ...]:
    """gather_page_indices' arguments as the backend passes them: int64 rows, int32 page
    counts and offsets, on a table of random placements."""
    table, rows, _ = placed_requests(seq_lens, page_size, seed)
    num_pages = [-(-n // page_size) for n in seq_lens]
    kv_indptr = list(itertools.accumulate(num_pages, initial=0))
    return (
        table,
        torch.tensor(rows, dtype=torch.int64),
        torch.tensor(num_pages, dtype=torch.int32),
        torch.tensor(kv_indptr, dtype=torch.int32),
        kv_indptr[-1],
        page_size,
    )


@settings(max_examples=40)
@given(batch=page_batches(), seed=st.integers(0, 2**16))
def test_gather_page_indices_matches_the_reference(batch, seed):
    """Random pages and rows, requests up to a whole row, an empty batch too."""
    seq_lens, _, page_size = batch
    assert_same_call(gather_page_indices, *gather_inputs(seq_lens, page_size, seed))


@contextmanager
def small_workspace() -> Iterator[None]:
    """Backends built within hold a 1 KiB workspace: FakeFlashInfer never reads it, and both
    sides of a comparison build their own (128 MiB each, compared byte by byte, otherwise)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fi, "WORKSPACE_BYTES", 1024)
        yield


def backend_and_batch(
    seq_lens: list[int],
    cached_lens: list[int],
    phase: str,
    page_size: int,
    dtype: torch.dtype,
    seed: int,
) -> tuple[FlashInferBackend, Batch]:
    """A FlashInferBackend over FakeFlashInfer, its 2-layer pool filled with noise (and shown
    to the comparison as `kv_cache.buffer`; its last page is a spare one no request holds),
    and a batch of requests on random pages and rows with their input ids, positions and KV
    slots."""
    table, rows, num_pages = placed_requests(seq_lens, page_size, seed)
    slots = (num_pages + 1) * page_size
    pool = MHAKVCache(slots, 2, DIFF_KV_HEADS, DIFF_HEAD_DIM, dtype, CPU_DEVICE)
    pool.buffer = pool._buffer  # a public name: the comparison sees the pool's contents
    noise = torch.randn(pool.buffer.shape, generator=torch.Generator().manual_seed(seed))
    pool.buffer.copy_(noise)
    with small_workspace():
        backend = FlashInferBackend(
            pool, table, page_size, DIFF_HEADS, DIFF_KV_HEADS, DIFF_HEAD_DIM, FakeFlashInfer()
        )
    return backend, placed_batch(table, rows, seq_lens, cached_lens, phase, seed)


def placed_batch(
    table: torch.Tensor,
    rows: list[int],
    seq_lens: list[int],
    cached_lens: list[int],
    phase: str,
    seed: int,
) -> Batch:
    """A batch of requests of these lengths in these rows of the page table, with their
    input ids, positions and KV slots (the same prompt tokens for the same seed)."""
    gen = torch.Generator().manual_seed(seed)
    reqs = [
        Req(torch.randint(0, 1000, (n,), generator=gen, dtype=torch.int32), row, c, 4, uid, GREEDY)
        for uid, (row, n, c) in enumerate(zip(rows, seq_lens, cached_lens))
    ]
    batch = Batch(reqs, phase)
    empty = [torch.empty(0, dtype=torch.int64)]  # for a batch of no request
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs] + empty)
    rows_of_tokens = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs] + empty)
    batch.out_loc = table[rows_of_tokens, batch.positions]
    batch.input_ids = torch.cat([r.input_ids[r.cached_len :] for r in reqs] + empty).int()
    return batch


@st.composite
def flashinfer_batches(draw: st.DrawFn) -> dict[str, Any]:
    """backend_and_batch's arguments: 1 to 5 requests, prefills on no cached prefix, any, or
    all but the last token (one new token each, as a decode has), or decodes; every page
    size, float32 or bfloat16."""
    seq_lens, _, page_size = draw(page_batches(max_reqs=5).filter(lambda b: b[0]))
    phase = draw(st.sampled_from(["prefill", "decode"]))
    prefix = draw(st.sampled_from(["none", "any", "all but the last token"]))
    if phase == "decode" or prefix == "all but the last token":  # one new token each
        cached_lens = [n - 1 for n in seq_lens]
    elif prefix == "any":
        cached_lens = [draw(st.integers(0, n - 1)) for n in seq_lens]
    else:
        cached_lens = [0] * len(seq_lens)
    seed = draw(st.integers(0, 2**16))
    return dict(
        seq_lens=seq_lens,
        cached_lens=cached_lens,
        phase=phase,
        page_size=page_size,
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        seed=seed,
    )


@settings(max_examples=25)
@given(spec=flashinfer_batches())
def test_prepare_metadata_matches_the_reference(spec):
    """The metadata stored in the batch (last_indices, the wrapper and everything it was
    planned with) and the wrappers' log of plans."""
    with use_reference_stubs(17, only=PAGE_LIST_STUBS):
        assert_same_call(
            FlashInferBackend.prepare_metadata, build=lambda: backend_and_batch(**spec)
        )


# The chapter's other stubs, for planning the batches forward runs on: as the reference plans.
PLANNING = PAGE_LIST_STUBS | {"attention/fi.py:FlashInferBackend.prepare_metadata"}
FORWARD_TOLERANCE = {torch.float32: Tolerance(1e-5, 1e-5), torch.bfloat16: Tolerance(0.02, 0.02)}


@settings(max_examples=15)
@given(spec=flashinfer_batches(), layer_id=st.integers(0, 1))
def test_forward_matches_the_reference(spec, layer_id):
    """One layer's forward on a planned batch, q a strided view (as a fused projection gives):
    the attention output, the pool after the store (both layers), the wrappers' log."""

    def build() -> tuple:
        with use_reference_stubs(17, only=PLANNING):
            backend, batch = backend_and_batch(**spec)
            backend.prepare_metadata(batch)
        gen = torch.Generator().manual_seed(spec["seed"] + 1)
        tokens, dtype = len(batch.out_loc), spec["dtype"]
        q = torch.randn(tokens, DIFF_HEADS, DIFF_HEAD_DIM + 3, generator=gen).to(dtype)
        k, v = torch.randn(2, tokens, DIFF_KV_HEADS, DIFF_HEAD_DIM, generator=gen).to(dtype)
        return backend, q[..., :DIFF_HEAD_DIM], k, v, layer_id, batch

    tolerance = FORWARD_TOLERANCE[spec["dtype"]]
    assert_same_call(FlashInferBackend.forward, build=build, tolerance=tolerance)
