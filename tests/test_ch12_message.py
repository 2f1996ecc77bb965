"""Chapter 12 tests: the wire format of messages (msgpack, token ids as packed int32) and the
ZMQ queues that carry them between processes (PUSH/PULL over IPC sockets)."""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from course.differential import (
    assert_same_call,
    call_differences,
    reference_function,
    use_reference_stubs,
)
from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    BatchMsg,
    DetokenizeMsg,
    ExitMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    ReplyMsg,
    StatusMsg,
    StatusRequestMsg,
    TokenizeMsg,
    UserMsg,
    deserialize,
    ipc_address,
    serialize,
)
from minisgl.message.serialize import EXT_DATACLASS, MessageError

# The module itself (the package's `serialize` is the function): its _encode and _decode are
# looked up on it at each call, so that use_reference_stubs swaps them.
serialize_module = importlib.import_module("minisgl.message.serialize")

EVERY_MESSAGE = [
    UserMsg(7, [1, 2, 49151, 0], SamplingParams(temperature=0.7, top_k=5, max_tokens=9, seed=3)),
    AbortBackendMsg(7),
    StatusRequestMsg(2),
    ExitMsg(),
    TokenizeMsg(1, SamplingParams(), prompt="Grüße 🙂", stop=["\n\n", "END"]),
    TokenizeMsg(2, SamplingParams(), messages=[{"role": "user", "content": "hi"}]),
    TokenizeMsg(3, SamplingParams(), prompt=[5, 6, 7]),
    DetokenizeMsg(7, 42, "length"),
    DetokenizeMsg(8, None, error="too long"),
    ReplyMsg(7, "Paris", "stop", 5, 3),
    StatusMsg(2, 1, 0, 30, 994, 12, 100, True),
    BatchMsg([DetokenizeMsg(1, 5), DetokenizeMsg(2, 6, "stop")]),
]


@pytest.mark.parametrize("msg", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_survives_a_round_trip(msg: object) -> None:
    data = serialize(msg)
    assert isinstance(data, bytes)
    assert deserialize(data) == msg


def test_token_ids_travel_as_packed_int32_bytes() -> None:
    ids = list(range(40_000, 41_000))
    data = serialize(UserMsg(0, ids, SamplingParams()))
    assert np.asarray(ids, dtype="<i4").tobytes() in data
    assert len(data) < 4 * len(ids) + 200
    assert deserialize(data).input_ids == ids


def test_an_empty_token_list_comes_back_empty() -> None:
    assert deserialize(serialize(UserMsg(1, [], SamplingParams()))).input_ids == []


def test_a_type_that_is_not_a_message_cannot_be_sent_or_received() -> None:
    with pytest.raises(MessageError):
        serialize(threading.Lock())
    forged = msgpack.packb(msgpack.ExtType(EXT_DATACLASS, msgpack.packb(["Popen", {}])))
    with pytest.raises(MessageError, match="Popen"):
        deserialize(forged)
    with pytest.raises(MessageError):
        deserialize(b"\xc1\xc1\xc1")


# --- the ZMQ queues -----------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # IPC socket paths are limited to ~100 characters: pytest's tmp_path can be too long.
    directory = tempfile.mkdtemp(prefix="minisgl-test-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_push_pull_delivers_every_message_in_order(socket_dir: str) -> None:
    inbox = ZmqPullQueue(ipc_address(socket_dir, "inbox"))
    sender = ZmqPushQueue(ipc_address(socket_dir, "inbox"))
    sent = [DetokenizeMsg(uid, uid * 10) for uid in range(50)]
    for msg in sent:
        sender.put(msg)
    received = [inbox.get(timeout_s=5) for _ in sent]
    assert received == sent
    sender.close()
    inbox.close()


def test_get_waits_for_a_late_message_and_times_out_when_none_comes(socket_dir: str) -> None:
    inbox = ZmqPullQueue(ipc_address(socket_dir, "inbox"))
    sender = ZmqPushQueue(ipc_address(socket_dir, "inbox"))
    start = time.monotonic()
    assert inbox.get(timeout_s=0.2) is None
    assert time.monotonic() - start >= 0.15
    threading.Timer(0.2, sender.put, args=(AbortBackendMsg(3),)).start()
    assert inbox.get(timeout_s=5) == AbortBackendMsg(3)
    sender.close()
    inbox.close()


def test_get_all_nowait_takes_what_is_queued_without_waiting(socket_dir: str) -> None:
    inbox = ZmqPullQueue(ipc_address(socket_dir, "inbox"))
    sender = ZmqPushQueue(ipc_address(socket_dir, "inbox"))
    start = time.monotonic()
    assert inbox.get_all_nowait() == []
    assert time.monotonic() - start < 0.1
    for uid in range(5):
        sender.put(AbortBackendMsg(uid))
    deadline = time.monotonic() + 5
    received: list[object] = []
    while len(received) < 5 and time.monotonic() < deadline:
        received += inbox.get_all_nowait()
    assert received == [AbortBackendMsg(uid) for uid in range(5)]
    sender.close()
    inbox.close()


def test_one_pull_socket_hears_several_senders(socket_dir: str) -> None:
    address = ipc_address(socket_dir, "tokenizer")
    inbox = ZmqPullQueue(address)
    api, scheduler = ZmqPushQueue(address), ZmqPushQueue(address)
    api.put(TokenizeMsg(1, SamplingParams(), prompt="hi"))
    scheduler.put(BatchMsg([DetokenizeMsg(1, 5)]))
    received = [inbox.get(timeout_s=5), inbox.get(timeout_s=5)]
    assert sorted(type(m).__name__ for m in received) == ["BatchMsg", "TokenizeMsg"]
    for queue in (api, scheduler, inbox):
        queue.close()


def test_a_dataclass_that_is_not_a_message_type_cannot_be_sent() -> None:
    @dataclasses.dataclass
    class Popen:
        args: list[str]

    with pytest.raises(MessageError, match="Popen"):
        serialize(Popen(["rm", "-rf", "/"]))


def test_an_unknown_extension_code_is_refused() -> None:
    with pytest.raises(MessageError):
        deserialize(msgpack.packb(msgpack.ExtType(EXT_DATACLASS + 40, b"\x00\x01")))


def test_get_without_a_timeout_waits_for_the_next_message(socket_dir: str) -> None:
    inbox = ZmqPullQueue(ipc_address(socket_dir, "inbox"))
    sender = ZmqPushQueue(ipc_address(socket_dir, "inbox"))
    start = time.monotonic()
    threading.Timer(0.3, sender.put, args=(AbortBackendMsg(4),)).start()
    assert inbox.get() == AbortBackendMsg(4)
    assert time.monotonic() - start >= 0.25
    sender.close()
    inbox.close()


def test_get_all_nowait_drains_every_queued_message_in_one_call(socket_dir: str) -> None:
    inbox = ZmqPullQueue(ipc_address(socket_dir, "inbox"))
    sender = ZmqPushQueue(ipc_address(socket_dir, "inbox"))
    for uid in range(5):
        sender.put(AbortBackendMsg(uid))
    assert inbox.socket.poll(5000)
    time.sleep(0.5)  # the other four follow the first within microseconds
    assert inbox.get_all_nowait() == [AbortBackendMsg(uid) for uid in range(5)]
    sender.close()
    inbox.close()


# --- the whole contract: every field of every message, of any value of its type ------------------

INT32 = st.integers(-(2**31), 2**31 - 1)  # what a token-id field can carry
UIDS = st.integers(0, 2**63 - 1)
COUNTS = st.integers(0, 2**31)
FINISH_REASONS = st.sampled_from([None, "stop", "length", "abort"])
TEXTS = st.text(max_size=20)
SAMPLING_PARAMS = st.builds(
    SamplingParams,
    temperature=st.floats(0.0, 2.0),
    top_k=st.one_of(st.just(-1), st.integers(1, 2**20)),
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    max_tokens=st.integers(1, 2**20),
    ignore_eos=st.booleans(),
    seed=st.none() | st.integers(0, 2**63 - 1),
)
SINGLE_MESSAGES = st.one_of(
    st.builds(UserMsg, UIDS, st.lists(INT32, max_size=30) | st.none(), SAMPLING_PARAMS),
    st.builds(AbortBackendMsg, UIDS),
    st.builds(StatusRequestMsg, UIDS),
    st.builds(ExitMsg),
    st.builds(
        TokenizeMsg,
        UIDS,
        SAMPLING_PARAMS,
        prompt=st.none() | TEXTS | st.lists(INT32, max_size=10),
        messages=st.none()
        | st.lists(st.fixed_dictionaries({"role": TEXTS, "content": TEXTS}), max_size=3),
        stop=st.lists(TEXTS, max_size=3),
    ),
    st.builds(DetokenizeMsg, UIDS, st.none() | INT32, FINISH_REASONS, st.none() | TEXTS),
    st.builds(ReplyMsg, UIDS, TEXTS, FINISH_REASONS, COUNTS, COUNTS, st.none() | TEXTS),
    st.builds(
        StatusMsg, UIDS, COUNTS, COUNTS, COUNTS, COUNTS, COUNTS, COUNTS, st.none() | st.booleans()
    ),
)
MESSAGES = SINGLE_MESSAGES | st.builds(BatchMsg, st.lists(SINGLE_MESSAGES, max_size=4))
QUICK = settings(derandomize=True, max_examples=150, deadline=None, database=None)


def assert_same(received: object, sent: object, where: str = "message") -> None:
    """Equal, and of the very same Python types all the way down (1 == 1.0 == True and
    [1] == np.array([1]).tolist(), but a decoded field must be what was sent)."""
    assert type(received) is type(sent), (
        f"{where} came back as {type(received).__name__}, not {type(sent).__name__}"
    )
    if dataclasses.is_dataclass(sent):
        for field in dataclasses.fields(sent):
            name = f"{where}.{field.name}"
            assert_same(getattr(received, field.name), getattr(sent, field.name), name)
    elif isinstance(sent, list):
        assert len(received) == len(sent), f"{where} has {len(received)} items, not {len(sent)}"
        for i, (got, item) in enumerate(zip(received, sent)):
            assert_same(got, item, f"{where}[{i}]")
    elif isinstance(sent, dict):
        assert received.keys() == sent.keys(), f"{where} has keys {list(received)}"
        for key in sent:
            assert_same(received[key], sent[key], f"{where}[{key!r}]")
    else:
        assert received == sent, f"{where} is {received!r}, sent {sent!r}"


@QUICK
@given(MESSAGES)
def test_every_field_comes_back_with_its_value_and_its_python_type(msg: object) -> None:
    assert_same(deserialize(serialize(msg)), msg)


@QUICK
@given(st.lists(INT32, min_size=1, max_size=50))
def test_token_ids_are_packed_as_little_endian_int32_and_come_back_as_ints(ids: list[int]) -> None:
    data = serialize(UserMsg(1, ids, SamplingParams()))
    assert np.asarray(ids, dtype="<i4").tobytes() in data, "token ids are not packed as int32"
    assert_same(deserialize(data).input_ids, ids, "input_ids")


def test_an_unknown_class_name_is_refused_not_decoded_as_something_else() -> None:
    forged = msgpack.packb(msgpack.ExtType(EXT_DATACLASS, msgpack.packb(["dict", {"uid": 1}])))
    with pytest.raises(MessageError, match="dict"):
        deserialize(forged)


def test_get_takes_one_message_and_leaves_the_rest_queued_in_order(socket_dir: str) -> None:
    inbox = ZmqPullQueue(ipc_address(socket_dir, "inbox"))
    sender = ZmqPushQueue(ipc_address(socket_dir, "inbox"))
    sent = [UserMsg(1, [5, 6], SamplingParams()), AbortBackendMsg(1), ExitMsg()]
    for msg in sent:
        sender.put(msg)
    assert inbox.get(timeout_s=5) == sent[0]
    time.sleep(0.3)  # the others are queued by now
    assert inbox.get_all_nowait() == sent[1:], "get() must take one message, not drain the queue"
    sender.close()
    inbox.close()


def test_get_counts_a_fraction_of_a_second_as_milliseconds(socket_dir: str) -> None:
    inbox = ZmqPullQueue(ipc_address(socket_dir, "inbox"))
    sender = ZmqPushQueue(ipc_address(socket_dir, "inbox"))
    threading.Timer(0.2, sender.put, args=(StatusRequestMsg(5),)).start()
    assert inbox.get(timeout_s=0.9) == StatusRequestMsg(5), "a 0.9 s wait missed a 0.2 s message"
    sender.close()
    inbox.close()


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): what it returns (types included) and the exception
# it raises must match. _decode gets what the reference's _encode makes; the queues get fresh
# in-process sockets (inproc://) with the same messages already queued, and after the call
# what is left in the queue is compared too.


@dataclasses.dataclass
class NotAMessage:
    """A dataclass the engine never sends (not in MESSAGE_TYPES)."""

    uid: int


NOT_MESSAGES = st.sampled_from(  # what _encode must refuse; built anew for each side
    [threading.Lock, set, object, lambda: NotAMessage(1), lambda: UserMsg, lambda: np.int64(3)]
)


@given(msg=MESSAGES | SAMPLING_PARAMS)
@settings(max_examples=50)
def test_encode_matches_the_reference(msg: object) -> None:
    """Every message type with fields of every value of their types (nested ones too)."""
    assert_same_call(serialize_module._encode, msg)


@given(make=NOT_MESSAGES)
@settings(max_examples=10)
def test_encode_refuses_what_the_reference_refuses(make) -> None:  # noqa: ANN001
    assert_same_call(serialize_module._encode, build=lambda: (make(),))


def reference_ext(msg: object) -> msgpack.ExtType:
    """The extension the reference's _encode makes of `msg` (nested messages included)."""
    with use_reference_stubs(12):
        return serialize_module._encode(msg)


UNKNOWN_NAMES = st.sampled_from(["Popen", "dict", "MessageError", "Req", "ChunkedReq", ""])
EXTENSIONS = st.one_of(  # (code, data) as msgpack hands them to _decode
    st.builds(lambda msg: tuple(reference_ext(msg)), MESSAGES | SAMPLING_PARAMS),
    st.builds(
        lambda ids: (serialize_module.EXT_TOKEN_IDS, np.asarray(ids, dtype="<i4").tobytes()),
        st.lists(INT32, max_size=20),
    ),
    st.builds(  # a class name nobody may decode, with or without fields
        lambda name, fields: (EXT_DATACLASS, msgpack.packb([name, fields])),
        UNKNOWN_NAMES,
        st.sampled_from([{}, {"uid": 1}, {"args": ["rm", "-rf", "/"]}]),
    ),
    st.builds(  # a code no minisgl message uses
        lambda code, data: (code, data),
        st.integers(-128, 127).filter(
            lambda c: c not in (EXT_DATACLASS, serialize_module.EXT_TOKEN_IDS)
        ),
        st.binary(max_size=8),
    ),
)


@given(extension=EXTENSIONS)
@settings(max_examples=60)
def test_decode_matches_the_reference(extension: tuple[int, bytes]) -> None:
    assert_same_call(serialize_module._decode, *extension)


# The queues: each side gets its own inproc socket pair with the same messages queued. The
# call runs in a thread: one that has not come back after GIVE_UP_S (a poll or a receive that
# waits for nothing) is woken by one more message, and reported.

LATE_S = 0.02  # a late message is put this long after the queue is built
LATE_TIMEOUT_S = 0.9  # get's timeout when a message comes late (under a second, on purpose)
GIVE_UP_S = 2.5  # the reference's calls here come back within a second
WAKE_UP = ExitMsg()
_inproc_names = iter(range(10**9))


@dataclasses.dataclass
class Inbox:
    """A pull queue, the push queue feeding it, and a message that is sent late (if any)."""

    pull: ZmqPullQueue
    push: ZmqPushQueue
    late: threading.Timer | None = None
    stuck: bool = False  # a call is still waiting on `pull`: it is never closed


def make_inbox(queued: list[object], late: object | None, opened: list[Inbox]) -> ZmqPullQueue:
    address = f"inproc://ch12-differential-{next(_inproc_names)}"
    inbox = Inbox(ZmqPullQueue(address), ZmqPushQueue(address))
    for msg in queued:  # inproc: queued once put returns
        inbox.push.put(msg)
    if late is not None:
        inbox.late = threading.Timer(LATE_S, inbox.push.put, args=(late,))
        inbox.late.start()
    opened.append(inbox)
    return inbox.pull


def observed(method: Callable[..., Any], opened: list[Inbox]) -> Callable[..., Any]:
    """The queue method, then what it returned (and whether within GIVE_UP_S), and what is
    still queued once the late message (if any) was sent."""

    def call(queue: ZmqPullQueue, *args: Any) -> dict[str, Any]:
        inbox = next(i for i in opened if i.pull is queue)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["returned"] = method(queue, *args)
            except Exception as error:  # raised again below, for the comparison
                outcome["raised"] = error

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(GIVE_UP_S)
        came_back = not worker.is_alive()
        if not came_back:
            inbox.push.put(WAKE_UP)
            worker.join(GIVE_UP_S)
            if worker.is_alive():  # the socket is still in use: nothing more to look at
                inbox.stuck = True
                still = f"nothing, still waiting after {2 * GIVE_UP_S} s"
                return {"returned": still, "left queued": "unknown"}
        if inbox.late is not None:
            inbox.late.join()
        if "raised" in outcome:
            raise outcome["raised"]
        returned = outcome["returned"]
        if not came_back:
            returned = f"nothing in {GIVE_UP_S} s (then, woken by a message: {returned!r})"
        left = []
        while queue.socket.poll(0):
            left.append(deserialize(queue.socket.recv()))
        return {"returned": returned, "left queued": left}

    return call


def assert_same_queue_call(name: str, queued: list, late: object | None, *args: Any) -> None:
    opened: list[Inbox] = []
    try:
        found = call_differences(
            observed(getattr(ZmqPullQueue, name), opened),
            reference=observed(reference_function(ZmqPullQueue, name), opened),
            build=lambda: (make_inbox(queued, late, opened), *args),
        )
    finally:
        for inbox in opened:
            if inbox.late is not None:
                inbox.late.join()
            inbox.push.close()
            if not inbox.stuck:
                inbox.pull.close()
    assert not found, (
        f"ZmqPullQueue.{name} (minisgl/message/transport.py) differs from the reference with "
        f"{queued} queued{f', {late} sent {LATE_S} s late' if late else ''}, arguments "
        f"{args}:\n  " + "\n  ".join(found)
    )


QUEUED = st.lists(SINGLE_MESSAGES, max_size=3)


@given(
    queued=QUEUED,
    timeout_s=st.sampled_from([0.05, 0, None, 0.001, 0.2]),
    late=st.sampled_from(["nothing else comes", "a message comes late"]),
    late_message=SINGLE_MESSAGES,
)
@example(queued=[], timeout_s=None, late="a message comes late", late_message=ExitMsg())
@example(queued=[], timeout_s=0, late="nothing else comes", late_message=ExitMsg())
@settings(max_examples=20)
def test_get_matches_the_reference(queued, timeout_s, late, late_message) -> None:  # noqa: ANN001
    """Messages already queued (get takes the first and leaves the rest), none (None once the
    timeout is over, 0 included), or one that comes while get waits (forever, or up to
    LATE_TIMEOUT_S: long enough that it surely comes in time)."""
    if late == "a message comes late" or (not queued and timeout_s is None):
        # (waiting forever for nothing would hang both sides)
        wait = None if timeout_s is None else LATE_TIMEOUT_S
        assert_same_queue_call("get", queued, late_message, wait)
    else:
        assert_same_queue_call("get", queued, None, timeout_s)


@given(queued=st.lists(SINGLE_MESSAGES, max_size=5))
@settings(max_examples=10)
def test_get_all_nowait_matches_the_reference(queued) -> None:  # noqa: ANN001
    """From an empty queue to five messages, each of any type: all of them, in order, and
    without waiting."""
    assert_same_queue_call("get_all_nowait", queued, None)
