"""The DecodeManager: owns the set of running requests and the KV they may still need."""

from __future__ import annotations

from minisgl.core import Batch, Req


class DecodeManager:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.running: dict[int, Req] = {}  # uid -> request, in admission order

    @property
    def runnable(self) -> bool:
        return bool(self.running)

    @property
    def inflight_tokens(self) -> int:
        """KV tokens the running requests may still allocate: their worst case.

        Each may generate up to remain_len more tokens, plus up to one partly used page.
        Admission control keeps this much room free, so no request ever has to be preempted.
        """
        raise NotImplementedError("ch08: KV tokens the running requests may still allocate: their worst case.")

    def add_reqs(self, reqs: list[Req]) -> None:
        """After a forward: requests that can decode join (or stay); the others leave."""
        for req in reqs:
            if req.can_decode:
                self.running.setdefault(req.uid, req)
            else:
                self.running.pop(req.uid, None)

    def remove_req(self, req: Req) -> None:
        """Drop a finished request from the running set (no error if it already left)."""
        self.running.pop(req.uid, None)

    def schedule_next_batch(self) -> Batch | None:
        """Every running request decodes one token together."""
        if not self.running:
            return None
        return Batch(list(self.running.values()), "decode")
