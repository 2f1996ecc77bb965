def static_batching(output_lens: list[int], batch_size: int) -> tuple[int, int]:
    """(decode steps, tokens computed) when batches run one after another to their longest."""
    raise NotImplementedError("split into batches in order; each runs to its longest request")


def continuous_batching(output_lens: list[int], slots: int) -> int:
    """Decode steps when a finished request's slot goes to the next waiting one at once."""
    raise NotImplementedError("simulate: fill free slots, every running request makes a token")
