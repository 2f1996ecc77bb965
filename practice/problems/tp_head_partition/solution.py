"""Problem 161: share attention heads among tensor-parallel ranks."""

from __future__ import annotations


def split(total: int, size: int, rank: int) -> range:
    """Rank `rank`'s block of `total` items cut into `size` blocks, longer blocks first."""
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def partition_heads(num_heads: int, num_kv_heads: int, size: int) -> list[tuple[range, range]]:
    """(query heads, KV heads) of each rank, in rank order; ValueError if size > num_heads."""
    if size > num_heads:
        raise ValueError(f"{size} ranks but only {num_heads} query heads")
    group = num_heads // num_kv_heads
    shards = []
    for rank in range(size):
        if num_kv_heads >= size:
            kv = split(num_kv_heads, size, rank)
            shards.append((range(kv.start * group, kv.stop * group), kv))
            continue
        k = rank * num_kv_heads // size
        sharing = [r for r in range(size) if r * num_kv_heads // size == k]
        q = split(group, len(sharing), rank - sharing[0])
        shards.append((range(k * group + q.start, k * group + q.stop), range(k, k + 1)))
    return shards
