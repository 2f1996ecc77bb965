"""Seeded workloads: how many requests, how long each prompt and output is, which token ids.

A benchmark compares two systems on the same work, so the work is drawn from a seeded random
generator: the same seed gives the same prompts and lengths in every run, on every machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int
    input_lens: tuple[int, int]  # a prompt's length, uniform in [low, high]
    output_lens: tuple[int, int]  # a request's max_tokens, uniform in [low, high]
    token_ids: tuple[int, int] = (0, 9999)  # a prompt's ids, uniform in [low, high]


WORKLOADS: dict[str, WorkloadSpec] = {
    "uniform": WorkloadSpec(32, (64, 64), (64, 64)),
    "mixed": WorkloadSpec(64, (16, 256), (16, 256)),
    # The official configuration of mini-sglang's offline benchmark. Its ids are
    # randint(0, 10000), drawn in the order of nano-vllm's bench.py (which mini-sglang's adapts),
    # so the token counts match that benchmark's: 142,827 input and 133,966 output with seed 0.
    "official": WorkloadSpec(256, (100, 1024), (100, 1024), token_ids=(0, 10000)),
    # One request alone, a 512-token prompt and 512 new tokens: the time per output token a
    # single user sees (its decode steps, at batch 1).
    "single": WorkloadSpec(1, (512, 512), (512, 512)),
}


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def input_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def longest(self) -> int:
        """The longest sequence (prompt plus output) of the workload."""
        return max(len(p) + o for p, o in zip(self.prompts, self.output_lens))

    def first(self, count: int) -> Workload:
        """The workload's first `count` requests (a quick run of the same kind of work)."""
        return Workload(self.prompts[:count], self.output_lens[:count])


def make_workload(spec: WorkloadSpec, seed: int) -> Workload:
    """Draw the workload of `spec` from a generator seeded with `seed`: prompts, then lengths.

    One `random.Random(seed)`, never the global generator (anything else that draws from it
    would change the workload). Draw in this order, so every run and the upstream benchmarks
    get the same numbers: for each request its prompt length (`randint` over `input_lens`,
    both ends included) and then that many ids (`randint` over `token_ids`); after all the
    prompts, each request's output length (`randint` over `output_lens`).
    """
    raise NotImplementedError("ch21: Draw the workload of `spec` from a generator seeded with `seed`: prompts, then lengths.")
