"""The API server's side of the queues: send requests, route each reply to its waiting client.

Every HTTP request is a coroutine waiting on its own asyncio.Queue. One listener task reads the
single PULL socket and drops each ReplyMsg into the queue of its uid, so thousands of streams
share one socket and one thread.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import AsyncIterator

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    ZmqAsyncPullQueue,
    BatchMsg,
    ZmqPushQueue,
    ReplyMsg,
    StatusMsg,
    StatusRequestMsg,
    TokenizeMsg,
)

STATUS_TIMEOUT_S = 5.0


class FrontendManager:
    def __init__(self, tokenizer_address: str, api_address: str) -> None:
        self.to_tokenizer = ZmqPushQueue(tokenizer_address)
        self.inbox = ZmqAsyncPullQueue(api_address)
        self.uids = itertools.count()
        self.streams: dict[int, asyncio.Queue[ReplyMsg]] = {}
        self.status_waiters: dict[int, asyncio.Future[StatusMsg]] = {}
        self.listener: asyncio.Task | None = None

    def start(self) -> None:
        """Start the listener task (call it inside the running event loop)."""
        self.listener = asyncio.get_running_loop().create_task(self.listen())

    async def listen(self) -> None:
        """Route each incoming reply to its request's queue, each status to its waiter.

        Messages may come batched (BatchMsg). Replies of requests nobody waits for any more
        (aborted) are dropped.
        """
        raise NotImplementedError("ch15: Route each incoming reply to its request's queue, each status to its waiter.")

    def submit(
        self,
        sampling_params: SamplingParams,
        prompt: str | list[int] | None = None,
        messages: list[dict[str, str]] | None = None,
        stop: list[str] | None = None,
    ) -> int:
        """Send a request to the tokenizer worker; returns its uid for `replies`."""
        uid = next(self.uids)
        self.streams[uid] = asyncio.Queue()
        self.to_tokenizer.put(TokenizeMsg(uid, sampling_params, prompt, messages, stop or []))
        return uid

    async def replies(self, uid: int) -> AsyncIterator[ReplyMsg]:
        """The replies of one request, up to the one that finishes it (or carries an error).

        A consumer that stops early (its client left) must call `abort(uid)`.
        """
        raise NotImplementedError("ch15: The replies of one request, up to the one that finishes it (or carries an error).")

    def abort(self, uid: int) -> None:
        """The client is gone: stop routing its replies and free its pages in the scheduler.
        Nothing happens if the request has already finished."""
        if self.streams.pop(uid, None) is not None:
            self.to_tokenizer.put(AbortBackendMsg(uid))

    async def status(self) -> StatusMsg:
        """Ask the scheduler how it is doing (through the tokenizer worker)."""
        request_id = next(self.uids)
        waiter = asyncio.get_running_loop().create_future()
        self.status_waiters[request_id] = waiter
        self.to_tokenizer.put(StatusRequestMsg(request_id))
        try:
            return await asyncio.wait_for(waiter, STATUS_TIMEOUT_S)
        finally:
            self.status_waiters.pop(request_id, None)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.cancel()
        self.to_tokenizer.close()
        self.inbox.close()
