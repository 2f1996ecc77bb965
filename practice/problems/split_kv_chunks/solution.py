"""Problem 223: the chunks of split-KV decode."""

from __future__ import annotations


def chunk_bounds(seq_len: int, num_splits: int, block_n: int) -> list[tuple[int, int]]:
    """(start, end) of each of the num_splits chunks of seq_len keys, in whole blocks."""
    per_split = -(-seq_len // num_splits)
    chunk = -(-per_split // block_n) * block_n
    return [(min(s * chunk, seq_len), min((s + 1) * chunk, seq_len)) for s in range(num_splits)]


def busiest_program(seq_lens: list[int], num_splits: int, block_n: int) -> int:
    """The most keys one program of the launch reads."""
    return max(end - start for n in seq_lens for start, end in chunk_bounds(n, num_splits, block_n))
