"""The Scheduler: the loop that turns waiting requests into batches, and results into outputs.

It owns no resource itself; it only orchestrates the managers that do:

- PrefillManager: the waiting queue and admission (PrefillAdder), chunking long prompts;
- DecodeManager: the running requests;
- CacheManager: KV pages and the prefix cache;
- TableManager: page-table rows and the token pool;
- Engine: one forward of one batch.

One iteration: pick the next batch, give it pages, run it, then process the results of a
batch: append each sampled token, finish requests (EOS or max_tokens) and free what they held.
With overlap scheduling the results processed are those of the *previous* batch, so that on a
GPU the CPU's bookkeeping runs while the device computes the next batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import Engine
from minisgl.env import ENV
from minisgl.scheduler.cache import CacheManager, create_prefix_cache
from minisgl.scheduler.config import SchedulerConfig
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import ChunkedReq, PrefillManager
from minisgl.scheduler.table import TableManager
from minisgl.scheduler.utils import PendingReq, SchedulerStats, TokenOutput


class ForwardData(NamedTuple):
    """A launched batch and its sampled tokens, on their way to the CPU."""

    batch: Batch
    next_tokens_host: torch.Tensor  # valid once `copy_done` has completed
    copy_done: torch.cuda.Event | None  # None on the CPU, where the copy is immediate


def start_copy_to_host(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Queue the device-to-host copy of the sampled tokens right behind the sampling.

    Waiting on this event (not on the whole device) is what lets overlap work on a GPU: the
    copy of batch N completes before batch N+1's kernels, which were queued after it.
    """
    if tokens.device.type == "cpu":
        return tokens, None
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        self.table_manager = TableManager(config.max_running_req, self.engine.page_table)
        prefix_cache = create_prefix_cache(config.cache_type, self.engine.device, config.page_size)
        self.cache_manager = CacheManager(self.engine.num_pages, config.page_size,
                                          self.engine.page_table, prefix_cache)
        self.decode_manager = DecodeManager(config.page_size)
        self.prefill_manager = PrefillManager(self.cache_manager, self.table_manager,
                                              self.decode_manager)
        self.eos_token_ids = set(self.engine.model_config.eos_token_ids)
        self.overlap = (not ENV.DISABLE_OVERLAP if config.enable_overlap is None
                        else config.enable_overlap)
        self.stats = SchedulerStats()
        self._next_uid = 0
        self._last_phase: str | None = None
        self._last_data: ForwardData | None = None  # launched, results not yet processed
        self._finished_last_round: set[Req] = set()

    # ----- requests in ----------------------------------------------------------------------

    def add_request(self, input_ids: list[int] | torch.Tensor,
                    sampling_params: SamplingParams) -> int:
        """Queue a request; returns its uid. Raises (and queues nothing) if it can never run."""
        raise NotImplementedError("ch07: Queue a request; returns its uid. Raises (and queues nothing) if it can never run.")

    @property
    def has_work(self) -> bool:
        return (self.prefill_manager.runnable or self.decode_manager.runnable
                or self._last_data is not None)

    # ----- the loop -------------------------------------------------------------------------

    def step(self) -> list[TokenOutput]:
        """One iteration of the scheduling loop; returns the tokens it produced."""
        raise NotImplementedError("ch07: One iteration of the scheduling loop; returns the tokens it produced.")

    def normal_step(self) -> list[TokenOutput]:
        """Schedule a batch, run it, process its results: the CPU waits for every forward."""
        raise NotImplementedError("ch07: Schedule a batch, run it, process its results: the CPU waits for every forward.")

    def overlap_step(self) -> list[TokenOutput]:
        """Launch batch N+1, then process batch N while the device computes N+1.

        Batch N+1 is scheduled from the ledgers alone: its decode inputs are the tokens batch
        N wrote into the token pool on the device, so nothing waits for the CPU to see them.
        Two hazards follow. A request that hits EOS in batch N is already in batch N+1: its
        extra token is dropped (`_finished_last_round`). And "done after max_tokens" must count
        the tokens the CPU has seen, not the ledger, which runs one step ahead.
        """
        raise NotImplementedError("written in chapter 11: Launch batch N+1, then process batch N while the device computes N+1.")

    def run_when_idle(self) -> None:
        """Nothing runs: every page must be free or cached. A leak is caught here, early."""
        self.cache_manager.check_integrity()

    def _schedule_next_batch(self) -> Batch | None:
        """Prefill first, to admit waiting requests soon; but right after a prefill, give the
        running requests a decode step, so that a long (chunked) prompt cannot stall them."""
        raise NotImplementedError("ch07: Prefill first, to admit waiting requests soon; but right after a prefill, give the")

    def _forward(self, batch: Batch) -> ForwardData:
        """Run a scheduled batch: write prompts, build inputs, forward, advance ledgers."""
        raise NotImplementedError("ch07: Run a scheduled batch: write prompts, build inputs, forward, advance ledgers.")

    def _process_results(self, data: ForwardData | None) -> list[TokenOutput]:
        """Append sampled tokens, finish requests at EOS or max_tokens, free or cache their KV."""
        raise NotImplementedError("ch07: Append sampled tokens, finish requests at EOS or max_tokens, free or cache their KV.")
