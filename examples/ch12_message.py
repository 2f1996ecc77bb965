# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 12: messages on the wire
#
# A server is several processes that talk by messages. Here we serialize a request of 2,000
# prompt tokens three ways (JSON, msgpack with a list of ints, msgpack with the ids packed as
# int32 bytes, as minisgl does) and compare size and speed. Both msgpack forms beat JSON by
# far; packed ids cost 4 bytes each (msgpack stores an id below 65,536 in 3) but travel as
# one block that numpy converts in C, and that a receiver could hand to torch without a loop.
# Then we push 2,000 messages through a ZMQ PUSH/PULL pair over an
# IPC socket and time the round trip through serialize, socket and deserialize.

# %%
from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import asdict

import msgpack

from minisgl.core import SamplingParams
from minisgl.message import (
    BatchMsg,
    DetokenizeMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    UserMsg,
    deserialize,
    ipc_address,
    serialize,
)

PROMPT_LEN = 2000
MESSAGES = 2000


def main() -> None:
    msg = UserMsg(
        uid=1,
        input_ids=list(range(30_000, 30_000 + PROMPT_LEN)),
        sampling_params=SamplingParams(max_tokens=64),
    )

    def plain() -> dict:  # the message as plain data, for JSON and msgpack without our hooks
        return {
            "uid": msg.uid,
            "input_ids": msg.input_ids,
            "sampling_params": asdict(msg.sampling_params),
        }

    as_json = json.dumps(plain()).encode()
    as_msgpack_list = msgpack.packb(plain())
    packed = serialize(msg)
    print(f"a UserMsg with {PROMPT_LEN} prompt tokens:")
    print(f"  JSON                      {len(as_json):>6} bytes")
    print(f"  msgpack, list of ints     {len(as_msgpack_list):>6} bytes")
    print(f"  msgpack, packed int32     {len(packed):>6} bytes")
    rounds = 200
    ways = [
        ("JSON", lambda: json.dumps(plain()).encode(), json.loads),
        ("msgpack, list of ints", lambda: msgpack.packb(plain()), msgpack.unpackb),
        ("msgpack, packed int32", lambda: serialize(msg), deserialize),
    ]
    print("\nencode + decode, per message:")
    for name, encode, decode in ways:
        start = time.perf_counter()
        for _ in range(rounds):
            decode(encode())
        print(f"  {name:<24} {(time.perf_counter() - start) / rounds * 1e6:.1f} us")
    assert deserialize(packed) == msg

    directory = tempfile.mkdtemp(prefix="minisgl-ch12-")
    try:
        inbox = ZmqPullQueue(ipc_address(directory, "detokenizer"))
        outbox = ZmqPushQueue(ipc_address(directory, "detokenizer"))
        start = time.perf_counter()
        for uid in range(MESSAGES):  # what a scheduler sends: one batch of tokens per step
            outbox.put(BatchMsg([DetokenizeMsg(uid, token) for token in range(8)]))
        received = [inbox.get(timeout_s=5) for _ in range(MESSAGES)]
        seconds = time.perf_counter() - start
        assert [m.data[0].uid for m in received] == list(range(MESSAGES)), "lost or reordered"
        print(
            f"\n{MESSAGES} batches of 8 tokens through an IPC PUSH/PULL pair: "
            f"{seconds * 1e3:.0f} ms, {seconds / MESSAGES * 1e6:.0f} us per message, "
            "all in order"
        )
        print("first received:", received[0].data[:2], "...")
        outbox.close()
        inbox.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
