"""The speculative step: the scheduler's decode step turned into a verify step with drafts.

`SpeculativeDecoder` is chapter 24's step policy (a row of features.STEP_POLICIES), active
when `speculative_tokens` (k) > 0. When the policy it wraps picks a decode batch, it gives
each request up to k drafts (`propose_drafts`), writes them into the token pool behind the
last token and moves device_len past them, so that chapter 7's preparation builds an extend of
k + 1 tokens per request: inputs, pages, attention metadata, all unchanged. The forward keeps
the logits of every token, not only the last; the greedy choices then decide what is
accepted (`accepted_length`), the tokens kept are settled as every batch's are (the
scheduler's `append_tokens` and `release`), and the ledger, pages and token pool are rolled
back to them (`roll_back`).

Drafts need the previous step's tokens on the CPU, so the policy does not allow overlap:
each step's results are settled before the next is picked.
Only greedy requests with plain SamplingParams are verified. A batch with another (a sampled
one, or one whose parameters are a subclass, such as a grammar's) decodes plainly: a sampled
token is not "the model's choice", and a constraint's state would have to be rolled back too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.graph import GraphRunner
from minisgl.scheduler.scheduler import ForwardData, ForwardInput, PolicyLayer, StepPolicy
from minisgl.scheduler.utils import TokenOutput
from minisgl.speculative.ngram import propose_drafts
from minisgl.speculative.verify import accepted_length, roll_back
from minisgl.utils import div_ceil, make_device_tensor

if TYPE_CHECKING:
    from minisgl.engine import ForwardOutput
    from minisgl.scheduler.scheduler import Scheduler


@dataclass(frozen=True, eq=False)
class DraftRow:
    """One token of a verify step laid out as a decode row: `req`'s token at position
    cached_len, attending to the request's tokens up to it, as a decode step's query does.
    It has what preparing and running a batch read of a request (its ledger, row, uid and
    sampling parameters), and never reaches the scheduler's ledgers."""

    req: Req
    cached_len: int

    @property
    def device_len(self) -> int:
        return self.cached_len + 1

    @property
    def extend_len(self) -> int:
        return 1

    @property
    def table_idx(self) -> int:
        return self.req.table_idx

    @property
    def uid(self) -> int:
        return self.req.uid

    @property
    def sampling_params(self) -> SamplingParams:
        return self.req.sampling_params


@dataclass(eq=False)
class VerifyBatch(Batch):
    """A decode step with drafts, in one of two layouts of the same tokens, in the same order.

    "prefill": `reqs` are the requests, each an extend of its last token and its drafts,
    whose every token's logits are kept. "decode": `reqs` are DraftRows, one per token, so
    that a runner that replays CUDA graphs of decode steps runs the verify step as one."""

    requests: list[Req] = field(default_factory=list)  # the requests verified, in batch order
    drafts: list[list[int]] = field(default_factory=list)  # per request


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
    """True for a greedy request whose parameters are chapter 1's plain SamplingParams.

    Greedy: `is_greedy`. Plain: the type is exactly SamplingParams, not a subclass (a later
    chapter's rules, such as a grammar, whose state would have to be rolled back too)."""
    raise NotImplementedError("ch24: True for a greedy request whose parameters are chapter 1's plain SamplingParams.")


class SpeculativeDecoder(PolicyLayer):
    """Turns decode batches into verify batches, and runs and settles those; every other
    batch goes to the policy it wraps."""

    def __init__(self, scheduler: Scheduler, inner: StepPolicy) -> None:
        super().__init__(inner)
        config = scheduler.config
        self.scheduler = scheduler
        self.k = config.speculative_tokens
        self.ngram_max, self.ngram_min = config.ngram_max, config.ngram_min
        self.stats = SpeculativeStats()

    @property
    def allows_overlap(self) -> bool:
        return False  # drafts are made from the tokens of the step before

    def pick_batch(self) -> Batch | None:
        """The next batch: the inner policy's, with a decode batch turned into a verify batch.

        A prefill (or mixed) batch, None, or a decode batch with a request that is not
        `verifiable` is returned as it is. Otherwise `draft` the batch's requests; when it
        returns None (no drafts this step), the decode batch runs plainly."""
        raise NotImplementedError("ch24: The next batch: the inner policy's, with a decode batch turned into a verify batch.")

    def draft_counts(self, reqs: list[Req]) -> list[int] | None:
        """How many drafts each request takes this step, or None for a plain decode step.

        Each takes k, but at most remain_len - 1: a step yields up to drafts + 1 tokens, and no
        request may go past max_tokens, nor get slots beyond the worst case admission reserved.
        None when no request can take a draft, or when the pages the step would allocate
        (from ceil(cached_len / page) to ceil((device_len + drafts) / page) per request) need
        more slots than the cache manager's available_size (optimistic admission may leave
        fewer): then the step decodes plainly. Where the engine replays CUDA graphs
        (`graph_rows` is not None), each request also takes at most graph_rows // len(reqs) - 1
        (and at least 0), so that the step's rows fit the largest graph: an eager verify step
        costs several graphed decode steps."""
        raise NotImplementedError("ch24: How many drafts each request takes this step, or None for a plain decode step.")

    def draft(self, reqs: list[Req]) -> VerifyBatch | None:
        """Make the verify batch of `reqs`, or None when `draft_counts` says no drafts.

        Each request's n drafts come from `propose_drafts` on its host sequence (input_ids)
        with the config's n-gram sizes; they are written into its token-pool row at
        [device_len, device_len + n) (one indexed write: `write_tokens`), and its device_len
        moves past them, so that chapter 7's preparation computes [cached_len, device_len).
        The host sequence is not touched. The batch is a VerifyBatch of the requests and their
        drafts: in the "prefill" phase (an extend to every attention backend), or, when the
        engine replays graphs for that many rows (`replays_graphs`), in the "decode" phase
        with one DraftRow per token ([cached_len, device_len) of each request, in order)."""
        raise NotImplementedError("ch24: Make the verify batch of `reqs`, or None when `draft_counts` says no drafts.")

    def graph_rows(self) -> int | None:
        """The rows of the largest CUDA graph the engine's runner replays; None without graphs."""
        runner = self.scheduler.engine.runner
        return runner.max_batch_size if isinstance(runner, GraphRunner) else None

    def replays_graphs(self, rows: int) -> bool:
        """Whether the engine's runner would replay a CUDA graph for a decode step of `rows`.

        Then a verify step is laid out as decode rows: one graph replay instead of an eager
        extend, at the price of reading each request's KV once per row. Without graphs (on a
        CPU) the extend reads it once."""
        largest = self.graph_rows()
        return largest is not None and rows <= largest

    def write_tokens(self, rows: list[int], cols: list[int], values: list[int]) -> None:
        """token_pool[rows, cols] = values, in one indexed write copied from the host."""
        table_manager = self.scheduler.table_manager
        pool, device = table_manager.token_pool, table_manager.device
        index = (
            make_device_tensor(rows, torch.int64, device),
            make_device_tensor(cols, torch.int64, device),
        )
        pool[index] = make_device_tensor(values, pool.dtype, device)

    def run_batch(self, forward_input: ForwardInput) -> ForwardOutput:
        """Run a verify batch, keeping every token's logits; pass any other batch on.

        A batch that is not a VerifyBatch goes to the inner policy's `run_batch`. In a verify
        batch's "prefill" layout, attn_metadata.last_indices becomes every token's row
        (0 .. tokens - 1, on the batch's device), so the model returns the logits of all of
        them (in the "decode" layout every row is a last token already); the engine's
        `forward_batch` then gives the greedy choice after each token. Record the step in the
        scheduler's stats as ("decode", requests, tokens). The ledgers do not move here:
        `settle_batch` rolls them to what was kept."""
        raise NotImplementedError("ch24: Run a verify batch, keeping every token's logits; pass any other batch on.")

    def settle_batch(self, data: ForwardData | None) -> list[TokenOutput]:
        """Settle a verify batch's results; pass any other batch (or None) on.

        Wait for the copy's event; each request's choices are its drafts + 1 consecutive
        tokens of next_tokens_cpu. Inside one `lazy_free_region`, per request: count the
        accepted drafts (`accepted_length`) and hand the accepted drafts and the model's next
        token to the scheduler's `append_tokens` (which stops at the first that finishes the
        request). Record the drafted and accepted counts (`self.stats.record`), and
        `roll_back` the ledger and pages to the host sequence's length. A finished request is
        `release`d; the others get their newest token written into the token pool at
        device_len - 1 (one write for the batch). Afterwards count the verify step."""
        raise NotImplementedError("ch24: Settle a verify batch's results; pass any other batch (or None) on.")


def speculative_policy(scheduler: Scheduler, inner: StepPolicy) -> StepPolicy:
    """Chapter 24's policy for a scheduler whose config asks for drafts (speculative_tokens
    > 0); else `inner`, unchanged."""
    if scheduler.config.speculative_tokens == 0:
        return inner
    return SpeculativeDecoder(scheduler, inner)
