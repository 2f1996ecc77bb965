"""Problem 13: validate sampling parameters, and tell greedy from random sampling."""

from __future__ import annotations


def check_sampling_params(temperature: float, top_k: int, top_p: float, max_tokens: int) -> None:
    """Raise ValueError naming the field if any value is invalid."""
    raise NotImplementedError("check each field, raising ValueError that names it")


def is_greedy(temperature: float, top_k: int) -> bool:
    """Whether sampling with these settings always picks the most likely token."""
    raise NotImplementedError("which settings leave exactly one candidate?")
