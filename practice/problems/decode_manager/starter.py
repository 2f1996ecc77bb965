from __future__ import annotations

from minisgl.core import Batch, Req


class DecodeManager:
    def __init__(self, page_size: int) -> None:
        """Given: nothing runs yet."""
        self.page_size = page_size
        self.running_reqs: dict[int, Req] = {}  # uid -> request, in admission order

    @property
    def runnable(self) -> bool:
        """Is any request running?"""
        raise NotImplementedError("is the running set non-empty?")

    @property
    def inflight_tokens(self) -> int:
        """KV tokens the running requests may still allocate: remain_len + page_size each."""
        raise NotImplementedError("sum the running requests' worst case")

    def filter_reqs(self, reqs: list[Req]) -> None:
        """After a forward: requests that can decode join (or stay); the others leave."""
        raise NotImplementedError("join or leave the running set by req.can_decode")

    def remove_req(self, req: Req) -> None:
        """Drop a request that finished (it may not be running)."""
        raise NotImplementedError("remove from the running set")

    def abort_req(self, uid: int) -> Req | None:
        """Given: take request `uid` out of the running set (Scheduler.abort_request)."""
        return self.running_reqs.pop(uid, None)

    def schedule_next_batch(self) -> Batch | None:
        """Every running request decodes one token together, in admission order."""
        raise NotImplementedError("a decode batch of every running request, or None")
