"""Every reach of the benchmarks into the scheduler's internals, in one module.

The scheduler's loop (`Scheduler.step`) is its API; how a step picks, launches and settles a
batch, and how the batch policies of chapters 23 and 24 hang off it, are not, and they get
renamed. A benchmark that times or drives those parts goes through the functions here, so a
rename of the scheduler's internals changes this module alone.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from safetensors import safe_open

from minisgl.models.config import ModelConfig

if TYPE_CHECKING:
    from minisgl.engine import ForwardOutput
    from minisgl.scheduler import Scheduler
    from minisgl.scheduler.scheduler import ForwardInput

# StepClock.table(): phase, batch sizes, steps, seconds, seconds of each part, KV tokens read
StepTable = list[tuple[str, str, int, float, dict[str, float], int]]
# The function that settles a launched batch (its tokens, per request), as (file suffix, name):
# cProfile finds it by these (benchmark/cpu_step.py's "results, per request").
SETTLE_FUNCTION = ("scheduler/scheduler.py", "settle_batch")


def schedule(scheduler: Scheduler) -> ForwardInput | None:
    """Pick and prepare the next batch by hand, as the scheduler's own loop would."""
    return scheduler._schedule_next_batch()


def launch(scheduler: Scheduler, forward_input: ForwardInput) -> ForwardOutput:
    """Launch a batch picked by `schedule` (its forward and sampling, queued on the device)."""
    return scheduler.policy.run_batch(forward_input)


def settle(scheduler: Scheduler, forward_input: ForwardInput, output: ForwardOutput) -> None:
    """Process a launched batch's results (tokens, finished requests), waiting for them."""
    scheduler.policy.settle_batch((forward_input, output))


def layer_attribute(scheduler: Scheduler, name: str) -> Any | None:
    """The attribute `name` of the outermost layer of the scheduler's step policy that has one
    (the layers wrap each other through `inner`, down to the scheduler), or None."""
    policy: Any = scheduler.policy
    while policy is not scheduler:
        if hasattr(policy, name):
            return getattr(policy, name)
        policy = policy.inner
    return None


def preemptor(scheduler: Scheduler) -> Any | None:
    """Chapter 23's preemptor (its `preemptions` count), or None where optimistic admission is
    off."""
    return layer_attribute(scheduler, "preemptor")


def speculative_stats(scheduler: Scheduler) -> Any | None:
    """Chapter 24's counters (`drafted`, `accepted`), or None where drafts are off."""
    return layer_attribute(scheduler, "stats")


class StepClock:
    """Records every scheduler step of the last `LLM.generate` run inside it (the timed one: the
    warm-up's steps are dropped): the phase and size of the batch the step launched, its wall
    time, and how that time splits into the step's parts. With overlap, a step schedules and
    launches batch N+1, then waits for batch N's tokens and processes them: a step that waits
    long is bound by the device, one that hardly waits by the host. It also counts the KV
    tokens each launched batch's attention reads (the sum of its requests' `device_len`), which
    with the weights make a decode step's bytes, and so its floor (`decode_floor_s`)."""

    BUCKETS = (1, 16, 64, 128, 192, 256, 10**9)
    PARTS = ("schedule", "launch", "wait", "process")  # with overlap, in this order

    def __init__(self) -> None:
        self.steps: list[tuple[str, int, float, dict[str, float], int]] = []
        self._parts: dict[str, float] = {}
        self._kv_tokens = 0

    def _timed(self, part: str, function: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        def timed(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                clock._parts[part] = clock._parts.get(part, 0.0) + elapsed

        return timed

    def __enter__(self) -> StepClock:
        from minisgl.llm import LLM
        from minisgl.scheduler import Scheduler

        clock = self
        step, process = Scheduler.step, Scheduler.settle_batch

        def timed_step(scheduler: Scheduler) -> list:
            launched = len(scheduler.stats.steps)
            clock._parts, clock._kv_tokens = {}, 0
            start = time.perf_counter()
            outputs = step(scheduler)
            seconds = time.perf_counter() - start
            phase, size = ("idle", 0)
            if len(scheduler.stats.steps) > launched:
                phase, size, _ = scheduler.stats.steps[-1]
            clock.steps.append((phase, size, seconds, clock._parts, clock._kv_tokens))
            return outputs

        timed_launch = self._timed("launch", Scheduler.run_batch)

        def counted_launch(scheduler: Scheduler, forward_input: ForwardInput) -> ForwardOutput:
            clock._kv_tokens = sum(req.device_len for req in forward_input.batch.reqs)
            return timed_launch(scheduler, forward_input)

        def waiting_process(scheduler: Scheduler, data: Any) -> list:
            # the wait for the device, timed apart from the processing that follows it
            if data is not None and data[1].copy_done_event is not None:
                clock._timed("wait", data[1].copy_done_event.synchronize)()
            return clock._timed("process", process)(scheduler, data)

        generate = LLM.generate

        def fresh_generate(llm: LLM, *args: object, **kwargs: object) -> list:
            clock.steps.clear()
            return generate(llm, *args, **kwargs)

        self._patches = [
            mock.patch.object(Scheduler, "step", timed_step),
            mock.patch.object(
                Scheduler,
                "_schedule_next_batch",
                self._timed("schedule", Scheduler._schedule_next_batch),
            ),
            mock.patch.object(Scheduler, "run_batch", counted_launch),
            mock.patch.object(Scheduler, "settle_batch", waiting_process),
            mock.patch.object(LLM, "generate", fresh_generate),
        ]
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for patch in self._patches:
            patch.stop()

    @classmethod
    def summed_parts(cls, parts: Iterable[dict[str, float]]) -> dict[str, float]:
        """Seconds of each of PARTS over the given steps' parts (0 for a part none of them had)."""
        parts = list(parts)
        return {k: sum(part.get(k, 0.0) for part in parts) for k in cls.PARTS}

    def table(self) -> StepTable:
        """(phase, batch sizes, steps, seconds, seconds of each part, KV tokens read) for each
        phase and bucket of batch sizes that has steps (a step that launched nothing is in no
        bucket)."""
        rows = []
        for phase in ("prefill", "decode"):
            for low, high in zip(self.BUCKETS, self.BUCKETS[1:]):
                steps = [
                    (s, parts, kv)
                    for p, n, s, parts, kv in self.steps
                    if p == phase and low <= n < high
                ]
                if steps:
                    parts = self.summed_parts(part for _, part, _ in steps)
                    label = f"{low}-{high - 1}" if high < 10**9 else f"{low}+"
                    seconds, kv_tokens = sum(s for s, _, _ in steps), sum(kv for *_, kv in steps)
                    rows.append((phase, label, len(steps), seconds, parts, kv_tokens))
        return rows


# Peak memory bandwidth by GPU (bytes/s), for the floor of a decode step: NVIDIA's data sheets
# for the SXM parts, the H100 with HBM3 and the H200 with HBM3e.
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12}


def decode_floor_s(
    model: Path, dtype_bytes: int, device: str, steps: int, kv_tokens: int
) -> float | None:
    """The least time `steps` decode steps reading `kv_tokens` KV tokens in all could take on
    `device`: every step reads the weights once, and attention reads each KV token's K and V
    in every layer (`decode_bytes`). None for a device whose bandwidth BANDWIDTH does not know
    (the CPU)."""
    bandwidth = next((b for name, b in BANDWIDTH.items() if name in device), None)
    if bandwidth is None:
        return None
    step_bytes, token_bytes = decode_bytes(model, dtype_bytes)
    return (steps * step_bytes + kv_tokens * token_bytes) / bandwidth


@functools.cache
def decode_bytes(model: Path, dtype_bytes: int) -> tuple[int, int]:
    """(the weights' bytes a decode step reads, the K and V bytes of one token in every layer),
    read once per model. The weights are the checkpoint's parameters in `dtype_bytes`, a tied LM
    head once; an untied model's embedding table counts whole, though a step reads only its
    tokens' rows."""
    config = ModelConfig.from_dir(model)
    token_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes
    params = 0
    for file in model.glob("*.safetensors"):
        with safe_open(file, "pt") as tensors:  # reads the header, not the tensors
            params += sum(math.prod(tensors.get_slice(k).get_shape()) for k in tensors.keys())
    return params * dtype_bytes, token_bytes
