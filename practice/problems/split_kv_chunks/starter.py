"""Problem 223: the chunks of split-KV decode."""

from __future__ import annotations


def chunk_bounds(seq_len: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """(start, end) of each of the num_splits chunks of seq_len keys, in whole blocks."""
    raise NotImplementedError("cut seq_len keys into num_splits chunks of whole blocks")


def busiest_program(seq_lens: list[int], num_splits: int, block_n: int) -> int:
    """The most keys one program of the launch reads."""
    raise NotImplementedError("the longest chunk over every request of the batch")
