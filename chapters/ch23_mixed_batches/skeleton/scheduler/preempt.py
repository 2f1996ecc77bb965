"""Optimistic admission, and preemption by recompute when the KV pool runs out.

Chapter 8's admission reserves each request's worst case: its prompt, all max_tokens of output
and a page of slack. Most requests stop long before max_tokens, so most of that reservation is
never used. Optimistic admission reserves only what a request takes now, its prompt and a page,
plus a page for each running request's next token. The pool then fills up, and a decode step
may find no free page: the scheduler preempts a request to make room. Its pages are given back
(or cached in the radix tree, so the recompute is cheap), and it goes back to the front of the
queue as a new prompt: the old prompt plus every token it generated. Greedy decoding gives it
the same tokens as if it had never stopped (and a seeded request too: its draws depend on its
seed and position only).

No request is preempted twice. A preempted request comes back with chapter 8's conservative
admission (its worst case must fit beside the running requests' worst case) and is never
chosen again: the requests admitted optimistically after it are the ones preempted, and once
they are gone, what it was promised is there. So every request finishes, and the number of
preemptions is at most the number of requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minisgl.core import Req
from minisgl.scheduler.prefill import PrefillAdder, PrefillManager
from minisgl.scheduler.utils import PendingReq
from minisgl.utils import div_ceil

if TYPE_CHECKING:
    from minisgl.scheduler.config import SchedulerConfig
    from minisgl.scheduler.scheduler import Scheduler


@dataclass(eq=False)
class ResumedReq(PendingReq):
    """A preempted request back in the queue: its prompt is the old prompt and every token it
    generated, and it may generate `remaining` more (max_tokens minus those)."""

    remaining: int = field(kw_only=True)

    @property
    def output_len(self) -> int:
        return self.remaining


def resume(req: Req) -> ResumedReq:
    """Build the queue entry that recomputes a preempted request from its host-side tokens.

    Its prompt is `req.input_ids` (the prompt and the tokens the CPU has seen; with overlap, a
    token still in flight is not among them: it is dropped and sampled again). It keeps the
    uid and the sampling parameters, holds nothing (no chunk), and its `remaining` keeps the
    request's end where it was: len(prompt) + remaining == req.max_device_len.
    """
    raise NotImplementedError("ch23: Build the queue entry that recomputes a preempted request from its host-side tokens.")


def pages_needed(reqs: list[Req], page_size: int) -> int:
    """Count the pages the next forward of `reqs` allocates.

    For each request, the pages from where its cached tokens end (`ceil(cached_len / page)`)
    up to where its new tokens end (`ceil(device_len / page)`): exactly what
    `CacheManager.allocate_paged` takes."""
    raise NotImplementedError("ch23: Count the pages the next forward of `reqs` allocates.")


class OptimisticAdder(PrefillAdder):
    """Admits a request while its prompt fits now: the output's KV is found when it is needed,
    by preempting if need be. `reserved_size` starts at a page per running request (the page
    its next token may open)."""

    def worst_case_tokens(self, pending_req: PendingReq, cached_len: int) -> int:
        """Reserve the prompt the request does not hold yet and one page, not its output.

        What it holds is `cached_len` rounded up to whole pages; the page covers the rounding
        up of its last prompt page, or the page its first output token opens. The rest of the
        output is found when it is needed, by preempting if need be."""
        raise NotImplementedError("ch23: Reserve the prompt the request does not hold yet and one page, not its output.")


class OptimisticPrefillManager(PrefillManager):
    """The waiting queue with optimistic admission, and a way back in for preempted requests."""

    def new_adder(self, prefill_budget: int) -> PrefillAdder:
        """Make an OptimisticAdder, or chapter 8's adder if a preempted request heads the queue.

        A ResumedReq at the head comes back with its worst case reserved beside the running
        requests' worst case (`super().new_adder`). Otherwise the OptimisticAdder reserves
        one page per running request (`page_size * len(running_reqs)`), the page its next
        token may open."""
        raise NotImplementedError("ch23: Make an OptimisticAdder, or chapter 8's adder if a preempted request heads the queue.")

    def requeue(self, resumed: ResumedReq) -> None:
        """Put a preempted request at the front of the queue.

        At index 0, or at index 1 behind a head whose `chunked_req` is set: a prompt half-way
        through its chunks keeps the head until its last chunk (chapter 10)."""
        raise NotImplementedError("ch23: Put a preempted request at the front of the queue.")


def optimistic_prefill_manager(config: SchedulerConfig) -> type[PrefillManager] | None:
    """The prefill manager for `admission="optimistic"` (a row of features.PREFILL_MANAGERS);
    None for chapter 8's conservative admission."""
    return OptimisticPrefillManager if config.admission == "optimistic" else None


class Preemptor:
    """Makes room for a decode step by preempting requests, newest first, each at most once."""

    def __init__(self, scheduler: Scheduler, prefill_manager: OptimisticPrefillManager) -> None:
        self.scheduler = scheduler
        self.prefill_manager = prefill_manager
        self.page_size = scheduler.cache_manager.page_size
        self.protected: set[int] = set()  # uids preempted once, still waiting or running
        self.preemptions = 0  # since the start, for the stats

    def make_room(self, reqs: list[Req]) -> list[Req]:
        """Preempt requests until the decode step of `reqs` fits; return those that stay.

        The requests that stay keep their order. While `pages_needed(reqs) * page_size`
        exceeds the cache manager's available_size, preempt `victim(reqs)` and drop it from
        the step. No victim left means admission broke its promise to the preempted requests:
        raise RuntimeError.
        """
        raise NotImplementedError("ch23: Preempt requests until the decode step of `reqs` fits; return those that stay.")

    def victim(self, reqs: list[Req]) -> Req | None:
        """Choose the next request to preempt: the newest one never preempted, or None.

        Never preempted: its uid is not in `protected`. First a prompt half-way through its
        chunks (the queue head's `chunked_req`: it was admitted last), then the newest of
        `reqs` (the last in admission order)."""
        raise NotImplementedError("ch23: Choose the next request to preempt: the newest one never preempted, or None.")

    def preempt(self, req: Req) -> None:
        """Stop `req`, give back what it holds, and queue it again to be recomputed.

        A running request leaves the running set and comes back as `resume(req)`; a chunk
        leaves the queue's head, whose whole prompt comes back as a ResumedReq with all its
        max_tokens. Either way the scheduler releases the request (`release`: it leaves the
        running set, its row is freed, its KV handed to the prefix cache unlocked, and a token
        a launched batch still samples for it is dropped) and the entry goes back to the front
        of the queue (`requeue`). Its uid becomes protected (forget those of requests that are
        neither waiting nor running any more), and the preemption is counted.
        """
        raise NotImplementedError("ch23: Stop `req`, give back what it holds, and queue it again to be recomputed.")
