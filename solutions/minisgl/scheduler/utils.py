"""Requests waiting to be admitted, and what the scheduler reports: each generated token, its
counters, and a snapshot of its state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

from minisgl.core import SamplingParams

if TYPE_CHECKING:
    from minisgl.scheduler.prefill import ChunkedReq

FinishReason = Literal["stop", "length"]


@dataclass(eq=False)
class PendingReq:
    """A request in the waiting queue: its prompt, and its last chunk if it is being chunked."""

    uid: int
    input_ids: torch.Tensor  # the whole prompt, CPU int32
    sampling_params: SamplingParams
    # Set by the PrefillManager when a chunk of the prompt is admitted (chapter 10): the
    # chunk holds the row, the pages and the cache handle that the next chunk goes on with.
    chunked_req: ChunkedReq | None = None

    @property
    def input_len(self) -> int:
        return len(self.input_ids)

    @property
    def output_len(self) -> int:
        return self.sampling_params.max_tokens


@dataclass(slots=True)
class TokenOutput:
    """One generated token of one request, as the scheduler reports it.

    finish_reason is None while the request goes on; on its last token it says why it ended:
    "stop" (it sampled an end-of-sequence token) or "length" (it reached max_tokens).
    Not a frozen dataclass: the scheduler makes one per token, and a frozen one takes three
    times as long to make (its __init__ goes through object.__setattr__).
    """

    uid: int
    token: int
    finish_reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


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


@dataclass(frozen=True)
class SchedulerStatus:
    """A snapshot of the scheduler, e.g. for a /metrics endpoint (`Scheduler.status()`)."""

    running: int  # requests in the decode set
    waiting: int  # requests in the queue, a chunked one included
    free_pages: int
    cached_pages: int  # pages held by the prefix cache (evictable or locked)
    used_pages: int  # pages held by requests and not (yet) cached
    num_pages: int
    generated_tokens: int
    integrity_ok: bool | None  # the last idle integrity check's verdict; None before the first
