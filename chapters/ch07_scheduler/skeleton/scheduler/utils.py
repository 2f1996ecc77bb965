"""Requests waiting to be admitted, and what the scheduler reports for each generated token."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.core import SamplingParams
from minisgl.kvcache import BaseCacheHandle


@dataclass(eq=False)
class PendingReq:
    """A request in the waiting queue: its prompt, and its progress if it is being chunked."""

    uid: int
    input_ids: torch.Tensor  # the whole prompt, CPU int32
    sampling_params: SamplingParams
    # Set once the first chunk is admitted (chapter 10): the row and cache handle it keeps,
    # and how many prompt tokens are already in the KV cache.
    table_idx: int | None = None
    cache_handle: BaseCacheHandle | None = None
    cached_len: int = 0

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def output_len(self) -> int:
        return self.sampling_params.max_tokens


@dataclass(frozen=True)
class TokenOutput:
    """One generated token of one request, as the scheduler reports it."""

    uid: int
    token: int
    finished: bool


@dataclass
class SchedulerStats:
    """What the scheduler did, for examples, benchmarks and tests."""

    prompt_tokens: int = 0  # prompt tokens of all requests added
    computed_prompt_tokens: int = 0  # of those, computed by prefill (not found in the cache)
    generated_tokens: int = 0
    steps: list[tuple[str, int, int]] = field(default_factory=list)  # (phase, requests, tokens)

    @property
    def prefill_steps(self) -> int:
        return sum(1 for phase, _, _ in self.steps if phase == "prefill")

    @property
    def decode_steps(self) -> int:
        return sum(1 for phase, _, _ in self.steps if phase == "decode")
