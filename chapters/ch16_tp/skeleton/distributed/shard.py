"""Which slice of each weight matrix a tensor-parallel rank holds: the partition rules.

Three rules cover a Llama-style decoder:

- `split_range`: a dimension cut into `size` contiguous blocks as even as possible (the MLP's
  intermediate dimension, the KV-head groups); the first `total % size` ranks get one more.
- `head_shard`: attention heads. Each rank takes whole KV-head groups (a KV head and the query
  heads that read it), so no key or value ever crosses ranks. When there are fewer KV heads
  than ranks, the ranks that share a KV head each keep a copy of it and split its query heads.
- `vocab_block`: the vocabulary, in blocks of ceil(vocab / size) rows; the last rank's block is
  padded so that every rank's logits have the same width for the all-gather.

Real engines demand that the ranks divide the head counts; these rules also handle 9 query
heads and 3 KV heads (SmolLM2) over 2 ranks: 6 + 3 query heads, 2 + 1 KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.utils import div_ceil

from .info import DistributedInfo


def split_range(total: int, size: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank `rank`'s block when `total` items are split over `size` ranks.

    Blocks are contiguous and in rank order; their lengths differ by at most one, the longer
    ones first (10 over 4 ranks: 3, 3, 2, 2).
    """
    raise NotImplementedError("ch16: [start, end) of rank `rank`'s block when `total` items are split over `size` ranks.")


@dataclass(frozen=True)
class HeadShard:
    """The attention heads one rank computes: query heads [q_start, q_end), KV heads
    [kv_start, kv_end). Query head h reads KV head h // (num_heads // num_kv_heads)."""

    q_start: int
    q_end: int
    kv_start: int
    kv_end: int

    @property
    def num_heads(self) -> int:
        return self.q_end - self.q_start

    @property
    def num_kv_heads(self) -> int:
        return self.kv_end - self.kv_start


def head_shard(num_heads: int, num_kv_heads: int, tp: DistributedInfo) -> HeadShard:
    """The query and KV heads rank `tp.rank` computes, whole KV groups where possible.

    With at least as many KV heads as ranks, split the KV heads with `split_range` and take
    their query heads (group = num_heads // num_kv_heads of them each). With fewer, rank r
    keeps KV head r * num_kv_heads // size (a copy, shared with its neighbours) and
    `split_range`s that head's group of query heads with the other ranks sharing it.
    """
    raise NotImplementedError("ch16: The query and KV heads rank `tp.rank` computes, whole KV groups where possible.")


def vocab_block(vocab_size: int, tp: DistributedInfo) -> tuple[int, int, int]:
    """This rank's vocabulary block as (start, end, padded), the same padded width on all ranks.

    Ids [start, end) are this rank's; every rank holds `padded` = ceil(vocab_size / size) rows,
    so blocks start at rank * padded, and the last block's rows past vocab_size are padding.
    """
    raise NotImplementedError("ch16: This rank's vocabulary block as (start, end, padded), the same padded width on all ranks.")
