"""The PrefillManager: the waiting queue, admission control and chunked prefill.

Admission is first come, first served and reserves each request's worst case: its uncached
prompt, all max_tokens of output, and a page of slack. A request is admitted only if that fits
beside what the running requests may still need, so a running request never runs out of KV
and nothing is ever preempted. The price: memory reserved for outputs that may stop early.
"""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.core import Batch, Req
from minisgl.kvcache import BaseCacheHandle
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
        return False

    def complete_one(self) -> None:
        """The chunk's K/V are cached; no token was sampled, so device_len stays."""
        self.cached_len = self.device_len


@dataclass
class PrefillAdder:
    """Admits pending requests into one prefill batch, within a token budget and the KV room."""

    cache_manager: CacheManager
    table_manager: TableManager
    token_budget: int  # prompt tokens this batch may still compute
    reserved_size: int  # KV tokens already promised to running and admitted requests

    def worst_case_tokens(self, pending_req: PendingReq, cached_len: int) -> int:
        """KV slots the request may still take: prompt + output + one page, minus what it holds.

        It holds its cached prefix, or the chunks computed so far, rounded up to whole pages
        (`ceil(cached_len / page_size) * page_size` slots). The page of slack covers the
        rounding up of its last page."""
        page = self.cache_manager.page_size
        held = div_ceil(cached_len, page) * page
        return pending_req.input_len + pending_req.output_len + page - held

    def try_add_one(self, pending_req: PendingReq) -> Req | None:
        """Admit `pending_req` (or its next chunk) into the batch, or return None if it must wait.

        It must wait when the token budget is spent, when no table row is free, or when its
        worst case (`worst_case_tokens`) does not fit: reserved_size + worst case must stay
        <= the cache manager's available_size. A first admission matches the prefix cache
        (`match_req`) and locks the match before measuring, so that the eviction this
        admission may cause cannot take the match; if the request does not fit, unlock it
        again and leave no trace. If it fits: take a row, point the row at the match
        (`map_prefix`), add the worst case to reserved_size and build the request with
        `_add_one_req`. A later chunk (pending_req.chunked_req is set) already holds its row,
        pages and handle: it only needs room for its worst case from where the chunk ended.
        """
        if self.token_budget <= 0:
            return None
        if (chunk := pending_req.chunked_req) is not None:
            need = self.worst_case_tokens(pending_req, chunk.cached_len)
            if self.reserved_size + need > self.cache_manager.available_size:
                return None
            self.reserved_size += need
            return self._add_one_req(
                pending_req, chunk.cache_handle, chunk.table_idx, chunk.cached_len
            )
        if self.table_manager.available_size == 0:
            return None
        match = self.cache_manager.match_req(pending_req.input_ids)
        self.cache_manager.lock(match.handle)  # protect the match from our own eviction
        need = self.worst_case_tokens(pending_req, match.handle.cached_len)
        if self.reserved_size + need > self.cache_manager.available_size:
            self.cache_manager.unlock(match.handle)
            return None
        table_idx = self.table_manager.allocate()
        self.cache_manager.map_prefix(table_idx, match)
        self.reserved_size += need
        return self._add_one_req(pending_req, match.handle, table_idx, match.handle.cached_len)

    def _add_one_req(
        self,
        pending_req: PendingReq,
        cache_handle: BaseCacheHandle | None,
        table_idx: int,
        cached_len: int,
    ) -> Req:
        """Build the Req of an admitted request, and spend the step's token budget on it.

        The Req holds the rest of its prompt from cached_len, or it is a ChunkedReq up to where
        the token budget runs out."""
        extend = min(pending_req.input_len - cached_len, self.token_budget)
        self.token_budget -= extend
        end = cached_len + extend
        req_class = ChunkedReq if end < pending_req.input_len else Req
        return req_class(
            input_ids=pending_req.input_ids[:end],
            table_idx=table_idx,
            cached_len=cached_len,
            output_len=pending_req.output_len,
            uid=pending_req.uid,
            sampling_params=pending_req.sampling_params,
            cache_handle=cache_handle,
        )


class PrefillManager:
    def __init__(
        self,
        cache_manager: CacheManager,
        table_manager: TableManager,
        decode_manager: DecodeManager,
    ) -> None:
        self.cache_manager = cache_manager
        self.table_manager = table_manager
        self.decode_manager = decode_manager
        self.pending_list: list[PendingReq] = []

    @property
    def runnable(self) -> bool:
        return bool(self.pending_list)

    def add_one_req(self, pending_req: PendingReq) -> None:
        self.pending_list.append(pending_req)

    def abort_req(self, uid: int) -> PendingReq | None:
        """Take request `uid` out of the queue; return it, or None if it is not waiting."""
        for i, pending_req in enumerate(self.pending_list):
            if pending_req.uid == uid:
                return self.pending_list.pop(i)
        return None

    def new_adder(self, prefill_budget: int) -> PrefillAdder:
        """Make the PrefillAdder of one batch, with room for what the running requests may need.

        Its token budget is `prefill_budget`; its `reserved_size` starts at the decode
        manager's `inflight_tokens`. (Chapter 23's optimistic admission returns another.)"""
        return PrefillAdder(
            self.cache_manager,
            self.table_manager,
            prefill_budget,
            self.decode_manager.inflight_tokens,
        )

    def schedule_next_batch(self, prefill_budget: int) -> Batch | None:
        """Admit waiting requests in arrival order until one does not fit.

        The batch's PrefillAdder comes from `new_adder(prefill_budget)`.
        A chunked request stays at the head of the queue until its last chunk is admitted.

        Admission stops at the first request that must wait, even if a smaller one behind it
        would fit: first come, first served, so a large request cannot be starved. Each
        admitted entry's `chunked_req` is set here, and only here: to its chunk if it was
        chunked, else back to None.
        """
        adder = self.new_adder(prefill_budget)
        reqs: list[Req] = []
        for pending_req in self.pending_list:
            req = adder.try_add_one(pending_req)
            if req is None:
                break
            reqs.append(req)
            if isinstance(req, ChunkedReq):
                break  # the budget is spent
        if not reqs:
            return None
        admitted = self.pending_list[: len(reqs)]
        for pending_req, req in zip(admitted, reqs):
            pending_req.chunked_req = req if isinstance(req, ChunkedReq) else None
        self.pending_list = [p for p in admitted if p.chunked_req is not None] + self.pending_list[
            len(reqs) :
        ]
        return Batch(reqs, "prefill")
