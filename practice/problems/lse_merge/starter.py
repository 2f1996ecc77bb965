"""Problem 222: merging split-KV partial outputs by their log-sum-exps."""

from __future__ import annotations

import math


def merge_partials(partials: list[tuple[float, float]]) -> float:
    """The softmax output over every chunk's keys, from each chunk's (output, lse)."""
    raise NotImplementedError("weigh each chunk's output by exp(lse - max lse), normalised")
