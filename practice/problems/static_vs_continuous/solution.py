def static_batching(output_lens: list[int], batch_size: int) -> tuple[int, int]:
    """(decode steps, tokens computed) when batches run one after another to their longest."""
    batches = [output_lens[i : i + batch_size] for i in range(0, len(output_lens), batch_size)]
    return sum(max(b) for b in batches), sum(max(b) * len(b) for b in batches)


def continuous_batching(output_lens: list[int], slots: int) -> int:
    """Decode steps when a finished request's slot goes to the next waiting one at once."""
    waiting, running, steps = list(output_lens), [], 0
    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.pop(0))
        running = [left - 1 for left in running if left > 1]
        steps += 1
    return steps
