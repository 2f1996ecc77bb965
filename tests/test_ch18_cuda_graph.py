"""Chapter 18 tests: decode graphs, on the CPU.

`FakeGraph` stands in for `CudaGraph` and refuses what a CUDA graph refuses. Its capture runs the
forward once to warm up, then once more under chapter 17's `HostSyncGuard`, fatal there as a
real capture is (no `.item()`, no tensor truth value, no data-dependent op), noting every tensor
the forward reads that it did not make: the tensors the graph binds. A replay runs that same
forward again, writes the result into the captured output, and fails if the forward read any
tensor the capture did not bind: a CUDA graph replays the tensors it captured, so a fixed input
rebound after capture (`self.input_ids = ...`) is never seen. The forward reads the runner's fixed
inputs and the attention metadata planned into fixed buffers (chapter 17's `FakeFlashInfer`),
so a replay sees exactly what a CUDA graph replay sees: what is in those tensors now. Stale
inputs, padding rows writing into live K/V, or the wrong graph for a batch all change the tokens.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import TINY_MODELS, greedy, guarded_llm, require_model
from course.differential import (
    Tolerance,
    assert_same_call,
    chapter_stubs,
    differences,
    reference_function,
    use_reference_stubs,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ch17_gpu_attention import (
    DIFF_HEAD_DIM,
    DIFF_HEADS,
    PAGE_LIST_STUBS,
    FakeFlashInfer,
    HostSyncGuard,
    backend_and_batch,
    fill_pool,
    hand_batch,
    page_batches,
    pages_by_walking,
    placed_batch,
    prompts,
    student_line,
    use_fake_flashinfer,
)
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from minisgl.attention.fi import FlashInferBackend, PageLists, page_lists, pad_page_lists
from minisgl.core import Batch, Context, get_global_ctx
from minisgl.engine import Engine, EngineConfig
from minisgl.engine import graph as graph_module
from minisgl.engine.graph import GraphRunner, graph_batch_sizes

MODEL = TINY_MODELS["qwen3"]


def storages(tree: Any) -> Iterator[tuple[int, torch.Tensor]]:
    """(address of its memory, tensor) for every tensor in a tree of arguments or results."""
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().data_ptr():
            yield leaf.untyped_storage().data_ptr(), leaf


class TensorReads(TorchFunctionMode):
    """The tensors a region reads that it did not make, by the address of their memory: what a
    CUDA graph captured from the region binds (views of one tensor share its memory). Given
    what a capture bound, it also notes where the region read any other tensor."""

    def __init__(self, bound: dict[int, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.bound = bound
        self.inputs: dict[int, torch.Tensor] = {}
        self.made: set[int] = set()
        self.unbound: list[str] = []  # each read of a tensor outside `bound`, and where

    def __torch_function__(
        self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        for address, tensor in storages((args, kwargs)):
            if address in self.made or address in self.inputs:
                continue
            self.inputs[address] = tensor
            if self.bound is not None and address not in self.bound:
                self.unbound.append(f"{tensor.dtype} {list(tensor.shape)} at {student_line()}")
        result = func(*args, **kwargs)
        self.made.update(address for address, _ in storages(result) if address not in self.inputs)
        return result


class FakeGraph:
    """CPU stand-in for CudaGraph (see the module docstring). It counts its replays, numbers
    its captures in order, and reports the bytes of the outputs it holds as device memory."""

    capture_order = itertools.count()
    bytes_held = 0

    def __init__(self) -> None:
        self.forward: Callable[[], torch.Tensor] | None = None
        self.bound: dict[int, torch.Tensor] = {}  # held, so no later tensor gets their memory
        self.replays = 0

    def capture(self, forward: Callable[[], torch.Tensor], pool: object) -> torch.Tensor:
        self.forward, self.pool, self.order = forward, pool, next(FakeGraph.capture_order)
        forward()  # the warm-up: lazy initialisation stays out of the graph, as in CudaGraph
        with HostSyncGuard("a CUDA graph capture", fatal=True), TensorReads() as reads:
            self.output = forward()
        self.bound = reads.inputs
        FakeGraph.bytes_held += self.output.numel() * self.output.element_size()
        return self.output

    def replay(self) -> None:
        assert self.forward is not None, "replay before capture"
        self.replays += 1
        # A real replay runs no Python: its host syncs already failed the capture.
        with TensorReads(self.bound) as reads:
            output = self.forward()
        assert not reads.unbound, (
            "the replay read tensors the capture did not bind (a CUDA graph replays the tensors "
            "it captured, so a tensor rebound after capture is never seen: copy into it "
            "instead): " + "; ".join(reads.unbound)
        )
        self.output.copy_(output)

    @staticmethod
    def new_pool() -> object:
        return object()

    @staticmethod
    def memory_in_use() -> int:
        return FakeGraph.bytes_held


def fake_gpu(monkeypatch: pytest.MonkeyPatch, fake: FakeFlashInfer) -> None:
    """Engines built from now on use FakeFlashInfer, and capture FakeGraphs up to
    cuda_graph_max_bs (graphs need a GPU otherwise)."""
    use_fake_flashinfer(monkeypatch, fake)
    max_batch_size = lambda engine: engine.config.cuda_graph_max_bs  # noqa: E731
    monkeypatch.setattr(graph_module, "wanted_graph_batch_size", max_batch_size)
    monkeypatch.setattr(GraphRunner, "graph_type", FakeGraph)


@pytest.fixture
def fake() -> FakeFlashInfer:
    return FakeFlashInfer()


def graph_engine(monkeypatch: pytest.MonkeyPatch, fake: FakeFlashInfer, max_bs: int) -> Engine:
    fake_gpu(monkeypatch, fake)
    return Engine(
        EngineConfig(
            str(require_model(MODEL)),
            device="cpu",  # the stand-ins are CPU code, whatever the machine
            attention_backend="flashinfer",
            page_size=4,
            num_pages=64,
            max_running_req=16,
            max_seq_len=64,
            cuda_graph_max_bs=max_bs,
            show_progress=False,
        )
    )


@pytest.mark.parametrize("max_bs", [1, 2, 3, 8, 13, 64, 100, 256])
def test_the_ladder_covers_every_batch_size_with_little_padding(max_bs):
    sizes = graph_batch_sizes(max_bs)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == max_bs
    for n in range(1, max_bs + 1):
        padded = min(s for s in sizes if s >= n)
        assert padded - n < 8 and padded <= 2 * n, f"batch {n} replays the graph of {padded}"
    assert len(sizes) <= 3 + max_bs // 8 + 1  # one graph per 8 rows above 8, no more


@settings(max_examples=60)
@given(max_bs=st.integers(1, 600))
def test_the_ladder_is_one_two_four_then_every_multiple_of_eight(max_bs):
    expected = sorted({n for n in (1, 2, 4) if n < max_bs} | set(range(8, max_bs, 8)) | {max_bs})
    assert graph_batch_sizes(max_bs) == expected, f"graph_batch_sizes({max_bs})"


def test_each_batch_replays_the_smallest_graph_that_holds_it(monkeypatch, fake):
    engine = graph_engine(monkeypatch, fake, max_bs=12)
    runner = engine.runner
    assert isinstance(runner, GraphRunner) and runner.batch_sizes == graph_batch_sizes(12)
    for n in range(1, 13):
        assert runner.graph_size(n) == min(s for s in runner.batch_sizes if s >= n)
    decode, prefill = Batch([None] * 12, "decode"), Batch([None] * 2, "prefill")
    assert runner.can_run(decode) and not runner.can_run(prefill)
    assert not runner.can_run(Batch([None] * 13, "decode"))


def test_graphs_are_captured_largest_first_in_one_pool(monkeypatch, fake):
    engine = graph_engine(monkeypatch, fake, max_bs=12)
    runner = engine.runner
    assert sorted(runner.graphs) == runner.batch_sizes
    order = sorted(runner.graphs, key=lambda size: runner.graphs[size].order)
    assert order == sorted(runner.batch_sizes, reverse=True)
    assert len({id(graph.pool) for graph in runner.graphs.values()}) == 1
    vocab = engine.model_config.vocab_size
    for size, logits in runner.logits.items():
        assert logits.shape == (size, vocab) and logits is runner.graphs[size].output
    held = sum(logits.numel() * logits.element_size() for logits in runner.logits.values())
    assert runner.capture_bytes == held and runner.capture_seconds > 0


@pytest.mark.parametrize("size, pad_to", [(3, 4), (5, 8), (4, 4)])
def test_padding_rows_are_one_query_on_one_page(size, pad_to):
    rng = random.Random(size)
    seq_lens = [rng.randint(1, 40) for _ in range(size)]
    lists = page_lists(seq_lens, [1] * size, 4)
    padded = pad_page_lists(lists, pad_to)
    extra = pad_to - size
    assert padded.num_pages == lists.num_pages + [1] * extra
    assert padded.last_page_len == lists.last_page_len + [1] * extra
    end = lists.kv_indptr[-1]
    assert padded.kv_indptr == lists.kv_indptr + [end + i for i in range(1, extra + 1)]
    assert padded.qo_indptr == lists.qo_indptr + [size + i for i in range(1, extra + 1)]


@settings(max_examples=50)
@given(
    rows=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), max_size=10),
    page_size=st.sampled_from([1, 4, 16]),
    extra=st.integers(-3, 10),
)
def test_padding_any_batch_appends_one_query_one_page_rows_only(rows, page_size, extra):
    seq_lens = [seq for seq, _ in rows]
    extend_lens = [min(new, seq) for seq, new in rows]
    lists = page_lists(seq_lens, extend_lens, page_size)
    real = PageLists(*(list(field) for field in vars(lists).values()))
    pad_to = len(rows) + extra
    padded = pad_page_lists(lists, pad_to)
    num_pad = max(0, extra)
    assert vars(lists) == vars(real), "pad_page_lists changed the lists it was given"
    assert len(padded.num_pages) == len(padded.last_page_len) == len(rows) + num_pad
    assert padded.num_pages == real.num_pages + [1] * num_pad
    assert padded.last_page_len == real.last_page_len + [1] * num_pad
    for name in ("kv_indptr", "qo_indptr"):
        ptr = getattr(padded, name)
        assert ptr[: len(rows) + 1] == getattr(real, name), f"{name}: the real rows changed"
        steps = [b - a for a, b in zip(ptr[len(rows) :], ptr[len(rows) + 1 :])]
        assert steps == [1] * num_pad, f"{name}: each padding row owns exactly one entry"


def test_a_padded_batch_is_planned_into_the_graphs_fixed_buffers(monkeypatch, fake):
    engine = graph_engine(monkeypatch, fake, max_bs=4)
    seq_lens = [9, 3, 14]
    batch = hand_batch(engine, seq_lens, [n - 1 for n in seq_lens], "decode")
    engine.prepare_batch(batch)
    wrapper = batch.attn_metadata.wrapper
    assert fake.log[-1] == ("graph decode", "plan") and wrapper.use_cuda_graph
    assert wrapper is engine.runner.graphs[4].forward.args[1].wrapper  # graph 4's own
    walked = [pages_by_walking(engine.page_table, i, n, 4) for i, n in enumerate(seq_lens)]
    pad_page = engine.num_pages  # the spare page past the scheduler's
    indptr, indices, last_page_len = (t.tolist() for t in wrapper.buffers)
    assert indptr == [sum(map(len, walked[:i])) for i in range(4)] + [sum(map(len, walked)) + 1]
    assert indices[: indptr[-1]] == [p for pages in walked for p in pages] + [pad_page]
    assert last_page_len == [n - 4 * (len(p) - 1) for n, p in zip(seq_lens, walked)] + [1]


def test_a_replay_equals_the_eager_forward_and_writes_no_live_kv(monkeypatch, fake):
    """Batch A (4 requests) replays graph 4; then batch B (3 other requests) replays it with
    one padding row. B's logits must equal an eager forward of B, and the replay may write
    K/V only at B's slots and on the spare page."""
    engine = graph_engine(monkeypatch, fake, max_bs=4)
    fill_pool(engine)
    runner = engine.runner
    a = hand_batch(engine, [6, 11, 2, 17], [5, 10, 1, 16], "decode")
    engine.prepare_batch(a)
    with torch.inference_mode():
        engine.run_model(a)
        b = hand_batch(engine, [8, 5, 13], [7, 4, 12], "decode")
        engine.attn_backend.prepare_metadata(b)
        with engine.ctx.forward_batch(b):
            eager = engine.model().clone()
        pool_before = engine.kv_cache.k_cache(1).clone()
        engine.prepare_batch(b)
        replayed = engine.run_model(b)
    assert runner.graphs[4].replays == 2
    torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=1e-5)
    changed = (engine.kv_cache.k_cache(1) != pool_before).flatten(1).any(-1).nonzero().flatten()
    spare = range(runner.pad_slot, runner.pad_slot + engine.page_size)
    allowed = set(b.out_loc.tolist()) | set(spare)
    assert set(changed.tolist()) <= allowed, "the replay wrote K/V outside the batch's slots"
    assert fake.syncs == [], "the step waited for the device:\n" + "\n".join(fake.syncs)


def test_a_graph_is_planned_again_only_when_its_pages_per_request_change(monkeypatch, fake):
    """A decode step adds one token to each request: until one of them needs a new page, the
    split of the work planned for the graph still holds, and only the fixed buffers take the
    new batch (other pages, other last-page lengths). Other page counts, or another graph
    planned in between over the same buffers, and the replay must still see its own batch."""
    engine = graph_engine(monkeypatch, fake, max_bs=4)
    fill_pool(engine)
    plans = lambda: fake.log.count(("graph decode", "plan"))  # noqa: E731

    def replanned(seq_lens: list[int]) -> bool:
        """Replay a decode batch of these lengths (on new pages), check it against an eager
        forward, and say whether its graph was planned again."""
        before = plans()
        batch = hand_batch(engine, seq_lens, [n - 1 for n in seq_lens], "decode")
        with torch.inference_mode():
            engine.attn_backend.prepare_metadata(batch)
            with engine.ctx.forward_batch(batch):
                eager = engine.model().clone()
            engine.prepare_batch(batch)
            replayed = engine.run_model(batch)
        torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=1e-5)
        return plans() > before

    # pages of 4: 9 -> 3 pages, 3 -> 1, 14 -> 4
    assert replanned([9, 3, 14]), "a batch new to its graph must be planned"
    assert not replanned([10, 4, 15]), (
        "the same pages per request (3, 1, 4): the graph's plan still holds, refresh its "
        "buffers only (plan_graph_decode)"
    )
    assert replanned([13, 4, 15]), "13 tokens take a fourth page: plan again"
    assert replanned([2, 5]), "graph 2 is planned on its own"
    assert not replanned([13, 3, 16]), "graph 4's pages (4, 1, 4) again, after graph 2's plan"
    assert replanned([10, 4, 15]), "back to (3, 1, 4): graph 4 was last planned for (4, 1, 4)"
    assert fake.syncs == [], "the step waited for the device:\n" + "\n".join(fake.syncs)


def test_each_graph_is_captured_over_a_batch_planned_for_its_size(monkeypatch, fake):
    """Capture plans an all-padding batch of the graph's size on the host first (its own graph
    wrapper, over the fixed buffers), then records: plan, warm-up, capture, for each size."""
    engine = graph_engine(monkeypatch, fake, max_bs=12)
    layers = engine.model_config.num_layers
    runner = engine.runner
    graph_log = [entry for entry in fake.log if entry[0] == "graph decode"]
    per_graph = [("graph decode", "plan")] + [("graph decode", "run")] * (2 * layers)
    assert graph_log == per_graph * len(runner.batch_sizes), (
        "each graph must be planned once, before its capture (and nothing planned during it)"
    )
    wrappers = {size: graph.forward.args[1].wrapper for size, graph in runner.graphs.items()}
    assert len({id(w) for w in wrappers.values()}) == len(wrappers), "one wrapper per graph"
    for size, wrapper in wrappers.items():
        assert wrapper.use_cuda_graph and len(wrapper.planned.last_page_len) == size
        assert wrapper is engine.attn_backend._graph_wrapper(size)


def test_prepare_for_graph_plans_the_graphs_own_wrapper_for_all_its_rows(monkeypatch, fake):
    engine = graph_engine(monkeypatch, fake, max_bs=8)
    backend = engine.attn_backend
    for seq_lens in ([9, 3, 14], [5, 2, 8, 11, 6]):
        batch = hand_batch(engine, seq_lens, [n - 1 for n in seq_lens], "decode")
        backend.prepare_for_graph(batch, 8, engine.num_pages)
        meta = batch.attn_metadata
        assert meta.wrapper is engine.runner.graphs[8].forward.args[1].wrapper
        assert meta.last_indices.tolist() == list(range(8)), "a graph's every row is a last token"
        assert fake.log[-1] == ("graph decode", "plan")
    assert fake.syncs == [], "the step waited for the device:\n" + "\n".join(fake.syncs)


def test_a_replay_copies_into_the_fixed_inputs_and_replays_one_graph(monkeypatch, fake):
    engine = graph_engine(monkeypatch, fake, max_bs=8)
    fill_pool(engine)
    runner = engine.runner
    fixed = {name: getattr(runner, name) for name in ("input_ids", "positions", "out_loc")}
    addresses = {name: tensor.data_ptr() for name, tensor in fixed.items()}
    with torch.inference_mode():
        for seq_lens in ([6, 11, 2, 17, 9, 4, 8], [8, 5, 13]):  # graph 8, then graph 4
            batch = hand_batch(engine, seq_lens, [n - 1 for n in seq_lens], "decode")
            before = {size: graph.replays for size, graph in runner.graphs.items()}
            engine.prepare_batch(batch)
            logits = engine.run_model(batch)
            size, graph_size = batch.size, runner.graph_size(batch.size)
            replayed = {
                s: g.replays - before[s] for s, g in runner.graphs.items() if g.replays > before[s]
            }
            assert replayed == {graph_size: 1}, f"batch of {size}: replays {replayed}"
            assert logits.shape == (size, engine.model_config.vocab_size)
            torch.testing.assert_close(logits, runner.logits[graph_size][:size])
            for name, tensor in fixed.items():
                assert getattr(runner, name) is tensor and tensor.data_ptr() == addresses[name]
                assert torch.equal(tensor[:size], getattr(batch, name).to(tensor.dtype)), (
                    f"the fixed {name} does not hold the batch's"
                )
            assert bool((runner.out_loc[size:graph_size] == runner.pad_slot).all()), (
                "the padding rows must store their K/V on the spare page"
            )


@pytest.fixture
def greedy_runs(monkeypatch: pytest.MonkeyPatch, fake: FakeFlashInfer) -> Iterator[Callable]:
    fake_gpu(monkeypatch, fake)

    def run(graph_max_bs: int) -> tuple[list[list[int]], dict[int, int]]:
        """Tokens of 13 requests ending at different steps; replays per graph size."""
        batch = prompts(13, seed=3)
        llm = guarded_llm(
            require_model(MODEL),
            device="cpu",  # the stand-ins are CPU code, whatever the machine
            attention_backend="flashinfer",
            page_size=4,
            num_pages=1024,
            max_running_req=12,
            cuda_graph_max_bs=graph_max_bs,
            show_progress=False,
        )
        with llm:
            outs = llm.generate(batch, [greedy(3 + 2 * i) for i in range(len(batch))])
            runner = llm.scheduler.engine.runner
            replays = (
                {n: g.replays for n, g in runner.graphs.items()}
                if isinstance(runner, GraphRunner)
                else {}
            )
        return [out["token_ids"] for out in outs], replays

    yield run


def test_tokens_with_graphs_equal_tokens_without(greedy_runs, fake):
    """Batches of 12 run eagerly; as requests finish, decode batches of 8 and fewer replay
    graphs (padded ones too). Every token must be the eager engine's."""
    with_graphs, replays = greedy_runs(8)
    eager, _ = greedy_runs(0)
    padded_sizes = {n for n, count in replays.items() if count and n > 1}
    assert sum(replays.values()) > 10 and len(padded_sizes) >= 2, f"replays per size: {replays}"
    assert with_graphs == eager
    assert fake.syncs == [], "the step waited for the device:\n" + "\n".join(fake.syncs)


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. Each test runs the chapter's other stubs (and chapter 17's
# page lists) as the reference has them, so a difference is the one stub's. GraphRunner's
# stubs run on runners whose graphs are small stand-ins: `ProbeGraph` replays what the fixed
# inputs hold, `recording_graphs` notes what each capture saw.

GRAPH_MAX_BS = 8  # the largest graph of the backends the comparisons plan for


def reference_stubs_but(*stubs: str) -> Any:
    """The chapter's stubs other than `stubs`, and chapter 17's page lists, as the reference
    has them (a context manager)."""
    others = set(chapter_stubs(18)) - set(stubs)
    stack = contextlib.ExitStack()
    stack.enter_context(use_reference_stubs(17, only=PAGE_LIST_STUBS))
    stack.enter_context(use_reference_stubs(18, only=others))
    return stack


def lists_of(seq_lens: list[int], extend_lens: list[int], page_size: int) -> PageLists:
    """page_lists' result, computed here (pad_page_lists' input is not its test's subject)."""
    num_pages = [-(-n // page_size) for n in seq_lens]
    return PageLists(
        num_pages,
        list(itertools.accumulate(num_pages, initial=0)),
        list(itertools.accumulate(extend_lens, initial=0)),
        [n - (p - 1) * page_size for n, p in zip(seq_lens, num_pages)],
    )


@settings(max_examples=40)
@given(batch=page_batches(max_reqs=8), extra=st.integers(-3, 10))
def test_pad_page_lists_matches_the_reference(batch, extra):
    """The lists of any batch (a capture's empty one too), padded to fewer rows than it has,
    exactly as many, or up to 10 more; the lists given must be left as they were."""
    seq_lens, extend_lens, page_size = batch
    lists = lists_of(seq_lens, extend_lens, page_size)
    assert_same_call(pad_page_lists, lists, max(0, len(seq_lens) + extra))


@st.composite
def graph_batches(draw: st.DrawFn) -> dict[str, Any]:
    """A decode batch of 0 (as at capture) to 5 requests, the size of the graph it is planned
    for, and the batches planned before it on the same backend: its requests (all or the
    first few) 0 to page_size tokens earlier, so with the same pages per request or fewer,
    for the same graph or another one."""
    seq_lens, _, page_size = draw(page_batches(max_reqs=5))
    graph_size = draw(st.integers(max(1, len(seq_lens)), GRAPH_MAX_BS))
    earlier = st.tuples(
        st.integers(0, len(seq_lens)),  # requests kept
        st.integers(0, page_size),  # tokens earlier
        st.one_of(st.none(), st.integers(1, GRAPH_MAX_BS)),  # None: the same graph
    )
    return dict(
        seq_lens=seq_lens,
        page_size=page_size,
        graph_size=graph_size,
        history=draw(st.lists(earlier, max_size=2)),
        seed=draw(st.integers(0, 2**16)),
    )


def planned_backend(
    seq_lens: list[int],
    page_size: int,
    graph_size: int,
    history: list[tuple[int, int, int | None]],
    seed: int,
) -> tuple[FlashInferBackend, Batch, int, int]:
    """prepare_for_graph's arguments: a backend set up for graphs up to GRAPH_MAX_BS rows, its
    graphs planned for the earlier batches (by the reference), the decode batch, its graph's
    size and the spare page."""
    cached = [n - 1 for n in seq_lens]
    backend, batch = backend_and_batch(seq_lens, cached, "decode", page_size, torch.float32, seed)
    backend.init_cuda_graph(GRAPH_MAX_BS)
    pad_page = backend.kv_cache.num_slots // page_size - 1
    rows = [req.table_idx for req in batch.reqs]
    prepare_for_graph = reference_function(FlashInferBackend, "prepare_for_graph")
    for kept, tokens_earlier, size in history:
        lens = [max(1, n - tokens_earlier) for n in seq_lens[:kept]]
        before = placed_batch(
            backend.page_table, rows[:kept], lens, [n - 1 for n in lens], "decode", seed
        )
        prepare_for_graph(
            backend, before, graph_size if size is None else max(size, kept), pad_page
        )
    return backend, batch, graph_size, pad_page


@settings(max_examples=25)
@given(spec=graph_batches())
def test_prepare_for_graph_matches_the_reference(spec):
    """The metadata (last_indices, the graph's wrapper with its fixed buffers, its plan and the
    split of the work it was planned for) and the log of plans, fast plans included."""
    with reference_stubs_but("attention/fi.py:FlashInferBackend.prepare_for_graph"):
        assert_same_call(FlashInferBackend.prepare_for_graph, build=lambda: planned_backend(**spec))


@settings(max_examples=40)
@given(max_batch_size=st.one_of(st.integers(1, 80), st.integers(81, 600), st.just(256)))
def test_graph_batch_sizes_matches_the_reference(max_batch_size):
    assert_same_call(graph_batch_sizes, max_batch_size)


class NoAttention:
    """The attention backend of a runner whose graphs are stand-ins: nothing to plan."""

    def init_cuda_graph(self, max_batch_size: int) -> None:
        self.max_batch_size = max_batch_size

    def prepare_for_graph(self, batch: Batch, graph_batch_size: int, pad_page: int) -> None:
        raise AssertionError("replay plans nothing: prepare did")


class ProbeGraph:
    """A graph captured over a runner's fixed inputs: its replay reads the very tensors it was
    captured with, as a CUDA graph does, and writes each of its rows' token id, position and
    KV slot into its output (what the logits of that row would depend on)."""

    def __init__(self, runner: GraphRunner, size: int) -> None:
        self.inputs = (runner.input_ids, runner.positions, runner.out_loc)
        self.output = torch.zeros(size, 3)
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        size = len(self.output)
        self.output.copy_(torch.stack([t[:size].double() for t in self.inputs], dim=1))


def probe_runner(max_batch_size: int, page_size: int = 4) -> GraphRunner:
    """A GraphRunner whose every graph is a ProbeGraph (captured, as far as it knows)."""
    table = torch.zeros(2, 16, dtype=torch.int32)
    ctx = Context(page_size, None, table, None)  # type: ignore[arg-type] - never forwards
    with use_reference_stubs(18, only={"engine/graph.py:graph_batch_sizes"}):
        runner = GraphRunner(torch.nn.Identity(), ctx, NoAttention(), max_batch_size, 5)
    runner.graphs = {size: ProbeGraph(runner, size) for size in runner.batch_sizes}
    runner.logits = {size: graph.output for size, graph in runner.graphs.items()}
    return runner


RUNNER_SIZES = st.sampled_from([1, 2, 3, 8, 12, 20])


@settings(max_examples=30)
@given(max_batch_size=RUNNER_SIZES, data=st.data(), phase=st.sampled_from(["decode", "prefill"]))
def test_can_run_matches_the_reference(max_batch_size, data, phase):
    """Batches of 1 row to 3 rows past the largest graph, decodes and prefills."""
    size = data.draw(st.integers(1, max_batch_size + 3), label="batch size")
    batch = Batch([None] * size, phase)  # type: ignore[list-item] - rows, not requests
    assert_same_call(GraphRunner.can_run, build=lambda: (probe_runner(max_batch_size), batch))


@settings(max_examples=30)
@given(max_batch_size=RUNNER_SIZES, data=st.data())
def test_graph_size_matches_the_reference(max_batch_size, data):
    """Every batch size a graph holds: 1 to the largest graph's."""
    size = data.draw(st.integers(1, max_batch_size), label="batch size")
    assert_same_call(GraphRunner.graph_size, build=lambda: (probe_runner(max_batch_size), size))


def decode_inputs(size: int, seed: int) -> Batch:
    """A decode batch of `size` rows: random token ids, positions and distinct KV slots."""
    gen = torch.Generator().manual_seed(seed)
    batch = Batch([None] * size, "decode")  # type: ignore[list-item] - rows, not requests
    batch.input_ids = torch.randint(0, 1000, (size,), generator=gen, dtype=torch.int32)
    batch.positions = torch.randint(0, 500, (size,), generator=gen)
    batch.out_loc = torch.randperm(200, generator=gen)[:size].int() + 8
    return batch


def what_replay_did(
    replay: Callable[[GraphRunner, Batch], torch.Tensor],
    max_batch_size: int,
    earlier: list[int],
    size: int,
) -> dict[str, Any]:
    """Replay a batch of `size` rows on a probe runner after the earlier batches (replayed by
    the reference): what a replay's contract speaks of. The padding rows' token ids and
    positions are left out (whatever they hold, nobody reads their logits), and so are the
    fixed inputs' rows past the graph's size (no graph this size reads them)."""
    runner = probe_runner(max_batch_size)
    reference_replay = reference_function(GraphRunner, "replay")
    for i, before in enumerate(earlier):
        reference_replay(runner, decode_inputs(before, seed=i))
    fixed = (runner.input_ids, runner.positions, runner.out_loc)
    batch = decode_inputs(size, seed=len(earlier))
    try:
        logits = replay(runner, batch)
    except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
        return {"raised": f"{type(error).__name__}: {error}"}
    graph_size = min(n for n in runner.batch_sizes if n >= size)
    return {
        "returned": logits,
        "replays of each graph": {n: graph.replays for n, graph in runner.graphs.items()},
        "the fixed inputs are the tensors the graphs captured": [
            now is then
            for now, then in zip((runner.input_ids, runner.positions, runner.out_loc), fixed)
        ],
        "fixed input_ids of the batch's rows": runner.input_ids[:size],
        "fixed positions of the batch's rows": runner.positions[:size],
        "fixed out_loc of the graph's rows": runner.out_loc[:graph_size],
        "the batch after": (batch.input_ids, batch.positions, batch.out_loc),
    }


@settings(max_examples=30)
@given(max_batch_size=RUNNER_SIZES, data=st.data())
def test_replay_matches_the_reference(max_batch_size, data):
    """A batch of any size after 0 to 2 earlier ones (larger ones leave their rows in the
    fixed inputs): the logits returned, which graph replayed, and the fixed inputs the
    replayed graph reads for the batch's rows (and the KV slots of its padding rows)."""
    sizes = st.integers(1, max_batch_size)
    earlier = data.draw(st.lists(sizes, max_size=2), label="earlier batch sizes")
    size = data.draw(sizes, label="batch size")
    yours = what_replay_did(GraphRunner.replay, max_batch_size, earlier, size)
    reference = what_replay_did(
        reference_function(GraphRunner, "replay"), max_batch_size, earlier, size
    )
    assert_same_outcome("GraphRunner.replay", yours, reference)


def assert_same_outcome(stub: str, yours: dict, reference: dict, tolerance: Any = None) -> None:
    """Fail, naming the stub (of minisgl/engine/graph.py), where two summaries differ."""
    found = differences(yours, reference, "outcome", tolerance or Tolerance())
    if found:
        raise AssertionError(
            f"{stub} (minisgl/engine/graph.py) differs from the reference:\n  " + "\n  ".join(found)
        )


class AttendingModel(torch.nn.Module):
    """A model of one attention layer, for captures: its forward runs the batch's planned
    wrapper over the pool (FakeFlashInfer refuses a plan for other rows) and returns, per
    row, its token id, position, KV slot, last_indices entry and attention output's sum."""

    def forward(self) -> torch.Tensor:
        ctx = get_global_ctx()
        batch, backend = ctx.batch, ctx.attn_backend
        q = torch.ones(len(batch.input_ids), DIFF_HEADS, DIFF_HEAD_DIM)
        pages = (backend.paged(ctx.kv_cache.k_cache(0)), backend.paged(ctx.kv_cache.v_cache(0)))
        out = batch.attn_metadata.wrapper.run(q, pages)
        columns = (
            batch.input_ids,
            batch.positions,
            batch.out_loc,
            batch.attn_metadata.last_indices,
        )
        return torch.stack([c.float() for c in columns] + [out.sum((1, 2))], dim=1)


GRAPH_CAPTURE_S = 0.01  # the least time each recorded graph's capture takes


def recording_graphs(log: list) -> type:
    """A graph type, new for each runner: its graphs note their capture's number, their pool,
    and the plans and runs logged while they captured; memory_in_use counts the bytes of the
    outputs they hold."""
    count = itertools.count()
    pools = itertools.count()
    held = [0]

    class RecordingGraph:
        def capture(self, forward: Callable[[], torch.Tensor], pool: object) -> torch.Tensor:
            self.number, self.pool, start = next(count), pool, len(log)
            time.sleep(GRAPH_CAPTURE_S)  # each capture takes time, so the total shows
            forward()  # the warm-up, as CudaGraph's
            self.output = forward()
            self.logged = log[start:]
            held[0] += self.output.numel() * self.output.element_size()
            return self.output

        def replay(self) -> None:
            raise AssertionError("capture replays nothing")

        @staticmethod
        def new_pool() -> object:
            return f"pool {next(pools)}"

        @staticmethod
        def memory_in_use() -> int:
            return held[0]

    return RecordingGraph


def what_capture_did(capture: Callable[[GraphRunner], None], max_bs: int, seed: int) -> dict:
    """Run `capture` on a new runner (a FlashInferBackend over FakeFlashInfer, AttendingModel,
    recording_graphs): the graphs by size with what each capture saw, the logits, the log of
    plans and runs, the bytes, and whether the time recorded is the capture's; or what it
    raised."""
    page_size = 4
    backend, _ = backend_and_batch([], [], "decode", page_size, torch.float32, seed)
    ctx = Context(page_size, backend.kv_cache, backend.page_table, backend)
    pad_page = backend.kv_cache.num_slots // page_size - 1
    runner = GraphRunner(AttendingModel(), ctx, backend, max_bs, pad_page)
    runner.graph_type = recording_graphs(backend.wrappers.log)
    started = time.perf_counter()
    try:
        capture(runner)
    except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
        return {"raised": f"{type(error).__name__}: {error}"}
    took = time.perf_counter() - started
    return {
        "graphs (size: capture number, pool, plans and runs during the capture)": {
            size: (graph.number, graph.pool, graph.logged)
            for size, graph in sorted(runner.graphs.items())
        },
        "logits": dict(sorted(runner.logits.items())),
        "logits are the graphs' outputs": all(
            runner.logits.get(size) is graph.output for size, graph in runner.graphs.items()
        ),
        "plans and runs": backend.wrappers.log,
        "capture_bytes": runner.capture_bytes,
        "capture_seconds: at least every graph's capture, at most the time capture took": (
            len(runner.graphs) * GRAPH_CAPTURE_S <= runner.capture_seconds <= took
        ),
    }


@settings(max_examples=8)
@given(max_bs=st.one_of(st.integers(1, 9), st.just(16), st.just(20)), seed=st.integers(0, 99))
def test_capture_matches_the_reference(max_bs, seed):
    """Every graph of the ladder: captured in the reference's order, in one pool, over a
    batch planned for its size before (not during) its capture, its logits kept; the bytes
    and time recorded."""
    with reference_stubs_but("engine/graph.py:GraphRunner.capture"):
        yours = what_capture_did(GraphRunner.capture, max_bs, seed)
        reference = what_capture_did(reference_function(GraphRunner, "capture"), max_bs, seed)
    assert_same_outcome("GraphRunner.capture", yours, reference, Tolerance(1e-6, 1e-6))
