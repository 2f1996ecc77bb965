"""Problem 3: what each forward call of the tiny engine's greedy loop sees."""

from __future__ import annotations


def forward_calls(
    prompt_len: int, max_new_tokens: int, eos_at: int | None = None
) -> list[tuple[int, int]]:
    """(first position, number of tokens) of every forward call of the greedy loop.

    eos_at: index among the generated tokens of the first EOS, or None (never).
    """
    generated = max_new_tokens if eos_at is None else min(max_new_tokens, eos_at + 1)
    calls = []
    for i in range(generated):
        # Call 0 is the prefill of the whole prompt; call i > 0 feeds back token i - 1, which
        # sits right after the prompt and the i - 1 tokens fed before it.
        calls.append((0, prompt_len) if i == 0 else (prompt_len + i - 1, 1))
    return calls
