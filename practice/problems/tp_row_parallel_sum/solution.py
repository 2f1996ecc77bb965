"""Problem 164: row-parallel partial sums, and where the bias goes."""

from __future__ import annotations


def row_parallel(
    x: list[float], weight: list[list[float]], bias: list[float], size: int
) -> list[list[float]]:
    """Every simulated rank's output after the all-reduce: x W^T + bias, from partial sums."""
    base, extra = divmod(len(x), size)
    partials = []
    for rank in range(size):
        start = rank * base + min(rank, extra)
        cols = range(start, start + base + (1 if rank < extra else 0))
        partials.append([sum(x[c] * row[c] for c in cols) for row in weight])
    total = [sum(values) for values in zip(*partials)]  # the all-reduce
    return [[t + b for t, b in zip(total, bias)] for _ in range(size)]
