"""ZMQ queues over IPC sockets: each process binds one PULL socket, its senders PUSH to it.

PUSH/PULL is a one-way pipe with a queue at both ends: `put` returns at once (unless the
queue is full), and a PULL socket fair-queues messages from every PUSH connected to it, so the
tokenizer worker hears the API server and the scheduler through one socket. IPC sockets are
files: they live in a temporary directory of their own, removed when the server stops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from minisgl.message.serialize import deserialize, serialize


LINGER_MS = 1000


def ipc_address(directory: str | Path, name: str) -> str:
    """The ZMQ address of socket `name` in a server's socket directory."""
    return f"ipc://{Path(directory) / name}.sock"


class ZmqPushQueue:
    """The sending end: connects to a PULL socket (it may be bound later) and puts messages."""

    def __init__(self, address: str) -> None:
        self.context = zmq.Context.instance()
        self.socket = self.context.socket(zmq.PUSH)
        # On close, unsent messages get LINGER_MS to go out (an ExitMsg sent just before
        # closing must not be lost), but a dead receiver never blocks the sender for long.
        self.socket.setsockopt(zmq.LINGER, LINGER_MS)
        self.socket.connect(address)

    def put(self, msg: Any) -> None:
        """Send one message (serialized)."""
        self.socket.send(serialize(msg), copy=False)

    def close(self) -> None:
        self.socket.close()


class ZmqPullQueue:
    """The receiving end: binds the socket that every ZmqPushQueue to `address` connects to."""

    def __init__(self, address: str) -> None:
        self.context = zmq.Context.instance()
        self.socket = self.context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)

    def get(self, timeout_s: float | None = None) -> Any | None:
        """Wait for the next message; None if none came within `timeout_s` (None: forever).

        Poll the socket with the timeout, then receive and deserialize one frame.
        """
        timeout_ms = -1 if timeout_s is None else int(timeout_s * 1000)
        if not self.socket.poll(timeout_ms):
            return None
        return deserialize(self.socket.recv(copy=False).bytes)

    def get_all_nowait(self) -> list[Any]:
        """Every message already queued, without waiting (maybe none).

        Receive with zmq.NOBLOCK until ZMQ raises zmq.Again (the queue is empty).
        """
        msgs = []
        while True:
            try:
                frame = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return msgs
            msgs.append(deserialize(frame.bytes))

    def close(self) -> None:
        self.socket.close()


class ZmqAsyncPullQueue:
    """A ZmqPullQueue for asyncio code (the API server): `await get()` lets other tasks run."""

    def __init__(self, address: str) -> None:
        self.context = zmq.asyncio.Context.instance()
        self.socket = self.context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)

    async def get(self) -> Any:
        """The next message, waiting without blocking the event loop."""
        frame = await self.socket.recv(copy=False)
        return deserialize(frame.bytes)

    def close(self) -> None:
        self.socket.close()
