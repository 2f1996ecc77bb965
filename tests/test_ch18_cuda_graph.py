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

import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from conftest import TINY_MODELS, greedy, guarded_llm, require_model
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ch17_gpu_attention import (
    FakeFlashInfer,
    HostSyncGuard,
    fill_pool,
    hand_batch,
    pages_by_walking,
    prompts,
    student_line,
    use_fake_flashinfer,
)
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from minisgl.attention.fi import PageLists, page_lists, pad_page_lists
from minisgl.core import Batch
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
