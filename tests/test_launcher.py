"""The launcher's policy on trivial children (sleep, fail, report ready): a child that dies
stops the others within a bound and leaves one error naming it, how it ended and the end of
its stderr; exits after `begin_stop` are not deaths; `stop` kills a child that does not exit
and removes the directory; children ignore Ctrl-C and leave, removing the directory, when
their parent is killed. The children import this module by name to find their targets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import minisgl.launcher
from minisgl.launcher import PEER_DIED_STATUS, STOP_TIMEOUT_S, Launcher, ProcessDiedError
from minisgl.utils import PeerDiedError

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
START_S = 60.0  # a child imports torch before it runs its target: slow on a loaded machine
DEATH_MESSAGE = "on purpose, after writing to stderr"


def sleep_forever() -> None:
    while True:
        time.sleep(1)


def fail_when(path: str) -> None:
    """Raise once `path` exists (so the test decides when), after a line on stderr."""
    while not os.path.exists(path):
        time.sleep(0.05)
    print("failing now", file=sys.stderr)
    raise RuntimeError(DEATH_MESSAGE)


def lose_peer_when(path: str) -> None:
    """Raise PeerDiedError once `path` exists, as a rank does whose collective lost a peer."""
    while not os.path.exists(path):
        time.sleep(0.05)
    raise PeerDiedError("a collective failed, another rank is gone: Connection closed by peer")


def report_ready(ready: object) -> None:
    ready.send(0)  # type: ignore[attr-defined]
    sleep_forever()


def exit_now() -> None:
    pass


def orphan_children() -> None:
    """A parent that starts two sleeping children, prints their pids and directory, and waits
    to be killed (run by test_children_leave_with_their_parent_and_remove_the_directory)."""
    launcher = Launcher()
    for name in ("first", "second"):
        launcher.start(name, sleep_forever)
    pids = " ".join(str(p.pid) for p in launcher.processes.values())
    print(launcher.directory, pids, flush=True)
    sleep_forever()


def running(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_child_that_dies_stops_the_others_and_is_named_with_its_stderr(tmp_path: Path) -> None:
    trigger = tmp_path / "fail-now"
    launcher = Launcher()
    calls: list[int | None] = []  # the sleeper's status when the callback runs
    try:
        launcher.start("sleeper", sleep_forever)
        launcher.start("failing", fail_when, str(trigger))
        launcher.when_one_dies(lambda: calls.append(launcher.processes["sleeper"].poll()))
        assert launcher.wait_ready(1, 0.5) is False  # nobody reports ready: a timeout
        start = time.monotonic()
        trigger.touch()
        with pytest.raises(ProcessDiedError) as failure:
            launcher.check(grace_s=START_S)
        assert time.monotonic() - start < STOP_TIMEOUT_S + 5
        message = str(failure.value)
        first_line, *tail = message.splitlines()
        assert first_line == (
            "the failing process exited with status 1 (the others were stopped); "
            "its last lines on stderr:"
        )
        assert "    failing now" in tail and tail[-1] == f"    RuntimeError: {DEATH_MESSAGE}"
        assert launcher.processes["sleeper"].returncode == -signal.SIGTERM
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert calls == [-signal.SIGTERM], "called once, after the others were stopped"
        late: list[bool] = []
        launcher.when_one_dies(lambda: late.append(True))
        assert late == [True], "a callback registered after the death is called at once"
        with pytest.raises(ProcessDiedError):  # asked again, the same error
            launcher.check()
    finally:
        launcher.stop()
    assert not Path(launcher.directory).exists()


def test_a_child_that_lost_a_peer_names_the_peer_even_when_the_peer_exits_after_it(
    tmp_path: Path,
) -> None:
    """A rank's own teardown closes its connections before it exits, so the rank it was talking
    to may raise and exit first: the error must still name the rank that failed."""
    lose, fail = tmp_path / "lose", tmp_path / "fail"
    launcher = Launcher()
    try:
        launcher.start("scheduler rank 0", lose_peer_when, str(lose))
        launcher.start("scheduler rank 1", fail_when, str(fail))
        lose.touch()
        assert launcher.processes["scheduler rank 0"].wait(START_S) == PEER_DIED_STATUS
        time.sleep(0.5)  # the survivor's exit is seen first, and is not taken for the death
        assert launcher.failure is None
        fail.touch()
        with pytest.raises(ProcessDiedError) as failure:
            launcher.check(grace_s=START_S)
        assert str(failure.value).startswith("the scheduler rank 1 process exited with status 1")
        assert str(failure.value).endswith(f"RuntimeError: {DEATH_MESSAGE}")
    finally:
        launcher.stop()


def test_a_child_that_lost_a_peer_is_named_when_no_peer_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PeerDiedError with no death behind it (a collective that failed for another reason)
    still ends the group, after the grace, naming the child and its error."""
    monkeypatch.setattr(minisgl.launcher, "PEER_DEATH_GRACE_S", 0.5)
    lose = tmp_path / "lose"
    lose.touch()
    launcher = Launcher()
    try:
        launcher.start("sleeper", sleep_forever)
        launcher.start("lonely", lose_peer_when, str(lose))
        with pytest.raises(ProcessDiedError) as failure:
            launcher.check(grace_s=START_S)
        first_line, *tail = str(failure.value).splitlines()
        assert first_line.startswith(f"the lonely process exited with status {PEER_DIED_STATUS}")
        assert tail[-1] == "    error: a collective failed, another rank is gone: " + (
            "Connection closed by peer"
        )
        assert launcher.processes["sleeper"].returncode == -signal.SIGTERM
    finally:
        launcher.stop()


def test_an_exit_is_a_death_unless_the_launcher_is_stopping() -> None:
    launcher = Launcher()
    try:
        launcher.start("quitter", exit_now)
        with pytest.raises(ProcessDiedError, match="^the quitter process exited with status 0"):
            launcher.check(grace_s=START_S)
    finally:
        launcher.stop()
    launcher = Launcher()
    launcher.begin_stop()
    launcher.start("quitter", exit_now)
    launcher.processes["quitter"].wait(START_S)
    launcher.stop()
    assert launcher.failure is None
    launcher.check()


def test_wait_ready_counts_the_children_that_said_so_and_ctrl_c_is_left_to_the_launcher() -> None:
    launcher = Launcher()
    try:
        for name in ("a", "b"):
            launcher.start(name, report_ready, launcher.ready)
        assert launcher.wait_ready(2, START_S)
        for process in launcher.processes.values():
            process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert all(p.poll() is None for p in launcher.processes.values()), "killed by Ctrl-C"
        start = time.monotonic()
        launcher.stop(timeout_s=0.5)  # nobody asked them to exit: killed after the timeout
        assert time.monotonic() - start < 3
    finally:
        launcher.stop()
    assert [p.returncode for p in launcher.processes.values()] == [-signal.SIGKILL] * 2
    assert launcher.failure is None
    assert not Path(launcher.directory).exists()


def test_children_leave_with_their_parent_and_remove_the_directory() -> None:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    parent = subprocess.Popen(
        [sys.executable, "-c", "import test_launcher; test_launcher.orphan_children()"],
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=path),
        text=True,
    )
    assert parent.stdout is not None
    directory, *pids = parent.stdout.readline().split()
    assert Path(directory).is_dir() and len(pids) == 2
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(running(int(pid)) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if running(int(pid))]
    assert not Path(directory).exists()
