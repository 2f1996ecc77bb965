"""The DecodeManager: owns the set of running requests and the KV they may still need."""

from __future__ import annotations

from minisgl.core import Batch, Req


class DecodeManager:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.running_reqs: dict[int, Req] = {}  # uid -> request, in admission order

    @property
    def runnable(self) -> bool:
        return bool(self.running_reqs)

    @property
    def inflight_tokens(self) -> int:
        """KV tokens the running requests may still allocate: their worst case.

        Each may generate up to remain_len more tokens, plus up to one partly used page.
        Admission control keeps this much room free, so no request ever has to be preempted.
        """
        raise NotImplementedError("ch08: KV tokens the running requests may still allocate: their worst case.")

    def filter_reqs(self, reqs: list[Req]) -> None:
        """After a forward, put in the running set the batch's requests that can decode.

        A request that can decode (`req.can_decode`) joins the running set or stays in it; the
        others (a prompt chunk, a request at max_tokens) leave it or never join."""
        for req in reqs:
            if req.can_decode:
                self.running_reqs.setdefault(req.uid, req)
            else:
                self.running_reqs.pop(req.uid, None)

    def remove_req(self, req: Req) -> None:
        """Drop this request from the running set if it is there: no error if it already left
        (filter_reqs drops a request at max_tokens), and a later request that reuses its uid
        (one added after it was aborted) stays."""
        if self.running_reqs.get(req.uid) is req:
            del self.running_reqs[req.uid]

    def abort_req(self, uid: int) -> Req | None:
        """Take request `uid` out of the running set; return it, or None if it is not there."""
        return self.running_reqs.pop(uid, None)

    def schedule_next_batch(self) -> Batch | None:
        """Every running request decodes one token together."""
        if not self.running_reqs:
            return None
        return Batch(list(self.running_reqs.values()), "decode")
