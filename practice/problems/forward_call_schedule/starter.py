"""Problem 3: what each forward call of the tiny engine's greedy loop sees."""

from __future__ import annotations


def forward_calls(
    prompt_len: int, max_new_tokens: int, eos_at: int | None = None
) -> list[tuple[int, int]]:
    """(first position, number of tokens) of every forward call of the greedy loop.

    eos_at: index among the generated tokens of the first EOS, or None (never).
    """
    raise NotImplementedError("list the loop's forward calls: prefill once, then decode")
