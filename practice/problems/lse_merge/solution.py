"""Problem 222: merging split-KV partial outputs by their log-sum-exps."""

from __future__ import annotations

import math


def merge_partials(partials: list[tuple[float, float]]) -> float:
    """The softmax output over every chunk's keys, from each chunk's (output, lse)."""
    top = max(lse for _, lse in partials)
    if top == -math.inf:
        return 0.0
    weights = [math.exp(lse - top) for _, lse in partials]
    return sum(w * out for w, (out, _) in zip(weights, partials)) / sum(weights)
