"""Problem 13: validate sampling parameters, and tell greedy from random sampling."""

from __future__ import annotations


def check_sampling_params(temperature: float, top_k: int, top_p: float, max_tokens: int) -> None:
    """Raise ValueError naming the field if any value is invalid."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k != -1 and top_k < 1:
        raise ValueError(f"top_k must be -1 (off) or >= 1, got {top_k}")


def is_greedy(temperature: float, top_k: int) -> bool:
    """Whether sampling with these settings always picks the most likely token."""
    return temperature == 0.0 or top_k == 1
