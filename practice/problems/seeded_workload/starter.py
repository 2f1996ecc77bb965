import random


def make_workload(
    num_requests: int,
    input_lens: tuple[int, int],
    output_lens: tuple[int, int],
    token_ids: tuple[int, int],
    seed: int,
) -> tuple[list[list[int]], list[int]]:
    """Seeded prompts (each: its length, then its ids), then every output length."""
    raise NotImplementedError("one random.Random(seed); prompts first, then output lengths")
