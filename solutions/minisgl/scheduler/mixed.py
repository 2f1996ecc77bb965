"""Mixed batches: the decode tokens of the running requests and prompt chunks in one step.

Chapter 7's scheduler runs either a prefill or a decode step. While a long prompt is prefilled,
chunk after chunk (chapter 10), the running requests get a token only every other step, and
each of those waits behind a whole chunk. A mixed step holds both: every running request's
next token first, then prompt chunks filling the rest of the token budget (max_extend_tokens),
as vLLM's scheduler and SGLang's mixed chunks do. The attention backends already take such a
batch: a decode token is an extend of length 1, and each request samples from its last token.

`MixedPolicy` is chapter 23's step policy (a row of features.STEP_POLICIES): it picks mixed
batches when `mixed_batches` is on, and, with `admission="optimistic"`, makes room by
preemption (`Preemptor`) before every step that decodes. Running and settling a batch do not
change: those go to the policy it wraps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.core import Batch
from minisgl.scheduler.preempt import OptimisticPrefillManager, Preemptor
from minisgl.scheduler.scheduler import PolicyLayer, StepPolicy

if TYPE_CHECKING:
    from minisgl.scheduler.scheduler import Scheduler


class MixedPolicy(PolicyLayer):
    """Picks each step's batch: mixed, or chapter 7's prefill-or-decode; preempting if need be."""

    def __init__(
        self,
        scheduler: Scheduler,
        inner: StepPolicy,
        preemptor: Preemptor | None,
        mixed: bool,
    ) -> None:
        super().__init__(inner)
        self.scheduler = scheduler
        self.preemptor = preemptor  # None: conservative admission never runs out of pages
        self.mixed = mixed

    def pick_batch(self) -> Batch | None:
        if self.mixed:
            return self.mixed_batch()
        batch = self.inner.pick_batch()
        if batch is None or not batch.is_decode or self.preemptor is None:
            return batch
        reqs = self.preemptor.make_room(batch.reqs)
        return Batch(reqs, "decode") if reqs else None

    def mixed_batch(self) -> Batch | None:
        """Batch every running request's next token, then prompt chunks in the rest of the budget.

        The decode part is the running requests in admission order, after the preemptor (if
        any) made room for them (`make_room`). The prefill manager then admits waiting requests
        with the token budget max_extend_tokens minus one token per decoding request. Return
        None if both parts are empty, a "decode" batch if no prompt was admitted, else one
        "prefill" batch (the attention's extend path) of the decode requests followed by the
        admitted prompts and chunks.
        """
        scheduler = self.scheduler
        decode = list(scheduler.decode_manager.running_reqs.values())
        if self.preemptor is not None:
            decode = self.preemptor.make_room(decode)
        budget = scheduler.config.max_extend_tokens - len(decode)
        prefill = scheduler.prefill_manager.schedule_next_batch(budget)
        if prefill is None:
            return Batch(decode, "decode") if decode else None
        return Batch(decode + prefill.reqs, "prefill")


def mixed_policy(scheduler: Scheduler, inner: StepPolicy) -> StepPolicy:
    """Chapter 23's policy for a scheduler whose config asks for mixed batches or optimistic
    admission (whose prefill manager is then the OptimisticPrefillManager); else `inner`."""
    config = scheduler.config
    if not config.mixed_batches and config.admission != "optimistic":
        return inner
    preemptor = None
    if isinstance(scheduler.prefill_manager, OptimisticPrefillManager):
        preemptor = Preemptor(scheduler, scheduler.prefill_manager)
    return MixedPolicy(scheduler, inner, preemptor, config.mixed_batches)
