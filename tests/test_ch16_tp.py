"""Chapter 16 tests: tensor parallelism. The partition rules cover every head, row and column
exactly once; the sharded layers, run as simulated ranks (threads whose collectives meet), add
up to the whole layer; and a real two-process engine (gloo on the CPU) generates the same
greedy tokens as one process and as transformers, with the radix cache and chunked prefill on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F
from conftest import SMOLLM2, TINY_MODELS, encode, greedy, hf_greedy_cached, require_model
from course.differential import (
    EXACT,
    Tolerance,
    assert_same_call,
    call_differences,
    describe,
    reference_of,
)

from minisgl.distributed import DistributedInfo, head_shard, split_range, vocab_block
from minisgl.distributed.shard import HeadShard
from minisgl.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from minisgl.layers import parallel as parallel_layers
from minisgl.llm import LLM
from minisgl.models.parallel import qkv_rows

# (query heads, KV heads, ranks): divisible, SmolLM2's 9/3 over 2, fewer KV heads than ranks
HEAD_CASES = [(4, 2, 2), (9, 3, 2), (32, 8, 2), (12, 4, 3), (4, 1, 2), (6, 3, 4), (8, 2, 8)]
# A shared prefix (radix cache hits) and prompts longer than the chunk budget below
PROMPTS = ["The capital of France is", "The capital of France is a city where", "Water boils at"]
MAX_TOKENS = 5
CHUNK_BUDGET = 4  # max_extend_tokens: every prompt is prefilled in several chunks


# --- the partition rules ---------------------------------------------------------------------


def check_split(total: int, size: int) -> None:
    """Contiguous blocks in rank order that cover [0, total), the longer ones first, their
    lengths differing by at most one."""
    blocks = [split_range(total, size, rank) for rank in range(size)]
    assert blocks[0][0] == 0 and blocks[-1][1] == total, f"{total} over {size}: {blocks}"
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:])), f"not contiguous: {blocks}"
    lengths = [end - start for start, end in blocks]
    base, extra = divmod(total, size)
    assert lengths == [base + 1] * extra + [base] * (size - extra), (
        f"{total} over {size}: lengths {lengths}, the longer first, differing by at most one"
    )


def test_split_range_cuts_contiguous_blocks_that_differ_by_at_most_one() -> None:
    for total in range(13):
        for size in range(1, 6):
            check_split(total, size)


@pytest.mark.parametrize("num_heads, num_kv_heads, size", HEAD_CASES)
def test_head_shard_gives_each_query_head_to_one_rank_with_its_kv_head(
    num_heads: int, num_kv_heads: int, size: int
) -> None:
    check_head_shards(num_heads, num_kv_heads, size)


def check_head_shards(num_heads: int, num_kv_heads: int, size: int) -> None:
    """Every query head on exactly one rank, with the KV head it reads; whole KV groups
    (split_range of the KV heads) when there are enough, else one shared copy per rank."""
    group = num_heads // num_kv_heads
    shards = [
        head_shard(num_heads, num_kv_heads, DistributedInfo(rank, size)) for rank in range(size)
    ]
    owners = [h for s in shards for h in range(s.q_start, s.q_end)]
    assert owners == list(range(num_heads)), "every query head exactly once, in rank order"
    for s in shards:
        assert s.num_heads >= 1 and s.num_kv_heads >= 1
        # The attention backend groups a rank's query heads evenly over its KV heads: local
        # query head i reads local KV head i // (num_heads / num_kv_heads), which must be the
        # KV head that query head reads in the whole model.
        assert s.num_heads % s.num_kv_heads == 0
        local_group = s.num_heads // s.num_kv_heads
        for i, h in enumerate(range(s.q_start, s.q_end)):
            assert s.kv_start + i // local_group == h // group, f"{s}: head {h} misses its KV"
    kv_counts = [s.num_kv_heads for s in shards]
    if num_kv_heads >= size:  # whole KV groups, each on one rank, balanced
        assert sum(kv_counts) == num_kv_heads and max(kv_counts) - min(kv_counts) <= 1
        kv_blocks = [(s.kv_start, s.kv_end) for s in shards]
        assert kv_blocks == [split_range(num_kv_heads, size, r) for r in range(size)], kv_blocks
    else:  # a copy of one KV head per rank: rank r keeps KV head r * num_kv_heads // size
        assert [s.kv_start for s in shards] == [r * num_kv_heads // size for r in range(size)]
        assert kv_counts == [1] * size


def test_vocab_block_gives_every_rank_the_same_padded_width() -> None:
    for vocab in (10, 11, 49152):
        for size in (1, 2, 3, 4):
            blocks = [vocab_block(vocab, DistributedInfo(rank, size)) for rank in range(size)]
            padded = {p for _, _, p in blocks}
            assert len(padded) == 1 and padded.pop() * size >= vocab
            assert [b[0] for b in blocks][0] == 0 and blocks[-1][1] == vocab
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            assert all(end - start <= p for start, end, p in blocks)


QUICK = settings(derandomize=True, max_examples=200, deadline=None, database=None)


@QUICK
@given(total=st.integers(0, 10**6), size=st.integers(1, 64))
def test_split_range_over_random_sizes(total: int, size: int) -> None:
    check_split(total, size)


@QUICK
@given(num_kv_heads=st.integers(1, 12), group=st.integers(1, 6), size=st.integers(1, 40))
def test_head_shard_over_random_head_counts(num_kv_heads: int, group: int, size: int) -> None:
    num_heads = num_kv_heads * group
    if size > num_heads:  # some rank would get no query head at all
        with pytest.raises(ValueError, match="heads"):
            head_shard(num_heads, num_kv_heads, DistributedInfo(size - 1, size))
        return
    check_head_shards(num_heads, num_kv_heads, size)


@QUICK
@given(vocab=st.integers(1, 10**6), size=st.integers(1, 64))
def test_vocab_block_over_random_sizes(vocab: int, size: int) -> None:
    """Blocks of ceil(vocab / size) ids from rank * padded on; a rank past the end holds an
    empty block (still `padded` rows of padding)."""
    padded = -(-vocab // size)
    blocks = [vocab_block(vocab, DistributedInfo(rank, size)) for rank in range(size)]
    expected = [(min(r * padded, vocab), min((r + 1) * padded, vocab), padded) for r in range(size)]
    assert blocks == expected, f"vocabulary {vocab} over {size} ranks"


@QUICK
@given(
    q=st.tuples(st.integers(0, 64), st.integers(1, 16)),
    kv=st.tuples(st.integers(0, 16), st.integers(1, 4)),
    head_dim=st.integers(1, 256),
)
def test_qkv_rows_are_whole_heads_of_head_dim_rows(
    q: tuple[int, int], kv: tuple[int, int], head_dim: int
) -> None:
    heads = HeadShard(q[0], q[0] + q[1], kv[0], kv[0] + kv[1])
    q_rows = (heads.q_start * head_dim, heads.q_end * head_dim)
    kv_rows = (heads.kv_start * head_dim, heads.kv_end * head_dim)
    assert qkv_rows(heads, head_dim) == [q_rows, kv_rows, kv_rows], f"{heads}, head_dim {head_dim}"


# --- the sharded layers, on simulated ranks ----------------------------------------------------


class ThreadRanks:
    """`size` ranks as threads of this process; their all-reduce and all-gather meet at a
    barrier, like torch.distributed's, so each rank's layer runs its real forward."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.pieces: list[torch.Tensor | None] = [None] * size
        self.local = threading.local()

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        self.pieces[self.local.rank] = x.clone()
        self.barrier.wait()
        pieces = [p for p in self.pieces if p is not None]
        self.barrier.wait()  # everyone has read before the next exchange overwrites
        return pieces

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x.copy_(torch.stack(self._exchange(x)).sum(0))

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(x))

    def run(self, fn: Callable[[int], torch.Tensor]) -> list[torch.Tensor]:
        """fn(rank) on every rank at once; each rank's result."""
        results: list[torch.Tensor | None] = [None] * self.size
        errors: list[BaseException] = []

        def one(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as error:  # re-raised below, in the test's thread
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [r for r in results if r is not None]


@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], ThreadRanks]]:
    def make(size: int) -> ThreadRanks:
        group = ThreadRanks(size)
        monkeypatch.setattr(parallel_layers, "all_reduce", group.all_reduce)
        monkeypatch.setattr(parallel_layers, "all_gather", group.all_gather)
        return group

    yield make


@pytest.mark.parametrize("num_heads, num_kv_heads, size", [(9, 3, 2), (4, 1, 2), (12, 4, 3)])
def test_sharded_attention_projections_add_up_to_the_whole(
    ranks: Callable[[int], ThreadRanks], num_heads: int, num_kv_heads: int, size: int
) -> None:
    torch.manual_seed(0)
    hidden, head_dim, tokens = 16, 4, 5
    q_w, q_b = torch.randn(num_heads * head_dim, hidden), torch.randn(num_heads * head_dim)
    k_w, v_w = (torch.randn(num_kv_heads * head_dim, hidden) for _ in range(2))
    k_b, v_b = (torch.randn(num_kv_heads * head_dim) for _ in range(2))
    o_w, o_b = torch.randn(hidden, num_heads * head_dim), torch.randn(hidden)
    x = torch.randn(tokens, hidden)
    whole_q, whole_k, whole_v = F.linear(x, q_w, q_b), F.linear(x, k_w, k_b), F.linear(x, v_w, v_b)
    attn_out = torch.randn(tokens, num_heads * head_dim)  # stands for the attention's output
    group = ranks(size)

    def rank_forward(rank: int) -> torch.Tensor:
        heads = head_shard(num_heads, num_kv_heads, DistributedInfo(rank, size))
        rows = qkv_rows(heads, head_dim)
        qkv = ColumnParallelLinear(hidden, rows, bias=True)
        for shard, (w, b) in enumerate([(q_w, q_b), (k_w, k_b), (v_w, v_b)]):
            qkv.load_slice("weight", shard, w)
            qkv.load_slice("bias", shard, b)
        q, k, v = qkv(x).split([end - start for start, end in rows], dim=-1)
        (qs, qe), (ks, ke), _ = rows
        torch.testing.assert_close(q, whole_q[:, qs:qe])
        torch.testing.assert_close(k, whole_k[:, ks:ke])
        torch.testing.assert_close(v, whole_v[:, ks:ke])
        o_proj = RowParallelLinear(rows[0], hidden, bias=True)
        o_proj.load_slice("weight", None, o_w)
        o_proj.load_slice("bias", None, o_b)
        return o_proj(attn_out[:, qs:qe].contiguous())

    for out in group.run(rank_forward):  # every rank ends with the whole output, bias once
        torch.testing.assert_close(out, F.linear(attn_out, o_w, o_b))


# (vocabulary, ranks): even, uneven, and more ranks than blocks (the last ones hold no id)
@pytest.mark.parametrize("vocab, size", [(10, 2), (11, 2), (11, 3), (16, 4), (5, 4), (1, 2)])
def test_vocab_parallel_embedding_and_lm_head_equal_the_whole(
    ranks: Callable[[int], ThreadRanks], vocab: int, size: int
) -> None:
    torch.manual_seed(0)
    hidden = 6
    table, head = torch.randn(vocab, hidden), torch.randn(vocab, hidden)
    ids = torch.arange(vocab).flip(0).repeat(2, 1)  # every id, in [batch, tokens]
    hidden_states = torch.randn(2, 3, hidden)  # [batch, tokens, hidden]
    group = ranks(size)

    def rank_forward(rank: int) -> torch.Tensor:
        tp = DistributedInfo(rank, size)
        embed = VocabParallelEmbedding(vocab, hidden, tp)
        embed.load_slice("weight", None, table)
        torch.testing.assert_close(embed(ids), F.embedding(ids, table))
        lm_head = ParallelLMHead(vocab, hidden, tp)
        lm_head.load_slice("weight", None, head)
        tied = ParallelLMHead(vocab, hidden, tp, tied_to=embed)
        torch.testing.assert_close(tied(hidden_states), hidden_states @ table.T)
        return lm_head(hidden_states)

    for logits in group.run(rank_forward):
        assert logits.shape == (2, 3, vocab), f"logits of shape {tuple(logits.shape)}"
        torch.testing.assert_close(logits, hidden_states @ head.T)


class RecordedCheckpoint:
    """A checkpoint tensor as safetensors hands it over: indexing reads that part alone; every
    index is recorded."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.reads: list[object] = []

    def __getitem__(self, index: slice | tuple[slice, ...]) -> torch.Tensor:
        self.reads.append(index)
        return self.tensor[index]


def test_a_column_shard_reads_only_its_own_rows_of_the_checkpoint() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(10, 3), torch.randn(10)
    layer = ColumnParallelLinear(3, [(4, 7)], bias=True)
    for name, tensor in (("weight", weight), ("bias", bias)):
        checkpoint = RecordedCheckpoint(tensor)
        layer.load_slice(name, None, checkpoint)  # None: the layer's only shard
        assert checkpoint.reads == [slice(4, 7)], f"{name}: read {checkpoint.reads}, not 4:7"
    torch.testing.assert_close(layer.weight, weight[4:7])
    torch.testing.assert_close(layer.bias, bias[4:7])


@pytest.mark.parametrize("bias", [True, False])
def test_row_parallel_outputs_of_any_shape_sum_to_the_whole(
    ranks: Callable[[int], ThreadRanks], bias: bool
) -> None:
    torch.manual_seed(0)
    size, input_size, output_size = 3, 8, 5
    x = torch.randn(2, 4, input_size)  # [batch, tokens, features]: any leading dimensions
    weight = torch.randn(output_size, input_size)
    bias_tensor = torch.randn(output_size) if bias else None
    group = ranks(size)

    def rank_forward(rank: int) -> torch.Tensor:
        start, end = split_range(input_size, size, rank)
        layer = RowParallelLinear((start, end), output_size, bias=bias)
        layer.load_slice("weight", None, weight)
        if bias_tensor is not None:
            layer.load_slice("bias", None, bias_tensor)
        return layer(x[..., start:end].contiguous())

    for out in group.run(rank_forward):
        torch.testing.assert_close(out, F.linear(x, weight, bias_tensor))


# --- two real processes ------------------------------------------------------------------------

# SmolLM2 is a Llama: tiny-llama would add only its RoPE scaling, which sharding does not touch.
MODELS = {"smollm2": SMOLLM2, "qwen2": TINY_MODELS["qwen2"], "qwen3": TINY_MODELS["qwen3"]}


def generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [out["token_ids"] for out in llm.generate(prompts, greedy(MAX_TOKENS))]


@pytest.mark.time_limit(120)  # two processes, each loading the model: slow on a busy machine
@pytest.mark.parametrize("name", sorted(MODELS))
def test_tp2_generates_what_one_process_and_transformers_generate(name: str) -> None:
    model = require_model(Path(MODELS[name]))
    prompts = encode(model, PROMPTS)
    config = dict(show_progress=False, max_extend_tokens=CHUNK_BUDGET, cache_type="radix")
    with LLM(str(model), **config) as llm:
        expected = generate(llm, prompts)
    with LLM(str(model), tp_size=2, **config) as llm:
        first = generate(llm, prompts[:1])  # its prompt is the others' prefix: cached
        rest = generate(llm, prompts[1:])
        stats = llm.scheduler.stats
        engine = llm.scheduler.engine
        c = engine.model_config
        mine = head_shard(c.num_heads, c.num_kv_heads, DistributedInfo(0, 2))
        assert engine.kv_cache.k_cache(0).shape[1] == mine.num_kv_heads, "this rank's KV only"
    assert first + rest == expected, "two ranks generate what one process generates"
    for ids, tokens in zip(prompts, expected):
        assert tokens == hf_greedy_cached(model, ids, MAX_TOKENS)
    assert stats.computed_prompt_tokens < sum(map(len, prompts)), "the radix cache was hit"
    prefills = [tokens for phase, _, tokens in stats.steps if phase == "prefill"]
    assert max(prefills) <= CHUNK_BUDGET and len(prefills) > len(prompts), "prompts chunked"


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. A layer's weights and what it hands to a collective are
# where the comparison does not look by itself (an nn.Module keeps its parameters in a private
# dict): the sharded layers' tests return them beside the output. The collectives are stand-ins
# for one rank of the group: the other ranks' contributions are fixed tensors.

SIZES = st.integers(1, 64)


@st.composite
def rank_of(draw: st.DrawFn, size: st.SearchStrategy[int] = SIZES) -> DistributedInfo:
    """A rank of a group: the first, the last, or any."""
    chosen = draw(size)
    rank = draw(st.sampled_from([0, chosen - 1]) | st.integers(0, chosen - 1))
    return DistributedInfo(rank, chosen)


COUNTS = st.sampled_from([0, 1, 63, 64, 65, 1024]) | st.integers(0, 10**6)


@settings(max_examples=50)
@given(tp=rank_of(), total=COUNTS, multiple=st.integers(0, 4), off=st.sampled_from([-1, 0, 1]))
def test_split_range_matches_the_reference(
    tp: DistributedInfo, total: int, multiple: int, off: int
) -> None:
    """Totals of none, one, at and next to a multiple of the ranks, and any."""
    assert_same_call(split_range, total, tp.size, tp.rank)
    assert_same_call(split_range, max(0, multiple * tp.size + off), tp.size, tp.rank)


@settings(max_examples=50)
@given(num_kv_heads=st.integers(1, 16), group=st.integers(1, 8), tp=rank_of(st.integers(1, 40)))
def test_head_shard_matches_the_reference(
    num_kv_heads: int, group: int, tp: DistributedInfo
) -> None:
    """More, as many and fewer KV heads than ranks, and more ranks than query heads (an
    error)."""
    assert_same_call(head_shard, num_kv_heads * group, num_kv_heads, tp)


@settings(max_examples=50)
@given(vocab=COUNTS.filter(bool), tp=rank_of())
def test_vocab_block_matches_the_reference(vocab: int, tp: DistributedInfo) -> None:
    """Vocabularies that split evenly or not, smaller than the group too (empty blocks)."""
    assert_same_call(vocab_block, vocab, tp)


@settings(max_examples=30)
@given(
    q=st.tuples(st.integers(0, 64), st.integers(1, 16)),
    kv=st.tuples(st.integers(0, 16), st.integers(1, 4)),
    head_dim=st.sampled_from([1, 64, 128]) | st.integers(1, 256),
)
def test_qkv_rows_matches_the_reference(q: tuple, kv: tuple, head_dim: int) -> None:
    heads = HeadShard(q[0], q[0] + q[1], kv[0], kv[0] + kv[1])
    assert_same_call(qkv_rows, heads, head_dim)


def assert_same_observed(
    stub: Callable, build: Callable[[], tuple], observe: Callable, tolerance: Tolerance = EXACT
) -> None:
    """assert_same_call for a stub whose effects lie where the comparison does not look: each
    side's call returns `(its value, observe(*arguments))`, `observe` run right after it."""
    reference = reference_of(stub)

    def observed(function: Callable) -> Callable:
        def call(*args: object) -> tuple:
            return function(*args), observe(*args)

        return call

    found = call_differences(
        observed(stub), build=build, reference=observed(reference), tolerance=tolerance
    )
    assert not found, (
        f"{stub.__qualname__} differs from the reference on these inputs:\n  "
        + "\n  ".join(found)
        + f"\ninputs: {', '.join(describe(a) for a in build())}"
    )


class RowsRead:
    """A checkpoint tensor as safetensors hands it over; the rows each index reads are kept
    (as a list, so `[a:b]` and `[a:b, :]` read the same)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.rows_read: list[list[int]] = []

    def __getitem__(self, index: object) -> torch.Tensor:
        rows = index[0] if isinstance(index, tuple) else index
        self.rows_read.append(torch.arange(len(self.tensor))[rows].tolist())
        return self.tensor[index]


def parameters(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in layer.state_dict().items()}


FLOAT_DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


@settings(max_examples=30)
@given(
    input_size=st.integers(1, 5),
    shard_sizes=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    data=st.data(),
    bias=st.booleans(),
    dtype=FLOAT_DTYPES,
)
def test_column_load_slice_matches_the_reference(
    input_size: int, shard_sizes: list[int], data: st.DataObject, bias: bool, dtype: torch.dtype
) -> None:
    """Shards of any height (q, k, v; gate, up; one), each rank's rows anywhere in them, from
    the first row to the last; the weight or the bias; shard None for a layer of one shard.
    What was read and where it went, the other rows of the local weight untouched."""
    rows = [
        data.draw(st.tuples(st.integers(0, n - 1), st.integers(1, n)).filter(lambda r: r[0] < r[1]))
        for n in shard_sizes
    ]
    shard = data.draw(
        st.integers(0, len(rows) - 1) | st.sampled_from([None] if len(rows) == 1 else [0])
    )
    name = data.draw(st.sampled_from(["weight", "bias"] if bias else ["weight"]))
    generator = torch.Generator().manual_seed(len(rows))
    height = shard_sizes[shard or 0]
    tensor = torch.randn(height, input_size, generator=generator).to(dtype)

    def build() -> tuple:
        layer = ColumnParallelLinear(input_size, rows, bias).to(dtype)
        for parameter in layer.parameters():
            parameter.data.fill_(-7.0)  # rows nobody loads keep this
        return layer, name, shard, RowsRead(tensor if name == "weight" else tensor[:, 0])

    assert_same_observed(
        ColumnParallelLinear.load_slice, build, lambda layer, *_: parameters(layer)
    )


class OneRankCollectives:
    """The collectives as rank `rank` of `size` sees them: what it hands over is kept; the
    other ranks' contributions are fixed tensors of the same shape (rank r's: `theirs(x, r)`)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.handed_over: list[tuple[str, torch.Tensor]] = []

    @staticmethod
    def theirs(x: torch.Tensor, rank: int) -> torch.Tensor:
        return torch.linspace(-2.0, 3.0, x.numel()).reshape(x.shape).to(x.dtype) * (rank + 1)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:  # in place, as the real one
        self.handed_over.append(("all_reduce", x.clone()))
        for rank in range(self.size):
            if rank != self.rank:
                x += self.theirs(x, rank)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        self.handed_over.append(("all_gather", x.clone()))
        return torch.cat([x if r == self.rank else self.theirs(x, r) for r in range(self.size)])


def forward_with(forward: Callable) -> Callable:
    """`forward(layer, x)`, the layers' collectives those of the group given with them; what
    the layer handed to them is returned beside its output."""

    def call(layer: torch.nn.Module, x: torch.Tensor, group: OneRankCollectives) -> tuple:
        saved = parallel_layers.all_reduce, parallel_layers.all_gather
        parallel_layers.all_reduce, parallel_layers.all_gather = group.all_reduce, group.all_gather
        try:
            return forward(layer, x), group.handed_over
        finally:
            parallel_layers.all_reduce, parallel_layers.all_gather = saved

    return call


def assert_same_forward(stub: Callable, build: Callable[[], tuple], dtype: torch.dtype) -> None:
    """The layer's output and what it handed to each collective, yours against the
    reference's: within rounding (a product may sum in another order), as
    torch.testing.assert_close's defaults for the dtype."""
    tolerance = TOLERANCES[dtype]
    reference = reference_of(stub)
    found = call_differences(
        forward_with(stub),
        build=build,
        reference=forward_with(reference),
        tolerance=tolerance,
    )
    assert not found, (
        f"{stub.__qualname__} differs from the reference on these inputs:\n  "
        + "\n  ".join(found)
        + f"\ninputs: {', '.join(describe(a) for a in build())}"
    )


TOLERANCES = {
    torch.float32: Tolerance(rtol=1.3e-6, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=1.6e-2, atol=1e-2),
}
LEADING = st.sampled_from([(), (0,), (1,), (3,), (2, 3)])  # x's dimensions before the features


def random_module(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    for parameter in module.parameters():
        parameter.data.copy_(torch.randn(parameter.shape, generator=generator))
    return module


@settings(max_examples=25)
@given(
    tp=rank_of(st.integers(1, 4)),
    cols=st.tuples(st.integers(0, 6), st.integers(1, 8)),
    output_size=st.integers(1, 6),
    leading=LEADING,
    bias=st.booleans(),
    dtype=FLOAT_DTYPES,
)
def test_row_parallel_forward_matches_the_reference(
    tp: DistributedInfo,
    cols: tuple[int, int],
    output_size: int,
    leading: tuple,
    bias: bool,
    dtype: torch.dtype,
) -> None:
    """Any block of input columns, with and without bias, x of any leading shape (no token
    too), alone or among other ranks."""

    def build() -> tuple:
        layer = RowParallelLinear((cols[0], cols[0] + cols[1]), output_size, bias)
        layer = random_module(layer, 1).to(dtype)
        x = torch.randn(*leading, cols[1], generator=torch.Generator().manual_seed(2))
        return layer, x.to(dtype), OneRankCollectives(tp.rank, tp.size)

    assert_same_forward(RowParallelLinear.forward, build, dtype)


@settings(max_examples=25)
@given(
    vocab=st.integers(1, 12),
    tp=rank_of(st.integers(1, 5)),
    leading=LEADING.filter(bool),
    dtype=FLOAT_DTYPES,
)
def test_vocab_parallel_embedding_forward_matches_the_reference(
    vocab: int, tp: DistributedInfo, leading: tuple, dtype: torch.dtype
) -> None:
    """Ids inside and outside this rank's block (its first and last ids among them), for
    blocks that split the vocabulary evenly or not, or hold no id at all."""

    def build() -> tuple:
        layer = random_module(VocabParallelEmbedding(vocab, 3, tp), 3).to(dtype)
        ids = torch.randint(0, vocab, leading, generator=torch.Generator().manual_seed(4))
        if ids.numel():
            ids.view(-1)[0] = min(layer.vocab_start, vocab - 1)
            ids.view(-1)[-1] = max(layer.vocab_end - 1, 0)
        return layer, ids, OneRankCollectives(tp.rank, tp.size)

    assert_same_forward(VocabParallelEmbedding.forward, build, dtype)


@settings(max_examples=25)
@given(
    vocab=st.integers(1, 12),
    tp=rank_of(st.integers(1, 5)),
    leading=LEADING,
    tied=st.booleans(),
    dtype=FLOAT_DTYPES,
)
def test_parallel_lm_head_forward_matches_the_reference(
    vocab: int, tp: DistributedInfo, leading: tuple, tied: bool, dtype: torch.dtype
) -> None:
    """Logits of a vocabulary that splits evenly or not (padding to cut off), with its own
    weight or tied to the embedding's, for hidden states of any leading shape."""

    def build() -> tuple:
        embedding = random_module(VocabParallelEmbedding(vocab, 4, tp), 5)
        head = ParallelLMHead(vocab, 4, tp, tied_to=embedding if tied else None)
        head = random_module(head, 6).to(dtype)
        hidden = torch.randn(*leading, 4, generator=torch.Generator().manual_seed(7))
        return head, hidden.to(dtype), OneRankCollectives(tp.rank, tp.size)

    assert_same_forward(ParallelLMHead.forward, build, dtype)
