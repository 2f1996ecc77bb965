"""Problem 163: a vocabulary-parallel embedding lookup."""

from __future__ import annotations


def rank_lookup(ids: list[int], shard: list[list[float]], start: int) -> list[list[float]]:
    """One rank's rows: the row of each id it holds, zeros for the others."""
    raise NotImplementedError("look up the ids this rank holds")


def vocab_parallel_lookup(
    ids: list[int], shards: list[list[list[float]]], block: int
) -> list[list[float]]:
    """Every rank's rank_lookup, summed element-wise (the all-reduce)."""
    raise NotImplementedError("combine the ranks' lookups")
