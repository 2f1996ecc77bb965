"""Problem 164: row-parallel partial sums, and where the bias goes."""

from __future__ import annotations


def row_parallel(
    x: list[float], weight: list[list[float]], bias: list[float], size: int
) -> list[list[float]]:
    """Every simulated rank's output after the all-reduce: x W^T + bias, from partial sums."""
    raise NotImplementedError("partial products, all-reduce, bias")
