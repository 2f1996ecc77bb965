import random


def make_workload(
    num_requests: int,
    input_lens: tuple[int, int],
    output_lens: tuple[int, int],
    token_ids: tuple[int, int],
    seed: int,
) -> tuple[list[list[int]], list[int]]:
    """Seeded prompts (each: its length, then its ids), then every output length."""
    rng = random.Random(seed)
    prompts = [
        [rng.randint(*token_ids) for _ in range(rng.randint(*input_lens))]
        for _ in range(num_requests)
    ]
    return prompts, [rng.randint(*output_lens) for _ in range(num_requests)]
