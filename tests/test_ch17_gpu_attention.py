"""Chapter 17 tests: the host side of the FlashInfer backend, on the CPU.

CI has no GPU and no flashinfer, so `FakeFlashInfer` below stands in for the flashinfer module:
its two wrappers keep FlashInfer's contract (plan(...) with the batch's CSR lists once, then
run(q, (k pages, v pages)) in every layer; a wrapper built for CUDA graphs copies the plan
into the fixed buffers it was given and insists on its batch size) and compute paged attention
in plain torch from exactly the lists that were planned, as FlashInfer's kernels would. With it
the engine runs `FlashInferBackend` on the CPU, and wrong page lists give wrong tokens.
The page lists are also checked against a walk over the page table, token by token.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from functools import partial

import pytest
import torch
from conftest import TINY_MODELS, greedy, guarded_llm, require_model

from minisgl.attention.fi import gather_page_indices, page_lists
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.attention import ATTENTION_BACKENDS
from minisgl.attention.fi import create_flashinfer_backend

MODEL = TINY_MODELS["qwen3"]


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
    k_pages, v_pages = paged_kv  # [pages, page_size, kv_heads, head_dim]
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


class FakePrefillWrapper:
    """flashinfer.BatchPrefillWithPagedKVCacheWrapper's contract, in plain torch."""

    def __init__(self, workspace: torch.Tensor, kv_layout: str, backend: str, log: list) -> None:
        assert kv_layout == "NHD"
        self.log, self.planned = log, None

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
        lists = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
        self.planned = [t.tolist() for t in lists] + [causal]  # plan copies what it is given

    def run(self, q: torch.Tensor, paged_kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert self.planned is not None, "run before plan"
        self.log.append(("prefill", "run"))
        return paged_attention(q, paged_kv, *self.planned)


class FakeDecodeWrapper:
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper's contract, in plain torch. With
    use_cuda_graph, plan copies into the fixed buffers and run reads them (as a replayed graph
    does), and the batch size is the fixed buffer's."""

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
        self.log, self.use_cuda_graph = log, use_cuda_graph
        self.buffers = (
            paged_kv_indptr_buffer,
            paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer,
        )
        self.planned: tuple[torch.Tensor, ...] | None = None

    def plan(
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
    ) -> None:
        self.log.append(("graph decode" if self.use_cuda_graph else "decode", "plan"))
        if not self.use_cuda_graph:
            self.planned = (indptr.clone(), indices.clone(), last_page_len.clone())
            return
        indptr_buf, indices_buf, last_buf = self.buffers
        if len(last_page_len) != len(last_buf):  # FlashInfer's own check
            raise ValueError(
                f"the batch size should be fixed in cudagraph mode: {len(last_page_len)} rows "
                f"planned, {len(last_buf)} in the buffers"
            )
        indptr_buf.copy_(indptr)
        indices_buf[: len(indices)].copy_(indices)
        last_buf.copy_(last_page_len)
        self.planned = self.buffers

    def run(self, q: torch.Tensor, paged_kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert self.planned is not None, "run before plan"
        self.log.append(("graph decode" if self.use_cuda_graph else "decode", "run"))
        indptr, indices, last_page_len = (t.tolist() for t in self.planned)
        assert len(q) == len(last_page_len), "one query per planned request"
        qo_indptr = list(range(len(q) + 1))
        return paged_attention(q, paged_kv, qo_indptr, indptr, indices, last_page_len, False)


class FakeFlashInfer:
    """A stand-in for the flashinfer module: its two paged wrappers, logging plans and runs."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []  # (wrapper, "plan" | "run"), in order
        self.BatchPrefillWithPagedKVCacheWrapper = partial(FakePrefillWrapper, log=self.log)
        self.BatchDecodeWithPagedKVCacheWrapper = partial(FakeDecodeWrapper, log=self.log)


def use_fake_flashinfer(monkeypatch: pytest.MonkeyPatch, fake: FakeFlashInfer) -> None:
    """Make the engine's "flashinfer" backend a FlashInferBackend over `fake`."""
    entry = ATTENTION_BACKENDS["flashinfer"]
    build = partial(create_flashinfer_backend, wrappers=fake)
    monkeypatch.setitem(ATTENTION_BACKENDS, "flashinfer", replace(entry, create=build))


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


@pytest.fixture
def fake() -> FakeFlashInfer:
    return FakeFlashInfer()


def hand_engine(
    monkeypatch: pytest.MonkeyPatch, fake: FakeFlashInfer, backend: str, page_size: int
) -> Engine:
    use_fake_flashinfer(monkeypatch, fake)
    return Engine(
        EngineConfig(
            str(require_model(MODEL)),
            device="cpu",  # the stand-ins are CPU code, whatever the machine
            attention_backend=backend,
            page_size=page_size,
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


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_logits_equal_the_torch_backend_and_each_batch_is_planned_once(monkeypatch, fake, phase):
    """The same hand-built batch (on a cached prefix) through both backends. The wrapper of
    the batch's phase is planned once, before the layers, and run once in every layer."""
    seq_lens = [13, 7, 24]
    cached = [0, 3, 8] if phase == "prefill" else [n - 1 for n in seq_lens]
    logits = {}
    for backend in ("torch", "flashinfer"):
        engine = hand_engine(monkeypatch, fake, backend, page_size=4)
        fill_pool(engine)
        batch = hand_batch(engine, seq_lens, cached, phase)
        engine.prepare_batch(batch)
        with torch.inference_mode():
            logits[backend] = engine.run_model(batch)
    torch.testing.assert_close(logits["flashinfer"], logits["torch"], atol=1e-4, rtol=1e-4)
    layers = engine.model_config.num_layers
    assert fake.log == [(phase, "plan")] + [(phase, "run")] * layers


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
