"""Tests of problem 144: The serve loop around the real scheduler."""

import os
from pathlib import Path


from minisgl.core import SamplingParams
from minisgl.message import (
    AbortBackendMsg,
    BatchMsg,
    DetokenizeMsg,
    ExitMsg,
    StatusMsg,
    StatusRequestMsg,
    UserMsg,
)
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.io import serve as reference_serve
from submission import serve

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it

MAX_ITERATIONS = 500  # a loop that never returns is stopped here


def prompt(seed: int, n: int) -> list[int]:
    return [(31 * seed + 17 * j) % 4000 + 3 for j in range(n)]


class ScriptedIO:
    """A SchedulerIO stand-in: each receive_msgs call takes the next list of the script.

    Once the script is used up, a blocking receive gets an ExitMsg (nothing will ever come)
    and a non-blocking one gets nothing. Records every call."""

    def __init__(self, script: list[list[object]]) -> None:
        self.script = [list(msgs) for msgs in script]
        self.blocks: list[bool] = []
        self.outputs: list[list] = []
        self.sent: list[object] = []

    def receive_msgs(self, block: bool) -> list[object]:
        self.blocks.append(block)
        assert len(self.blocks) < MAX_ITERATIONS, "serve() never returned"
        if self.script:
            return self.script.pop(0)
        return [ExitMsg()] if block else []

    def send_outputs(self, outputs: list) -> None:
        if outputs:
            self.outputs.append([(o.uid, o.token, o.finish_reason) for o in outputs])

    def send(self, msg: object) -> None:
        self.sent.append(msg)


def scheduler(**config) -> Scheduler:
    settings = dict(device="cpu", show_progress=False, num_pages=256, max_running_req=4) | config
    return Scheduler(SchedulerConfig(str(MODEL), **settings))


def run(loop, script, **config) -> ScriptedIO:
    io = ScriptedIO(script)
    loop(scheduler(**config), io)
    return io


def user(uid: int, n: int, max_tokens: int) -> UserMsg:
    return UserMsg(uid, prompt(uid, n), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def same_as_reference(script, **config) -> ScriptedIO:
    got, want = run(serve, script, **config), run(reference_serve, script, **config)
    assert got.blocks == want.blocks, (
        f"receive_msgs(block=...) calls: expected {want.blocks}, got {got.blocks}"
    )
    assert got.outputs == want.outputs, (
        f"tokens sent per step: expected {want.outputs}, got {got.outputs}"
    )
    assert got.sent == want.sent, f"other messages sent: expected {want.sent}, got {got.sent}"
    return got


def test_example_three_requests_then_exit():
    io = same_as_reference([[user(1, 5, 3), user(2, 7, 4), user(3, 4, 2)]])
    assert io.blocks[0] is True and io.blocks[-1] is True, io.blocks
    assert not any(io.blocks[1:-1]), f"blocked while requests were running: {io.blocks}"
    finished = {uid for step in io.outputs for uid, _, reason in step if reason is not None}
    assert finished == {1, 2, 3}, io.outputs


def test_requests_arriving_while_others_run_join_without_waiting():
    same_as_reference([[user(1, 6, 6)], [], [user(2, 3, 4)], [], [user(3, 9, 2)]])


def test_with_overlap_off_too():
    same_as_reference([[user(1, 6, 5)], [user(2, 3, 3)]], enable_overlap=False)


def test_an_idle_scheduler_is_never_stepped(monkeypatch):
    steps = []
    real_step = Scheduler.step
    monkeypatch.setattr(Scheduler, "step", lambda self: steps.append(1) or real_step(self))
    io = run(serve, [[StatusRequestMsg(7)], [StatusRequestMsg(8)]])
    assert steps == [], f"an idle scheduler was stepped {len(steps)} times"
    assert io.blocks == [True, True, True], io.blocks
    assert [m.request_id for m in io.sent if isinstance(m, StatusMsg)] == [7, 8], io.sent


def test_exit_returns_at_once_and_later_messages_are_not_handled():
    io = run(serve, [[user(1, 5, 50), ExitMsg(), StatusRequestMsg(3)]])
    assert io.sent == [], f"a message after ExitMsg was handled: {io.sent}"
    assert io.outputs == [], f"the loop stepped after ExitMsg: {io.outputs}"


def test_an_abort_stops_a_running_request_and_errors_are_answered():
    io = same_as_reference(
        [
            [user(1, 5, 40)],
            [],
            [AbortBackendMsg(1)],
            [],
            [UserMsg(2, [5] * 300, SamplingParams(max_tokens=4))],
            [StatusRequestMsg(9)],
        ]
    )
    tokens_of_1 = sum(1 for step in io.outputs for uid, _, _ in step if uid == 1)
    assert tokens_of_1 < 40, f"the aborted request produced {tokens_of_1} tokens"
    errors = [
        m
        for msg in io.sent
        if isinstance(msg, BatchMsg)
        for m in msg.data
        if isinstance(m, DetokenizeMsg) and m.error
    ]
    assert [m.uid for m in errors] == [2], io.sent
    [status] = [m for m in io.sent if isinstance(m, StatusMsg)]
    assert (status.running, status.waiting, status.used_pages) == (0, 0, 0), status
