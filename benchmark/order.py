"""The order of a round's runs: rotated by one place each round.

A run's place in a sequence may change its figure: on 2026-12-07 the hybrid attention backend
ran after FlashInfer in every round of `python -m benchmark offline --repeat` and lost each
one, while in two of the three comparisons where it ran first the two tied
(benchmark/gpu_report.md, "2026-12-07, day"). Rotating the order from round to round gives
every run each place in turn.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def rotated(runs: list[T], round_index: int) -> list[T]:
    """`runs` rotated left by `round_index` places (round 0 keeps the given order)."""
    if not runs:
        return []
    shift = round_index % len(runs)
    return runs[shift:] + runs[:shift]
