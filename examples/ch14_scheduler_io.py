# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 14: the scheduler behind a socket
#
# The scheduler now runs its own loop and hears requests from a ZMQ socket. We serve SmolLM2
# in a thread and play the tokenizer worker: three requests are queued, and each scheduler
# step's tokens arrive as one message. Then a long request starts and is aborted after its
# first token. Last, the scheduler sits idle for a second and we measure the CPU the process
# used meanwhile (blocking on the socket when there is no work costs nothing), and ask for
# the status: the aborted request's pages are free, and the integrity check passes.

# %%
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch.distributed as dist
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    BatchMsg,
    ExitMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    StatusMsg,
    StatusRequestMsg,
    UserMsg,
    ipc_address,
)
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.io import SchedulerIO, serve

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
PROMPTS = {0: "The capital of France is", 1: "One, two, three,", 2: "Water boils at"}
LONG_UID = 9


def status(to_scheduler: ZmqPushQueue, from_scheduler: ZmqPullQueue) -> StatusMsg:
    to_scheduler.put(StatusRequestMsg(0))
    while True:  # tokens still in flight may come first
        msg = from_scheduler.get(timeout_s=30)
        if isinstance(msg, StatusMsg):
            return msg


def main() -> None:
    directory = tempfile.mkdtemp(prefix="minisgl-ch14-")
    dist.init_process_group("gloo", init_method=f"file://{directory}/init", rank=0, world_size=1)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    scheduler = Scheduler(
        SchedulerConfig(MODEL, max_running_req=4, num_pages=1024, show_progress=False)
    )
    inbox, outbox = ipc_address(directory, "scheduler"), ipc_address(directory, "tokenizer")
    io = SchedulerIO(inbox, outbox, rank=0, group=dist.group.WORLD)
    to_scheduler, from_scheduler = ZmqPushQueue(inbox), ZmqPullQueue(outbox)
    for uid, prompt in PROMPTS.items():  # queued before the loop starts: one prefill for all
        to_scheduler.put(
            UserMsg(uid, tokenizer.encode(prompt), SamplingParams(max_tokens=8, ignore_eos=True))
        )
    time.sleep(0.3)
    loop = threading.Thread(target=serve, args=(scheduler, io))
    loop.start()
    try:
        tokens: dict[int, list[int]] = {uid: [] for uid in PROMPTS}
        done: set[int] = set()
        step = 0
        while done != set(PROMPTS):
            msg = from_scheduler.get(timeout_s=60)
            assert isinstance(msg, BatchMsg), msg
            print(f"message {step}: " + ", ".join(f"uid {m.uid} -> {m.token:>5}" for m in msg.data))
            for m in msg.data:
                tokens[m.uid].append(m.token)
                if m.finish_reason is not None:
                    done.add(m.uid)
            step += 1
        for uid, prompt in PROMPTS.items():
            print(f"uid {uid}: {prompt!r} + {tokenizer.decode(tokens[uid])!r}")

        to_scheduler.put(
            UserMsg(
                LONG_UID,
                tokenizer.encode("Tell me everything about"),
                SamplingParams(max_tokens=900, ignore_eos=True),
            )
        )
        while not isinstance(first := from_scheduler.get(timeout_s=60), BatchMsg):
            pass
        to_scheduler.put(AbortBackendMsg(LONG_UID))
        print(f"\nuid {LONG_UID} (max_tokens=900): first token {first.data[0].token}, then aborted")

        time.sleep(0.2)  # the loop goes idle: it blocks on the socket
        cpu_before = time.process_time()
        time.sleep(1.0)
        print(
            f"idle for 1 s: the whole process used {(time.process_time() - cpu_before) * 1e3:.0f}"
            " ms of CPU"
        )
        idle = status(to_scheduler, from_scheduler)
        print(
            f"status: running={idle.running} waiting={idle.waiting} "
            f"used pages={idle.used_pages} integrity ok={idle.integrity_ok}"
        )
    finally:
        to_scheduler.put(ExitMsg())
        loop.join()
        for queue in (to_scheduler, from_scheduler, io):
            queue.close()
        dist.destroy_process_group()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
