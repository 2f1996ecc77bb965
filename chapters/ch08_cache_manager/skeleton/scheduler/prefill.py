"""The PrefillManager: the waiting queue, admission control and chunked prefill.

Admission is first come, first served and reserves each request's worst case: its uncached
prompt, all max_tokens of output, and a page of slack. A request is admitted only if that fits
beside what the running requests may still need, so a running request never runs out of KV
and nothing is ever preempted. The price: memory reserved for outputs that may stop early.
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.core import Batch, Req
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.table import TableManager
from minisgl.scheduler.utils import PendingReq
from minisgl.utils import div_ceil


class ChunkedReq(Req):
    """A request of which only a chunk of the prompt is computed in this step.

    Its input_ids are the prompt up to the chunk's end. No token is sampled from it: it only
    fills the KV cache, and the request goes on waiting for its next chunk.
    """

    @property
    def can_decode(self) -> bool:
        """Never: a prompt chunk samples no token and does not join the decode set."""
        raise NotImplementedError("written in chapter 10: Never: a prompt chunk samples no token and does not join the decode set.")

    def complete_one(self) -> None:
        """The chunk's K/V are cached; no token was sampled, so device_len stays."""
        raise NotImplementedError("written in chapter 10: The chunk's K/V are cached; no token was sampled, so device_len stays.")


@dataclass
class PrefillAdder:
    """Admits pending requests into one prefill batch, within a token budget and the KV room."""

    cache_manager: CacheManager
    table_manager: TableManager
    token_budget: int  # prompt tokens this batch may still compute
    reserved_tokens: int  # KV tokens already promised to running and admitted requests

    def worst_case_tokens(self, pending: PendingReq, cached_len: int) -> int:
        """KV slots the request may still take: prompt + output + one page of slack, minus the
        pages it already holds (its cached prefix, or the chunks computed so far)."""
        raise NotImplementedError("ch08: KV slots the request may still take: prompt + output + one page of slack, minus the")

    def try_add(self, pending: PendingReq) -> Req | None:
        """Admit `pending` (or its next chunk) into the batch, or return None if it must wait."""
        raise NotImplementedError("ch08: Admit `pending` (or its next chunk) into the batch, or return None if it must wait.")

    def _make_req(self, pending: PendingReq) -> Req:
        """Turn an admitted pending request into a Req, or a ChunkedReq if the budget runs out."""
        extend = min(pending.input_len - pending.cached_len, self.token_budget)
        self.token_budget -= extend
        end = pending.cached_len + extend
        req_class = ChunkedReq if end < pending.input_len else Req
        assert pending.table_idx is not None
        return req_class(input_ids=pending.input_ids[:end], table_idx=pending.table_idx,
                         cached_len=pending.cached_len, output_len=pending.output_len,
                         uid=pending.uid, sampling_params=pending.sampling_params,
                         cache_handle=pending.cache_handle)


class PrefillManager:
    def __init__(self, cache_manager: CacheManager, table_manager: TableManager,
                 decode_manager: DecodeManager) -> None:
        self.cache_manager = cache_manager
        self.table_manager = table_manager
        self.decode_manager = decode_manager
        self.pending: list[PendingReq] = []

    @property
    def runnable(self) -> bool:
        return bool(self.pending)

    def add_one_req(self, pending: PendingReq) -> None:
        self.pending.append(pending)

    def schedule_next_batch(self, token_budget: int) -> Batch | None:
        """Admit waiting requests in arrival order until one does not fit; a chunked request
        stays at the head of the queue until its last chunk is admitted."""
        adder = PrefillAdder(self.cache_manager, self.table_manager, token_budget,
                             self.decode_manager.inflight_tokens)
        reqs: list[Req] = []
        for pending in self.pending:
            req = adder.try_add(pending)
            if req is None:
                break
            reqs.append(req)
            if isinstance(req, ChunkedReq):
                pending.cached_len = req.device_len
                break  # the budget is spent
        if not reqs:
            return None
        done = {req.uid for req in reqs if not isinstance(req, ChunkedReq)}
        self.pending = [p for p in self.pending if p.uid not in done]
        return Batch(reqs, "prefill")
