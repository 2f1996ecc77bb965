"""Chapter 14 tests: the scheduler process's I/O. Receiving never blocks while there is work
and blocks when idle; rank 0 broadcasts what it received over the ranks' gloo group; every
step's tokens go out as one message; aborts free pages at once. A real Scheduler (a tiny
random model) serves in a thread; the test talks to it through real ZMQ sockets."""

from __future__ import annotations

import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from course.differential import assert_same_call
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import TINY_MODELS, assert_same_trace, hf_greedy_cached, require_model

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
    serialize,
)
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler import io as scheduler_io
from minisgl.scheduler.io import SchedulerIO, handle_msg, serve
from minisgl.scheduler.utils import SchedulerStatus, TokenOutput
from minisgl.utils import InvalidRequestError, RequestTooLongError

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


# --- the whole contract: every rank, every field, every message in any order --------------------


class RankGroup:
    """Ranks as threads of this process. Each rank's SchedulerIO gets its own group token,
    `RankGroup.Token`, and the broadcast meets at a barrier like gloo's: every rank must make
    it, rank 0's objects reach the others (pickled, as gloo does)."""

    @dataclass(frozen=True)
    class Token:
        rank: int

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=3)
        self.sent: list[object] = []

    def broadcast_object_list(self, objects: list, src: int = 0, group=None, **_: object) -> None:  # noqa: ANN001
        assert isinstance(group, RankGroup.Token), "broadcast over the SchedulerIO's own group"
        assert src == 0, f"rank 0 owns the sockets: it is the broadcast's source, not {src}"
        if group.rank == src:
            self.sent = pickle.dumps(objects)
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise AssertionError(
                f"rank {group.rank} waited in a broadcast that another rank never made"
            ) from None
        objects[:] = pickle.loads(self.sent)
        self.barrier.wait()

    def receive(self, ios: list[SchedulerIO], block: bool) -> list[list[object]]:
        """Every rank's receive_msgs(block), run at once: each rank's messages."""
        results: list[list[object]] = [[] for _ in ios]
        errors: list[BaseException] = []

        def one(rank: int) -> None:
            try:
                results[rank] = ios[rank].receive_msgs(block)
            except BaseException as error:  # re-raised in the test's thread
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=one, args=(rank,)) for rank in range(len(ios))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in threads), "a rank is still waiting"
        if errors:
            raise errors[0]
        return results


def test_every_rank_gets_rank_zeros_messages_in_every_step_even_an_empty_one(
    sockets,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = RankGroup(2)
    monkeypatch.setattr(dist, "broadcast_object_list", ranks.broadcast_object_list)
    ios = [SchedulerIO(*sockets, rank=rank, group=RankGroup.Token(rank)) for rank in range(2)]
    sender = ZmqPushQueue(sockets[0])
    # A step in which rank 0 received nothing: the others still meet it in the broadcast.
    assert ranks.receive(ios, block=False) == [[], []]
    batch = [UserMsg(1, [3, 4], SamplingParams(max_tokens=2)), AbortBackendMsg(1), ExitMsg()]
    for msg in batch:
        sender.put(msg)
    time.sleep(0.3)  # let them arrive
    assert ranks.receive(ios, block=False) == [batch, batch]
    assert ranks.receive(ios, block=False) == [[], []]
    threading.Timer(0.3, sender.put, args=(StatusRequestMsg(4),)).start()
    assert ranks.receive(ios, block=True) == [[StatusRequestMsg(4)]] * 2  # idle: rank 0 waits
    sender.close()
    for io in ios:
        io.close()


class Outbox:
    """An outbox stand-in that keeps what was put, after checking it can go on the wire."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def put(self, msg: object) -> None:
        serialize(msg)  # raises MessageError for anything that is not a message
        self.sent.append(msg)

    def close(self) -> None:
        pass


def io_with_outbox(rank: int = 0) -> tuple[SchedulerIO, Outbox]:
    io = SchedulerIO(None, None, rank=rank)
    io.outbox = Outbox() if rank == 0 else None
    return io, io.outbox or Outbox()


def detokenize_msgs(sent: list[object]) -> list[object]:
    """What was sent, batches flattened."""
    return [item for msg in sent for item in (msg.data if isinstance(msg, BatchMsg) else [msg])]


TOKEN_OUTPUTS = st.lists(
    st.builds(
        TokenOutput,
        st.integers(0, 2**40),
        st.integers(0, 2**31 - 1),
        st.sampled_from([None, "stop", "length"]),
    ),
    max_size=6,
)
QUICK = settings(derandomize=True, max_examples=60, deadline=None, database=None)


@QUICK
@given(TOKEN_OUTPUTS)
def test_a_steps_outputs_become_one_batch_with_every_field_in_place(
    outputs: list[TokenOutput],
) -> None:
    io, outbox = io_with_outbox()
    io.send_outputs(outputs)
    if not outputs:
        assert outbox.sent == [], "a step with no token sends nothing"
        return
    assert len(outbox.sent) == 1 and isinstance(outbox.sent[0], BatchMsg), "one BatchMsg a step"
    assert outbox.sent[0].data == [
        DetokenizeMsg(out.uid, out.token, out.finish_reason, error=None) for out in outputs
    ]


COUNT = st.integers(0, 10**6)
STATUSES = st.builds(
    SchedulerStatus,
    running=COUNT,
    waiting=COUNT,
    free_pages=COUNT,
    cached_pages=COUNT,
    used_pages=COUNT,
    num_pages=COUNT,
    generated_tokens=COUNT,
    integrity_ok=st.none() | st.booleans(),
)


class RecordingScheduler:
    """The scheduler's side of handle_msg, recorded: add_request, abort_request, status."""

    def __init__(self, status: SchedulerStatus | None = None, refusal: Exception | None = None):
        self.calls: list[tuple] = []
        self.status_value, self.refusal = status, refusal

    def add_request(self, input_ids: list[int], sampling_params: SamplingParams, uid=None) -> int:  # noqa: ANN001
        if self.refusal is not None:
            raise self.refusal
        self.calls.append(("add", list(input_ids), sampling_params, uid))
        return uid

    def abort_request(self, uid: int) -> bool:
        self.calls.append(("abort", uid))
        return True

    def status(self) -> SchedulerStatus:
        return self.status_value


@QUICK
@given(STATUSES, st.integers(0, 2**40))
def test_a_status_request_is_answered_with_every_field_of_the_status(
    status: SchedulerStatus, request_id: int
) -> None:
    io, outbox = io_with_outbox()
    handle_msg(RecordingScheduler(status), io, StatusRequestMsg(request_id))  # type: ignore[arg-type]
    expected = StatusMsg(
        request_id=request_id,
        running=status.running,
        waiting=status.waiting,
        used_pages=status.used_pages,
        free_pages=status.free_pages,
        cached_pages=status.cached_pages,
        generated_tokens=status.generated_tokens,
        integrity_ok=status.integrity_ok,
    )
    assert outbox.sent == [expected], f"for {status}"


def test_a_request_is_queued_with_its_own_uid_ids_and_sampling_params() -> None:
    scheduler, (io, outbox) = RecordingScheduler(), io_with_outbox()
    params = SamplingParams(temperature=0.5, top_k=3, max_tokens=7, seed=1)
    handle_msg(scheduler, io, UserMsg(41, [5, 6, 7], params))  # type: ignore[arg-type]
    handle_msg(scheduler, io, AbortBackendMsg(40))  # type: ignore[arg-type]
    assert scheduler.calls == [("add", [5, 6, 7], params, 41), ("abort", 40)]
    assert outbox.sent == []


@pytest.mark.parametrize(
    "refusal",
    [RequestTooLongError("600 tokens can never fit"), InvalidRequestError("uid 3 is in use")],
    ids=["too long", "invalid"],
)
def test_a_refused_request_gets_one_error_message_and_no_token(refusal: Exception) -> None:
    io, outbox = io_with_outbox()
    handle_msg(RecordingScheduler(refusal=refusal), io, UserMsg(3, [1], SamplingParams()))  # type: ignore[arg-type]
    assert detokenize_msgs(outbox.sent) == [
        DetokenizeMsg(3, None, finish_reason=None, error=str(refusal))
    ]


@pytest.fixture(scope="module")
def chunking_scheduler() -> Scheduler:
    """A scheduler that prefills at most 4 prompt tokens a step: prompts run in chunks."""
    return Scheduler(
        SchedulerConfig(
            str(require_model(MODEL)),
            num_pages=64,
            max_running_req=4,
            max_extend_tokens=4,
            show_progress=False,
        )
    )


def run_until_idle(scheduler: Scheduler) -> list[TokenOutput]:
    outputs: list[TokenOutput] = []
    for _ in range(100):
        if not scheduler.has_work:
            return outputs
        outputs += scheduler.step()
    raise AssertionError("the scheduler still has work after 100 steps")


def test_an_abort_for_a_queued_request_frees_it_before_it_runs(chunking_scheduler) -> None:  # noqa: ANN001
    io, outbox = io_with_outbox()
    handle_msg(chunking_scheduler, io, UserMsg(500, PROMPTS[0], SamplingParams(max_tokens=3)))
    handle_msg(chunking_scheduler, io, AbortBackendMsg(500))
    assert not chunking_scheduler.has_work, "the aborted request is still queued"
    status = chunking_scheduler.status()
    assert (status.running, status.waiting, status.used_pages) == (0, 0, 0)


def test_an_abort_for_a_request_in_the_middle_of_its_chunks_frees_its_pages(
    chunking_scheduler,  # noqa: ANN001
) -> None:
    io, outbox = io_with_outbox()
    long_prompt = PROMPTS[2] * 2  # 16 tokens: 4 chunks of 4
    handle_msg(chunking_scheduler, io, UserMsg(501, long_prompt, SamplingParams(max_tokens=3)))
    assert chunking_scheduler.step() == []  # the first chunk: no token yet
    assert chunking_scheduler.status().used_pages > 0
    handle_msg(chunking_scheduler, io, AbortBackendMsg(501))
    assert [out for out in run_until_idle(chunking_scheduler) if out.uid == 501] == []
    status = chunking_scheduler.status()
    assert (status.running, status.waiting, status.used_pages) == (0, 0, 0)
    assert status.integrity_ok is True


class ScriptedIO:
    """The tokenizer worker's side of serve(), as a script: each receive_msgs returns the next
    batch; once the script is done, nothing more comes while there is work, and an ExitMsg
    once serve() waits (idle). Records what serve() sends and whether it blocked with work."""

    def __init__(self, scheduler: Scheduler, script: list[list[object]]) -> None:
        self.scheduler, self.script = scheduler, list(script)
        self.outputs: list[TokenOutput] = []
        self.sent: list[object] = []
        self.calls = 0

    def receive_msgs(self, block: bool) -> list[object]:
        self.calls += 1
        assert self.calls < 200, "serve() did not return on the ExitMsg"
        assert block == (not self.scheduler.has_work), (
            f"receive_msgs(block={block}) while has_work is {self.scheduler.has_work}"
        )
        if self.script:
            return self.script.pop(0)
        return [ExitMsg()] if block else []

    def send_outputs(self, outputs: list[TokenOutput]) -> None:
        self.outputs += outputs

    def send(self, msg: object) -> None:
        self.sent.append(msg)


def test_serve_handles_the_messages_ahead_of_an_exit_in_the_same_batch_then_returns(
    scheduler,  # noqa: ANN001
) -> None:
    io = ScriptedIO(scheduler, [[StatusRequestMsg(8), ExitMsg()], [StatusRequestMsg(9)]])
    serve(scheduler, io)  # type: ignore[arg-type]
    assert [msg.request_id for msg in io.sent] == [8], "answer the status, then return at once"


def test_serve_runs_every_request_of_a_batch_but_one_aborted_behind_it(scheduler) -> None:  # noqa: ANN001
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    batch = [
        UserMsg(600, PROMPTS[0], params),
        UserMsg(601, PROMPTS[1], params),
        AbortBackendMsg(600),
    ]
    io = ScriptedIO(scheduler, [batch])
    serve(scheduler, io)  # type: ignore[arg-type]
    assert [out.uid for out in io.outputs if out.uid == 600] == [], "600 was aborted at once"
    tokens = [out for out in io.outputs if out.uid == 601]
    assert [out.token for out in tokens] == hf_greedy_cached(MODEL, PROMPTS[1], 3)
    assert [out.finish_reason for out in tokens] == [None, None, "length"]
    assert not scheduler.has_work and scheduler.status().used_pages == 0


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. The sockets and the ranks' group are stand-ins that keep
# what happened to them; serve() shows only through its loop: a scripted conversation with a
# real scheduler, in events, yours against the chapter's reference stubs.

MESSAGES = st.one_of(
    st.builds(
        UserMsg,
        st.integers(0, 9),
        st.lists(st.integers(1, 500), max_size=4),
        st.builds(SamplingParams, max_tokens=st.integers(1, 8)),
    ),
    st.builds(AbortBackendMsg, st.integers(0, 9)),
    st.builds(StatusRequestMsg, st.integers(0, 99)),
    st.just(ExitMsg()),
)


class IdleForever(Exception):
    """What a stand-in socket raises where the real one would wait forever."""


class FakeInbox:
    """Rank 0's socket: `queued` messages are there already; `arriving` come, all at once,
    only to a receive that waits (get() without a timeout)."""

    def __init__(self, queued: list[object], arriving: list[object]) -> None:
        self.queued, self.arriving = list(queued), list(arriving)

    def get(self, timeout_s: float | None = None) -> object | None:
        if not self.queued and timeout_s is None:
            if not self.arriving:
                raise IdleForever("an idle wait for a message that never comes")
            self.queued, self.arriving = self.arriving, []
        return self.queued.pop(0) if self.queued else None

    def get_all_nowait(self) -> list[object]:
        msgs, self.queued = self.queued, []
        return msgs

    def close(self) -> None:
        pass


@dataclass
class FakeGroup:
    """One rank's view of the ranks' group: what rank 0 broadcasts reaches it; every
    broadcast it joined is kept as (source, what the source sent, or None on the others)."""

    rank: int
    from_rank_zero: list[object]
    broadcasts: list[tuple[int, object]]


def fake_broadcast(objects: list, src: int = 0, group: object = None, **_: object) -> None:
    if not isinstance(group, FakeGroup):
        raise RuntimeError("broadcast without the SchedulerIO's group (this rank is alone)")
    if group.rank == src:
        group.broadcasts.append((src, pickle.loads(pickle.dumps(objects))))
    else:
        group.broadcasts.append((src, None))
        objects[:] = [list(group.from_rank_zero)]


@settings(max_examples=60)
@given(
    rank=st.integers(0, 3),
    grouped=st.booleans(),
    with_inbox=st.booleans(),
    block=st.booleans(),
    queued=st.lists(MESSAGES, max_size=4),
    arriving=st.lists(MESSAGES, max_size=3),
    from_rank_zero=st.lists(MESSAGES, max_size=3),
)
def test_receive_msgs_matches_the_reference(
    rank, grouped, with_inbox, block, queued, arriving, from_rank_zero
) -> None:  # noqa: ANN001
    """Rank 0 with or without a socket and a group, the other ranks in a group; waiting or
    not, with messages queued, arriving only to a wait, or none at all."""
    io = SchedulerIO(None, None, rank=rank)
    if rank == 0 and with_inbox:
        io.inbox = FakeInbox(queued, arriving)  # type: ignore[assignment]
    if rank != 0 or grouped:
        io.group = FakeGroup(rank, from_rank_zero, [])  # type: ignore[assignment]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dist, "broadcast_object_list", fake_broadcast)
        assert_same_call(SchedulerIO.receive_msgs, io, block)


@settings(max_examples=40)
@given(rank=st.integers(0, 2), with_outbox=st.booleans(), outputs=TOKEN_OUTPUTS)
def test_send_outputs_matches_the_reference(rank, with_outbox, outputs) -> None:  # noqa: ANN001
    """Rank 0 with a socket (what it sends is kept), rank 0 without one (the offline LLM's),
    the other ranks; steps with no token, one, several."""
    io, _ = io_with_outbox(rank)
    if not with_outbox:
        io.outbox = None
    assert_same_call(SchedulerIO.send_outputs, io, outputs)


class RecordingSchedulerCopy(RecordingScheduler):
    """RecordingScheduler, keeping a request's ids as a list whatever the type they came in;
    an abort finds the request or not (`known`)."""

    def __init__(self, status: SchedulerStatus, refusal: Exception | None, known: bool) -> None:
        super().__init__(status, refusal)
        self.known = known

    def add_request(self, input_ids, sampling_params, uid=None) -> int:  # noqa: ANN001
        return super().add_request(torch.as_tensor(input_ids).tolist(), sampling_params, uid)

    def abort_request(self, uid: int) -> bool:
        super().abort_request(uid)
        return self.known


REFUSALS = st.sampled_from(
    [None, RequestTooLongError("1000 tokens can never fit"), InvalidRequestError("uid in use")]
)


@settings(max_examples=60)
@given(
    msg=MESSAGES.filter(lambda msg: not isinstance(msg, ExitMsg)),  # serve() keeps those
    status=STATUSES,
    refusal=REFUSALS,
    known=st.booleans(),
    with_outbox=st.booleans(),
)
def test_handle_msg_matches_the_reference(msg, status, refusal, known, with_outbox) -> None:  # noqa: ANN001
    """A request, an abort, a status request, with a scheduler that queues or refuses, that
    finds the request to abort or not; the scheduler's calls and what goes out must be the
    reference's. (What handle_msg does with other messages, the docstring leaves open.)"""
    scheduler = RecordingSchedulerCopy(status, refusal, known)
    io, _ = io_with_outbox()
    if not with_outbox:
        io.outbox = None
    assert_same_call(handle_msg, scheduler, io, msg)


class TracedIO:
    """serve()'s side of the sockets, as events: each receive (whether it waited, whether the
    scheduler had work) hands over the script's next batch, each step's tokens and every other
    message sent are kept. When the script is done, a waiting receive gets an ExitMsg."""

    MAX_EVENTS = 300

    def __init__(self, scheduler: Scheduler, script: list[list[object]]) -> None:
        self.scheduler, self.script = scheduler, list(script)
        self.events: list[str] = []

    def receive_msgs(self, block: bool) -> list[object]:
        if len(self.events) > self.MAX_EVENTS:
            raise IdleForever(f"serve() still receiving after {self.MAX_EVENTS} events")
        while block and self.script and not self.script[0]:
            self.script.pop(0)  # a receive that waits returns once a message came
        msgs = self.script.pop(0) if self.script else [ExitMsg()] if block else []
        self.events.append(f"receive(block={block}), has_work {self.scheduler.has_work}: {msgs}")
        return msgs

    def send_outputs(self, outputs: list[TokenOutput]) -> None:
        if outputs:  # an empty step may be sent or not: nothing goes out either way
            self.events.append(f"tokens {[(o.uid, o.token, o.finish_reason) for o in outputs]}")

    def send(self, msg: object) -> None:
        self.events.append(f"sent {msg}")


def random_script(seed: int) -> list[list[object]]:
    """Batches of messages as the tokenizer worker sends them: requests (now and then empty,
    too long, or under a uid still in use), aborts of requests running, queued, finished or
    unknown, status requests, empty batches; with an even seed, an ExitMsg in the middle of a
    batch, more messages behind it and more batches after it."""
    rng = __import__("random").Random(seed)
    script: list[list[object]] = []
    uids: list[int] = []
    for _ in range(rng.randint(5, 7)):
        batch: list[object] = []
        for _ in range(rng.randint(0, 3)):
            kind = rng.random()
            if kind < 0.5:
                uid = rng.choice(uids) if uids and rng.random() < 0.15 else len(uids)
                length = rng.choice([0, 100] + [rng.randint(1, 12)] * 8)
                params = SamplingParams(max_tokens=rng.randint(1, 6), ignore_eos=rng.random() < 0.7)
                batch.append(UserMsg(uid, [rng.randint(1, 400) for _ in range(length)], params))
                uids.append(uid)
            elif kind < 0.75:
                batch.append(AbortBackendMsg(rng.choice(uids) if uids else 99))
            else:
                batch.append(StatusRequestMsg(rng.randint(0, 99)))
        script.append(batch)
    if seed % 2 == 0:
        middle = script[len(script) // 2]
        middle[rng.randint(0, len(middle)) :] = [ExitMsg(), StatusRequestMsg(1)]
    return script


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_serve_runs_a_scripted_conversation_as_the_reference_does(seed: int) -> None:
    """serve() and handle_msg() on a real scheduler (a KV pool of 96 pages, so a prompt of 100
    tokens never fits): every receive (waiting exactly when idle), token, refusal and status
    answer, and where it returns, as with the chapter's reference code."""

    def run() -> list[str]:
        built = Scheduler(
            SchedulerConfig(
                str(require_model(MODEL)),
                num_pages=96,
                max_running_req=3,
                max_extend_tokens=8,
                show_progress=False,
            )
        )
        io = TracedIO(built, random_script(seed))
        try:  # through the module: use_reference_stubs swaps the module's function
            scheduler_io.serve(built, io)  # type: ignore[arg-type]
            io.events.append("returned")
        except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
            io.events.append(f"raised {type(error).__name__}: {error}")
        status = built.status()
        io.events.append(f"left running {status.running}, waiting {status.waiting}")
        return io.events

    assert_same_trace(14, run, f"script {seed}")
