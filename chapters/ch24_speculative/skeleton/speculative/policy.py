"""The speculative step: the scheduler's decode step turned into a verify step with drafts.

`SpeculativeDecoder` is chapter 24's batch picker (`BATCH_POLICIES` of the scheduler), active
when `speculative_tokens` (k) > 0. When the picker below it returns a decode batch, it gives
each request up to k drafts (`propose_drafts`), writes them into the token pool behind the
last token and moves device_len past them, so that chapter 7's preparation builds an extend of
k + 1 tokens per request: inputs, pages, attention metadata, all unchanged. The forward keeps
the logits of every token, not only the last; the greedy choices then decide what is
accepted (`accepted_length`), and the ledger, pages and token pool are rolled back to the
tokens kept (`roll_back`).

Drafts need the previous step's tokens on the CPU, so with speculative decoding on the
scheduler runs without overlap: each step's results are processed before the next is picked.
Only greedy requests with plain SamplingParams are verified. A batch with another (a sampled
one, or one whose parameters are a subclass, such as a grammar's) decodes plainly: a sampled
token is not "the model's choice", and a constraint's state would have to be rolled back too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.scheduler.scheduler import BATCH_POLICIES, BatchPicker, ForwardData, ForwardInput
from minisgl.scheduler.utils import TokenOutput
from minisgl.speculative.ngram import propose_drafts
from minisgl.speculative.verify import accepted_length, roll_back
from minisgl.utils import div_ceil, make_device_tensor

if TYPE_CHECKING:
    from minisgl.engine import ForwardOutput
    from minisgl.scheduler.scheduler import Scheduler


@dataclass(eq=False)
class VerifyBatch(Batch):
    """A decode step with drafts: an extend ("prefill" phase) of each request's last token and
    its drafts, whose every token's logits are kept."""

    drafts: list[list[int]] = field(default_factory=list)  # per request, in batch order


@dataclass
class SpeculativeStats:
    """Drafted and accepted tokens, in total and per request uid."""

    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    per_request: dict[int, list[int]] = field(default_factory=dict)  # uid -> [drafted, accepted]
    # (drafted, accepted) of every verify step of the request `trace_uid`, for the figures
    trace_uid: int | None = None
    trace: list[tuple[int, int]] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens (0.0 before any draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def record(self, uid: int, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        counts = self.per_request.setdefault(uid, [0, 0])
        counts[0] += drafted
        counts[1] += accepted
        if uid == self.trace_uid:
            self.trace.append((drafted, accepted))


def verifiable(req: Req) -> bool:
    """A greedy request with chapter 1's plain SamplingParams (no later chapter's rules)."""
    raise NotImplementedError("ch24: A greedy request with chapter 1's plain SamplingParams (no later chapter's rules).")


class SpeculativeDecoder:
    """Turns decode batches into verify batches, and runs and settles those in the scheduler's
    place (its `_forward` and `_process_last_data` pass every other batch on)."""

    def __init__(self, scheduler: Scheduler, inner: BatchPicker) -> None:
        config = scheduler.config
        self.scheduler = scheduler
        self.inner = inner  # the picker this policy replaces
        self.k = config.speculative_tokens
        self.ngram_max, self.ngram_min = config.ngram_max, config.ngram_min
        self.stats = SpeculativeStats()
        self.plain_forward = scheduler._forward
        self.plain_process = scheduler._process_last_data
        scheduler._forward = self.forward  # type: ignore[method-assign]
        scheduler._process_last_data = self.process  # type: ignore[method-assign]
        scheduler.overlap = False  # drafts are made from the tokens of the step before

    def __call__(self) -> Batch | None:
        raise NotImplementedError("ch24: implement SpeculativeDecoder.__call__")

    def draft_counts(self, reqs: list[Req]) -> list[int] | None:
        """Drafts per request: k, but at most remain_len - 1 (a step yields up to drafts + 1
        tokens, and no request may go past max_tokens, nor get slots beyond its worst case).
        None when no request can take a draft, or when the drafts' pages are not available
        now (optimistic admission may have left fewer): then the step decodes plainly."""
        raise NotImplementedError("ch24: Drafts per request: k, but at most remain_len - 1 (a step yields up to drafts + 1")

    def draft(self, reqs: list[Req]) -> VerifyBatch | None:
        """The verify batch of `reqs`: each request's drafts (`propose_drafts` on its host
        sequence) written into its token-pool row at [device_len, device_len + n), and its
        device_len moved past them, so that the step computes [cached_len, device_len)."""
        raise NotImplementedError("ch24: The verify batch of `reqs`: each request's drafts (`propose_drafts` on its host")

    def write_tokens(self, rows: list[int], cols: list[int], values: list[int]) -> None:
        """token_pool[rows, cols] = values, in one indexed write copied from the host."""
        table_manager = self.scheduler.table_manager
        pool, device = table_manager.token_pool, table_manager.device
        index = (
            make_device_tensor(rows, torch.int64, device),
            make_device_tensor(cols, torch.int64, device),
        )
        pool[index] = make_device_tensor(values, pool.dtype, device)

    def forward(self, forward_input: ForwardInput) -> ForwardOutput:
        """Run a verify batch with the logits of every token (all its rows are `last_indices`),
        greedy choices for all of them; any other batch as the scheduler does."""
        raise NotImplementedError("ch24: Run a verify batch with the logits of every token (all its rows are `last_indices`),")

    def process(self, data: ForwardData | None) -> list[TokenOutput]:
        """Settle a verify batch: per request, accept the drafts the model agrees with, emit
        the accepted drafts and the model's next token (stopping at EOS or max_tokens, as
        plain decoding would), roll the ledger and pages back to the emitted tokens, and write
        the newest token into the token pool. Finished requests leave and free their row and
        KV, as in chapter 7. Any other batch is settled as the scheduler does."""
        raise NotImplementedError("ch24: Settle a verify batch: per request, accept the drafts the model agrees with, emit")


def speculative_policy(scheduler: Scheduler, inner: BatchPicker) -> BatchPicker:
    """Chapter 24's picker for a scheduler whose config asks for drafts (speculative_tokens
    > 0); else `inner`, unchanged."""
    if scheduler.config.speculative_tokens == 0:
        return inner
    return SpeculativeDecoder(scheduler, inner)


BATCH_POLICIES.append(speculative_policy)
