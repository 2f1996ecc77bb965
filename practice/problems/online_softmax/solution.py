"""Problem 221: online softmax over blocks of keys."""

from __future__ import annotations

import math


def online_attention(scores: list[float], values: list[float], block: int) -> tuple[float, float]:
    """(softmax-weighted mean of values, log-sum-exp of scores), walking `block` keys at a time."""
    m, total, acc = -math.inf, 0.0, 0.0
    for start in range(0, len(scores), block):
        s_block, v_block = scores[start : start + block], values[start : start + block]
        m_new = max(m, max(s_block))
        alpha = math.exp(m - m_new)
        weights = [math.exp(s - m_new) for s in s_block]
        total = total * alpha + sum(weights)
        acc = acc * alpha + sum(w * v for w, v in zip(weights, v_block))
        m = m_new
    return acc / total, m + math.log(total)
