from __future__ import annotations

from minisgl.core import Batch, Req


class DecodeManager:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.running_reqs: dict[int, Req] = {}  # uid -> request, in admission order

    @property
    def runnable(self) -> bool:
        """Is any request running?"""
        return bool(self.running_reqs)

    @property
    def inflight_tokens(self) -> int:
        """KV tokens the running requests may still allocate: remain_len + page_size each."""
        return sum(req.remain_len + self.page_size for req in self.running_reqs.values())

    def filter_reqs(self, reqs: list[Req]) -> None:
        """After a forward: requests that can decode join (or stay); the others leave."""
        for req in reqs:
            if req.can_decode:
                self.running_reqs.setdefault(req.uid, req)
            else:
                self.running_reqs.pop(req.uid, None)

    def remove_req(self, req: Req) -> None:
        """Drop a request that finished (it may not be running)."""
        self.running_reqs.pop(req.uid, None)

    def abort_req(self, uid: int) -> Req | None:
        """Given: take request `uid` out of the running set (Scheduler.abort_request)."""
        return self.running_reqs.pop(uid, None)

    def schedule_next_batch(self) -> Batch | None:
        """Every running request decodes one token together, in admission order."""
        if not self.running_reqs:
            return None
        return Batch(list(self.running_reqs.values()), "decode")
