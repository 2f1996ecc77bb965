"""Chapter 14 tests: the scheduler process's I/O. Receiving never blocks while there is work
and blocks when idle; rank 0 broadcasts what it received over the ranks' gloo group; every
step's tokens go out as one message; aborts free pages at once. A real Scheduler (a tiny
random model) serves in a thread; the test talks to it through real ZMQ sockets."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist
from conftest import TINY_MODELS, hf_greedy_cached, require_model

from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    BatchMsg,
    DetokenizeMsg,
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
from minisgl.scheduler.utils import TokenOutput

MODEL = TINY_MODELS["llama"]
TIMEOUT_S = 60.0
PROMPTS = [[1, 15, 27, 300, 4], [1, 99, 7], [1, 8, 8, 8, 8, 8, 8, 2048]]


@pytest.fixture(scope="module")
def group() -> Iterator[dist.ProcessGroup]:
    """A gloo group of one rank, as the server runs until chapter 16."""
    directory = tempfile.mkdtemp(prefix="minisgl-dist-")
    dist.init_process_group("gloo", init_method=f"file://{directory}/init", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def sockets() -> Iterator[tuple[str, str]]:
    """(scheduler inbox, tokenizer inbox) addresses in a short temporary directory."""
    directory = tempfile.mkdtemp(prefix="minisgl-io-")
    yield ipc_address(directory, "scheduler"), ipc_address(directory, "tokenizer")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def scheduler() -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            str(require_model(MODEL)), num_pages=512, max_running_req=8, show_progress=False
        )
    )


# --- receive, broadcast, send ----------------------------------------------------------------


def test_receive_does_not_wait_when_there_is_work(sockets, group) -> None:  # noqa: ANN001
    io = SchedulerIO(*sockets, rank=0, group=group)
    start = time.monotonic()
    assert io.receive_msgs(block=False) == []
    assert time.monotonic() - start < 0.5
    io.close()


def test_receive_takes_every_queued_message_in_order(sockets, group) -> None:  # noqa: ANN001
    io = SchedulerIO(*sockets, rank=0, group=group)
    sender = ZmqPushQueue(sockets[0])
    for uid in range(6):
        sender.put(AbortBackendMsg(uid))
    time.sleep(0.5)  # let them arrive
    assert io.receive_msgs(block=False) == [AbortBackendMsg(uid) for uid in range(6)]
    sender.close()
    io.close()


def test_idle_receive_blocks_until_a_message_arrives(sockets, group) -> None:  # noqa: ANN001
    io = SchedulerIO(*sockets, rank=0, group=group)
    sender = ZmqPushQueue(sockets[0])
    threading.Timer(0.4, sender.put, args=(StatusRequestMsg(1),)).start()
    start = time.monotonic()
    assert io.receive_msgs(block=True) == [StatusRequestMsg(1)]
    assert time.monotonic() - start >= 0.3
    sender.close()
    io.close()


def test_rank_zero_broadcasts_what_it_received(sockets, group, monkeypatch) -> None:  # noqa: ANN001
    calls: list[list] = []
    real = dist.broadcast_object_list

    def recording(objects: list, src: int = 0, group=None, **kw) -> None:  # noqa: ANN001, ANN003
        calls.append([src, list(objects[0])])
        real(objects, src=src, group=group, **kw)

    monkeypatch.setattr(dist, "broadcast_object_list", recording)
    io = SchedulerIO(*sockets, rank=0, group=group)
    sender = ZmqPushQueue(sockets[0])
    sender.put(AbortBackendMsg(9))
    assert io.receive_msgs(block=True) == [AbortBackendMsg(9)]
    assert calls == [[0, [AbortBackendMsg(9)]]]
    sender.close()
    io.close()


def test_one_step_of_tokens_goes_out_as_one_message(sockets) -> None:  # noqa: ANN001
    io = SchedulerIO(*sockets)
    tokenizer_inbox = ZmqPullQueue(sockets[1])
    io.send_outputs([])  # nothing to say: nothing sent
    io.send_outputs([TokenOutput(1, 5), TokenOutput(2, 6, "stop")])
    assert tokenizer_inbox.get(timeout_s=5) == BatchMsg(
        [DetokenizeMsg(1, 5), DetokenizeMsg(2, 6, "stop")]
    )
    assert tokenizer_inbox.get(timeout_s=0.3) is None
    tokenizer_inbox.close()
    io.close()


# --- serving: a Scheduler behind the sockets ---------------------------------------------------


class Served:
    """A Scheduler serving in a thread; the test plays the tokenizer worker."""

    def __init__(self, scheduler: Scheduler, sockets: tuple[str, str]) -> None:
        self.to_scheduler = ZmqPushQueue(sockets[0])
        self.inbox = ZmqPullQueue(sockets[1])
        self.io = SchedulerIO(*sockets)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, args=(scheduler,), daemon=True)
        self.thread.start()

    def run(self, scheduler: Scheduler) -> None:
        try:
            serve(scheduler, self.io)
        except BaseException as error:  # noqa: BLE001 - reported by collect()
            self.error = error

    def collect(self, until: callable) -> list[object]:  # type: ignore[valid-type]
        """Messages from the scheduler (batches flattened) until `until(messages)`."""
        got: list[object] = []
        deadline = time.monotonic() + TIMEOUT_S
        while not until(got):
            assert self.error is None, f"serve() raised {self.error!r}"
            assert time.monotonic() < deadline, f"no answer in {TIMEOUT_S} s; got {got}"
            msg = self.inbox.get(timeout_s=1)
            if msg is not None:
                got += msg.data if isinstance(msg, BatchMsg) else [msg]
        return got

    def status(self) -> StatusMsg:
        self.to_scheduler.put(StatusRequestMsg(77))
        return [
            m
            for m in self.collect(lambda got: any(isinstance(m, StatusMsg) for m in got))
            if isinstance(m, StatusMsg)
        ][0]

    def stop(self) -> None:
        self.to_scheduler.put(ExitMsg())
        self.thread.join(TIMEOUT_S)
        assert not self.thread.is_alive(), "serve() did not return on ExitMsg"
        for queue in (self.to_scheduler, self.inbox, self.io):
            queue.close()


def finished(uids: set[int]):  # noqa: ANN201
    return lambda got: (
        uids
        <= {
            m.uid
            for m in got
            if isinstance(m, DetokenizeMsg) and (m.finish_reason is not None or m.error is not None)
        }
    )


def test_served_requests_generate_the_greedy_tokens(scheduler, sockets) -> None:  # noqa: ANN001
    served = Served(scheduler, sockets)
    for uid, prompt in enumerate(PROMPTS):
        served.to_scheduler.put(
            UserMsg(100 + uid, prompt, SamplingParams(max_tokens=6, ignore_eos=True))
        )
    got = served.collect(finished({100, 101, 102}))
    served.stop()
    for uid, prompt in enumerate(PROMPTS):
        tokens = [m.token for m in got if isinstance(m, DetokenizeMsg) and m.uid == 100 + uid]
        assert tokens == hf_greedy_cached(MODEL, prompt, 6)
        assert [m.finish_reason for m in got if m.uid == 100 + uid][-1] == "length"


def test_abort_frees_a_running_request_and_serving_goes_on(scheduler, sockets) -> None:  # noqa: ANN001
    served = Served(scheduler, sockets)
    served.to_scheduler.put(
        UserMsg(200, PROMPTS[0], SamplingParams(max_tokens=400, ignore_eos=True))
    )
    served.collect(lambda got: len(got) >= 3)  # it is running
    served.to_scheduler.put(AbortBackendMsg(200))
    served.to_scheduler.put(UserMsg(201, PROMPTS[1], SamplingParams(max_tokens=3, ignore_eos=True)))
    got = served.collect(finished({201}))
    status = served.status()
    served.stop()
    assert sum(1 for m in got if isinstance(m, DetokenizeMsg) and m.uid == 200) < 100
    assert (status.running, status.waiting, status.used_pages) == (0, 0, 0)
    assert status.integrity_ok is True


def test_a_request_that_can_never_fit_gets_an_error_not_a_crash(scheduler, sockets) -> None:  # noqa: ANN001
    served = Served(scheduler, sockets)
    served.to_scheduler.put(UserMsg(300, [1] * 600, SamplingParams(max_tokens=4)))
    served.to_scheduler.put(UserMsg(301, PROMPTS[2], SamplingParams(max_tokens=2, ignore_eos=True)))
    got = served.collect(finished({300, 301}))
    served.stop()
    [error] = [m for m in got if isinstance(m, DetokenizeMsg) and m.uid == 300]
    assert error.token is None and "600" in error.error
    assert [
        m.token for m in got if isinstance(m, DetokenizeMsg) and m.uid == 301
    ] == hf_greedy_cached(MODEL, PROMPTS[2], 2)


# --- more of the contract: found by the mutation catalogue (mutations.toml) ------------------


def test_an_idle_receive_also_takes_the_messages_queued_behind_the_first(sockets, group) -> None:  # noqa: ANN001
    io = SchedulerIO(*sockets, rank=0, group=group)
    sender = ZmqPushQueue(sockets[0])
    for uid in range(3):
        sender.put(AbortBackendMsg(uid))
    time.sleep(0.5)  # let them arrive
    assert io.receive_msgs(block=True) == [AbortBackendMsg(uid) for uid in range(3)]
    sender.close()
    io.close()


def test_a_rank_other_than_zero_sends_nothing(sockets) -> None:  # noqa: ANN001
    io = SchedulerIO(*sockets, rank=1)
    tokenizer_inbox = ZmqPullQueue(sockets[1])
    io.send_outputs([TokenOutput(1, 5)])  # rank 1 has no socket: rank 0 sends for all
    assert tokenizer_inbox.get(timeout_s=0.3) is None
    tokenizer_inbox.close()
    io.close()


def test_status_counts_a_running_request(scheduler, sockets) -> None:  # noqa: ANN001
    served = Served(scheduler, sockets)
    served.to_scheduler.put(
        UserMsg(400, PROMPTS[0], SamplingParams(max_tokens=400, ignore_eos=True))
    )
    served.collect(lambda got: len(got) >= 2)  # it is running
    status = served.status()
    served.to_scheduler.put(AbortBackendMsg(400))
    served.stop()
    assert status.request_id == 77
    assert (status.running, status.waiting) == (1, 0)
    assert status.used_pages > 0


def test_an_idle_scheduler_waits_on_the_socket_instead_of_polling(
    scheduler,
    sockets,  # noqa: ANN001
    monkeypatch,
) -> None:
    blocks: list[bool] = []
    receive = SchedulerIO.receive_msgs

    def recording(self: SchedulerIO, block: bool) -> list[object]:
        blocks.append(block)
        return receive(self, block)

    monkeypatch.setattr(SchedulerIO, "receive_msgs", recording)
    served = Served(scheduler, sockets)
    time.sleep(0.5)  # a step or two may finish an earlier test's work; then it is idle
    served.stop()
    assert blocks[-1] is True  # idle: it waited, and the ExitMsg ended the wait
    assert len(blocks) < 10  # it did not spin meanwhile
