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
import torch
import torch.nn.functional as F
from conftest import SMOLLM2, TINY_MODELS, encode, greedy, hf_greedy_cached, require_model

from minisgl.distributed import DistributedInfo, head_shard, split_range, vocab_block
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


def test_split_range_cuts_contiguous_blocks_that_differ_by_at_most_one() -> None:
    for total in range(13):
        for size in range(1, 6):
            blocks = [split_range(total, size, rank) for rank in range(size)]
            assert blocks[0][0] == 0 and blocks[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:])), "not contiguous"
            lengths = [end - start for start, end in blocks]
            assert lengths == sorted(lengths, reverse=True), "the longer blocks come first"
            assert lengths[0] - lengths[-1] <= 1, f"{total} over {size}: uneven {lengths}"


@pytest.mark.parametrize("num_heads, num_kv_heads, size", HEAD_CASES)
def test_head_shard_gives_each_query_head_to_one_rank_with_its_kv_head(
    num_heads: int, num_kv_heads: int, size: int
) -> None:
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
    else:  # a copy of one KV head per rank
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


@pytest.mark.parametrize("vocab, size", [(10, 2), (11, 2), (11, 3)])
def test_vocab_parallel_embedding_and_lm_head_equal_the_whole(
    ranks: Callable[[int], ThreadRanks], vocab: int, size: int
) -> None:
    torch.manual_seed(0)
    hidden = 6
    table, head = torch.randn(vocab, hidden), torch.randn(vocab, hidden)
    ids = torch.tensor([[0, vocab - 1, 3], [vocab // 2, 1, vocab - 2]])
    hidden_states = torch.randn(3, hidden)
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
        torch.testing.assert_close(logits, hidden_states @ head.T)


# --- two real processes ------------------------------------------------------------------------

MODELS = {"smollm2": SMOLLM2, **TINY_MODELS}


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
