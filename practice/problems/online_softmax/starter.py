"""Problem 221: online softmax over blocks of keys."""

from __future__ import annotations

import math


def online_attention(scores: list[float], values: list[float], block: int) -> tuple[float, float]:
    """(softmax-weighted mean of values, log-sum-exp of scores), walking `block` keys at a time."""
    raise NotImplementedError("walk the keys block by block with a running max, sum and values")
