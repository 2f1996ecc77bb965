"""The Scheduler: the loop that turns waiting requests into batches, and results into outputs.

It owns no resource itself; it only orchestrates the managers that do:

- PrefillManager: the waiting queue and admission (PrefillAdder), chunking long prompts;
- DecodeManager: the running requests;
- CacheManager: KV pages and the prefix cache;
- TableManager: page-table rows and the token pool;
- Engine: one forward of one batch.

One iteration: pick the next batch, give it pages, run it, then settle the results of a
batch: append each sampled token, finish requests (EOS or max_tokens) and free what they held.
With overlap scheduling the results settled are those of the *previous* batch, so that on a
GPU the CPU's bookkeeping runs while the device computes the next batch. Picking, running and
settling go through the scheduler's step policy (`StepPolicy`): the scheduler itself, unless a
later chapter's policy wraps it (features.STEP_POLICIES).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from minisgl import features
from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine import BatchSamplingArgs, Engine, ForwardOutput
from minisgl.env import ENV
from minisgl.scheduler.cache import CacheManager, create_prefix_cache
from minisgl.scheduler.config import SchedulerConfig
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import ChunkedReq, PrefillManager
from minisgl.scheduler.table import TableManager
from minisgl.scheduler.utils import (
    FinishReason,
    PendingReq,
    SchedulerStats,
    SchedulerStatus,
    TokenOutput,
)
from minisgl.utils import InvalidRequestError


class ForwardInput(NamedTuple):
    """A scheduled batch, ready to run: its inputs filled in, its sampling arguments, and
    which of its requests bring a prompt (or a chunk of one) rather than decode."""

    batch: Batch
    sample_args: BatchSamplingArgs
    prompts: frozenset[Req]  # all of a prefill batch's requests, none of a decode batch's


ForwardData = tuple[ForwardInput, ForwardOutput]  # a launched batch and what it sampled


class StepPolicy(Protocol):
    """How each step's batch is picked, run and settled.

    Chapter 7's Scheduler is the innermost policy: prefill or decode (`pick_batch`), one
    forward (`run_batch`), one token per request (`settle_batch`). Each row of
    features.STEP_POLICIES, in its order, gets the new scheduler and the policy so far and
    returns the policy to use (the same one when its config does not ask for it): chapter 23's
    mixed batches and optimistic admission, then chapter 24's speculative decoding around
    them. A policy that makes batches of its own kind (a Batch subclass) runs and settles them
    itself, and passes every other batch on to the policy it wraps (`PolicyLayer`).
    """

    @property
    def allows_overlap(self) -> bool:
        """Whether the next batch may be picked before this one's results are settled."""
        ...

    def pick_batch(self) -> Batch | None: ...

    def run_batch(self, forward_input: ForwardInput) -> ForwardOutput: ...

    def settle_batch(self, data: ForwardData | None) -> list[TokenOutput]: ...


class PolicyLayer:
    """A step policy around another one: each part it does not change goes to `inner`."""

    def __init__(self, inner: StepPolicy) -> None:
        self.inner = inner

    @property
    def allows_overlap(self) -> bool:
        return self.inner.allows_overlap

    def pick_batch(self) -> Batch | None:
        return self.inner.pick_batch()

    def run_batch(self, forward_input: ForwardInput) -> ForwardOutput:
        return self.inner.run_batch(forward_input)

    def settle_batch(self, data: ForwardData | None) -> list[TokenOutput]:
        return self.inner.settle_batch(data)


class Scheduler:
    """The scheduling loop, driven one iteration at a time by `step()`.

    The API the layers above use (LLM.generate, the scheduler process of the server):
    `add_request`, `check_request_fits`, `abort_request`, `step`, `has_work`, `status`.
    What step policies use besides: `finish_reason`, `append_tokens`, `release`, and the
    managers (`cache_manager`, `table_manager`, `decode_manager`, `prefill_manager`).
    """

    allows_overlap = True  # as the innermost StepPolicy: chapter 7's steps may overlap

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        table_manager_type = features.first_offer(features.TABLE_MANAGERS, self.engine)
        self.table_manager: TableManager = (table_manager_type or TableManager)(
            config.max_running_req, self.engine.page_table
        )
        prefix_cache = create_prefix_cache(config.cache_type, self.engine.device, config.page_size)
        self.cache_manager = CacheManager(
            self.engine.num_pages, config.page_size, self.engine.page_table, prefix_cache
        )
        self.decode_manager = DecodeManager(config.page_size)
        prefill_manager_type = features.first_offer(features.PREFILL_MANAGERS, config)
        self.prefill_manager: PrefillManager = (prefill_manager_type or PrefillManager)(
            self.cache_manager, self.table_manager, self.decode_manager
        )
        self.eos_token_ids = set(self.engine.model_config.eos_token_ids)
        self.stats = SchedulerStats()
        self.finished_reqs: set[Req] = set()  # released while a launched batch may hold them
        self.pending_aborts: set[Req] = set()  # aborted; freed once no launched batch uses them
        self._next_uid = 0
        self._last_phase: str | None = None
        self._last_data: ForwardData | None = None  # launched, results not yet processed
        self._integrity_ok: bool | None = None
        self.policy: StepPolicy = self
        for part in features.STEP_POLICIES:
            self.policy = part.load()(self, self.policy)
        configured = (
            not ENV.DISABLE_OVERLAP_SCHEDULING
            if config.enable_overlap is None
            else config.enable_overlap
        )
        self.overlap = configured and self.policy.allows_overlap

    # ----- requests in and out --------------------------------------------------------------

    def check_request_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Raise InvalidRequestError (RequestTooLongError if too long) for a request that
        could never run: an empty prompt, or one longer than max_seq_len or the KV pool."""
        self.engine.check_request_fits(prompt_len, max_tokens)

    def add_request(
        self,
        input_ids: list[int] | torch.Tensor,
        sampling_params: SamplingParams,
        uid: int | None = None,
    ) -> int:
        """Queue a request; return its uid (the one given, or a new one).

        Raises InvalidRequestError or RequestTooLongError, and queues nothing, if the request
        can never run or if `uid` belongs to a request that is still waiting or running.
        """
        ids = torch.as_tensor(input_ids, dtype=torch.int32).flatten().cpu()
        self.check_request_fits(len(ids), sampling_params.max_tokens)
        if uid is None:
            uid = self._next_uid
        elif uid in self.decode_manager.running_reqs or any(
            p.uid == uid for p in self.prefill_manager.pending_list
        ):
            raise InvalidRequestError(f"request uid {uid} is already in use")
        self._next_uid = max(self._next_uid, uid + 1)
        self.stats.prompt_tokens += len(ids)
        self.prefill_manager.add_one_req(PendingReq(uid, ids, sampling_params))
        return uid

    def abort_request(self, uid: int) -> bool:
        """Remove a waiting or running request; False if no such request is waiting or running.

        An aborted request simply produces no more TokenOutputs: the last one it produced has
        finish_reason None, and whoever aborted it knows why it ended.
        Its row, pages and cache lock are freed at once, or, with overlap, as soon as no
        launched batch uses them: at the latest when the in-flight batch's results are
        processed.
        """
        pending_req = self.prefill_manager.abort_req(uid)
        if pending_req is not None:
            held = pending_req.chunked_req  # a chunked prompt holds a row, pages and a lock
        else:
            held = self.decode_manager.abort_req(uid)
            if held is None:
                return False
        if held is not None:
            self.pending_aborts.add(held)
            self._free_pending_aborts()
        return True

    @property
    def has_work(self) -> bool:
        return (
            self.prefill_manager.runnable
            or self.decode_manager.runnable
            or self._last_data is not None
        )

    def status(self) -> SchedulerStatus:
        """A snapshot of the queue, the KV pages and the counters."""
        cm = self.cache_manager
        cached_pages = cm.prefix_cache.size_info.total_size // cm.page_size
        return SchedulerStatus(
            running=len(self.decode_manager.running_reqs),
            waiting=len(self.prefill_manager.pending_list),
            free_pages=cm.num_free_pages,
            cached_pages=cached_pages,
            used_pages=cm.num_pages - cm.num_free_pages - cached_pages,
            num_pages=cm.num_pages,
            generated_tokens=self.stats.generated_tokens,
            integrity_ok=self._integrity_ok,
        )

    # ----- the loop -------------------------------------------------------------------------

    def step(self) -> list[TokenOutput]:
        """One iteration of the scheduling loop; returns the tokens it produced.

        Run `overlap_loop` when overlap is on, else `normal_loop`. When the iteration leaves
        nothing waiting or running (`has_work` is False), call `run_when_idle`, whose integrity
        check catches a leaked page right away."""
        outputs = self.overlap_loop() if self.overlap else self.normal_loop()
        if not self.has_work:
            self.run_when_idle()
        return outputs

    def normal_loop(self) -> list[TokenOutput]:
        """Schedule a batch, run it, process its results: the CPU waits for every forward."""
        forward_input = self._schedule_next_batch()
        if forward_input is None:
            return []
        return self.policy.settle_batch((forward_input, self.policy.run_batch(forward_input)))

    def overlap_loop(self) -> list[TokenOutput]:
        """Launch batch N+1, then process batch N while the device computes N+1.

        Keep the launched batch in `self._last_data` for the next call, and free the aborted
        requests that no launched batch uses any more (`_free_pending_aborts`) last.

        Batch N+1 is scheduled from the ledgers alone: its decode inputs are the tokens batch
        N wrote into the token pool on the device, so nothing waits for the CPU to see them.
        Two hazards follow. A request that hits EOS in batch N is already in batch N+1: its
        extra token is dropped (`finished_reqs`). And "done after max_tokens" must count the
        tokens the CPU has seen, not the ledger, which runs one step ahead.
        """
        forward_input = self._schedule_next_batch()
        ongoing = (forward_input, self.policy.run_batch(forward_input)) if forward_input else None
        outputs = self.policy.settle_batch(self._last_data)
        self._last_data = ongoing
        self._free_pending_aborts()
        return outputs

    def close(self) -> None:
        """Release what the scheduler holds beyond its engine: nothing, for one process (a
        scheduler of several ranks stops the others)."""

    def run_when_idle(self) -> None:
        """Nothing runs: every page must be free or cached. A leak is caught here, early."""
        try:
            self.cache_manager.check_integrity()
        except RuntimeError:
            self._integrity_ok = False
            raise
        self._integrity_ok = True

    def _schedule_next_batch(self) -> ForwardInput | None:
        """Pick the next batch (`self.policy.pick_batch()`) and prepare it (`_prepare_batch`);
        None when there is none. Record the phase of the batch picked."""
        batch = self.policy.pick_batch()
        if batch is None:
            return None
        self._last_phase = batch.phase
        return self._prepare_batch(batch)

    def pick_batch(self) -> Batch | None:
        """The next batch: a prefill batch of waiting requests, or a decode step of the running.

        Prefill first, to admit waiting requests soon; but right after a prefill, give the
        running requests a decode step, so that a long (chunked) prompt or a stream of arrivals
        cannot stall them."""
        prefill = lambda: self.prefill_manager.schedule_next_batch(self.config.max_extend_tokens)  # noqa: E731
        decode = self.decode_manager.schedule_next_batch
        if self._last_phase == "prefill" and self.decode_manager.runnable:
            return decode() or prefill()
        return prefill() or decode()

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        """Give the batch its pages, write its prompts, fill its inputs and metadata.

        Everything here is queued on the device without waiting: each piece of metadata is
        built on the host and copied once, so on a GPU this runs while the previous batch
        computes. The requests that are not running yet bring a prompt: those are written.
        """
        self.cache_manager.allocate_paged(batch.reqs)
        running = self.decode_manager.running_reqs
        prompts = frozenset(req for req in batch.reqs if req.uid not in running)
        for req in prompts:
            self.table_manager.write_prompt(req)
        self.stats.computed_prompt_tokens += sum(req.extend_len for req in prompts)
        self.table_manager.prepare_inputs(batch)
        self.engine.prepare_batch(batch)
        return ForwardInput(batch, self.engine.sampler.prepare(batch), prompts)

    def run_batch(self, forward_input: ForwardInput) -> ForwardOutput:
        """Run a prepared batch, store its sampled tokens in the token pool, advance ledgers."""
        batch = forward_input.batch
        output = self.engine.forward_batch(batch, forward_input.sample_args)
        self.table_manager.write_next_tokens(batch, output.next_tokens_gpu)
        self.stats.steps.append((batch.phase, batch.size, len(batch.input_ids)))
        # The ledgers move on now, before the tokens are known on the CPU: the next batch
        # can be scheduled from them while this one runs.
        for req in batch.reqs:
            req.complete_one()
        self.decode_manager.filter_reqs(batch.reqs)
        return output

    def finish_reason(self, req: Req, token: int) -> FinishReason | None:
        """Why the request ends with this token, or None if it goes on. Decided here only."""
        if not req.sampling_params.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if len(req.input_ids) >= req.max_device_len:
            return "length"
        return None

    def settle_batch(self, data: ForwardData | None) -> list[TokenOutput]:
        """Append sampled tokens, finish requests at EOS or max_tokens, free or cache their KV.

        Wait on the copy's event (the only wait for the device). The requests released while
        this batch was in flight are in `finished_reqs`: take that set and start a new one.
        Then, inside one `lazy_free_region`, for each request of the batch: skip a chunk, a
        request released meanwhile or one in `pending_aborts`; append its token
        (`append_tokens`). A request that finished is `release`d; one that goes on after its
        prompt (one of `forward_input.prompts`) has the prompt cached (`cache_req`,
        finished=False).
        """
        if data is None:
            return []
        forward_input, output = data
        if output.copy_done_event is not None:
            output.copy_done_event.synchronize()  # the only wait for the device
        released, self.finished_reqs = self.finished_reqs, set()
        outputs: list[TokenOutput] = []
        with self.cache_manager.lazy_free_region():
            for req, token in zip(forward_input.batch.reqs, output.next_tokens_cpu.tolist()):
                # A chunk samples nothing. A request that finished in the previous round was
                # already in this (overlapped) batch, and so may an aborted or preempted one
                # have been: their tokens are dropped.
                if isinstance(req, ChunkedReq) or req in released or req in self.pending_aborts:
                    continue
                outputs += self.append_tokens(req, [token])
                if outputs[-1].finish_reason is not None:
                    self.release(req)
                elif req in forward_input.prompts:  # share the prompt with later requests now
                    self.cache_manager.cache_req(req, finished=False)
        return outputs

    def append_tokens(self, req: Req, tokens: list[int]) -> list[TokenOutput]:
        """Append tokens to the request, up to the first that finishes it; one output each.

        The tokens go onto the request's host sequence in order, and a TokenOutput is returned
        for each token appended. Each token goes through `append_host`, then `finish_reason`;
        the last output carries the reason when the request finished. Count the outputs in
        stats.generated_tokens. A decode step brings one token per request; a verify step
        (chapter 24) several."""
        outputs: list[TokenOutput] = []
        for token in tokens:
            req.append_host(token)
            reason = self.finish_reason(req, token)
            outputs.append(TokenOutput(req.uid, token, reason))
            if reason is not None:
                break
        self.stats.generated_tokens += len(outputs)
        return outputs

    def release(self, req: Req) -> None:
        """Stop a request and give back what it holds: it leaves the running set (if it is in
        it), its table row is freed and its KV handed to the prefix cache, unlocked. With
        overlap, a launched batch may still hold it: it joins `finished_reqs`, so that the
        token that batch samples for it is dropped."""
        self.decode_manager.remove_req(req)
        self.table_manager.free(req.table_idx)
        self.cache_manager.cache_req(req, finished=True)
        if self.overlap:
            self.finished_reqs.add(req)

    def _free_pending_aborts(self) -> None:
        """Free the aborted requests that no launched batch still uses."""
        in_flight = set(self._last_data[0].batch.reqs) if self._last_data is not None else set()
        for req in self.pending_aborts - in_flight:
            self.release(req)
        self.pending_aborts &= in_flight
