from __future__ import annotations

from minisgl.core import Batch, Req


class DecodeManager:
    def __init__(self, page_size: int) -> None:
        """Given: nothing runs yet."""
        # reference body: scheduler/decode.py:DecodeManager.__init__

    @property
    def runnable(self) -> bool:
        """Is any request running?"""
        # reference body: scheduler/decode.py:DecodeManager.runnable

    @property
    def inflight_tokens(self) -> int:
        """KV tokens the running requests may still allocate: remain_len + page_size each."""
        # reference body: scheduler/decode.py:DecodeManager.inflight_tokens

    def filter_reqs(self, reqs: list[Req]) -> None:
        """After a forward: requests that can decode join (or stay); the others leave."""
        # reference body: scheduler/decode.py:DecodeManager.filter_reqs

    def remove_req(self, req: Req) -> None:
        """Drop a request that finished (it may not be running)."""
        # reference body: scheduler/decode.py:DecodeManager.remove_req

    def abort_req(self, uid: int) -> Req | None:
        """Given: take request `uid` out of the running set (Scheduler.abort_request)."""
        # reference body: scheduler/decode.py:DecodeManager.abort_req

    def schedule_next_batch(self) -> Batch | None:
        """Every running request decodes one token together, in admission order."""
        # reference body: scheduler/decode.py:DecodeManager.schedule_next_batch
