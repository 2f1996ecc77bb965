"""Child processes: how every process of minisgl starts, and what happens when one dies.

The server starts its scheduler ranks and its tokenizer worker here (chapter 15), and a
tensor-parallel `LLM` its ranks 1..N-1 (chapter 16). A child is a fresh Python interpreter
that runs `target(*args)`; its stderr passes through this process, which keeps the end of it.

One policy for a child that dies (exits before `Launcher.stop`, whatever its status): the
launcher stops every other child at once (SIGTERM, then SIGKILL after `STOP_TIMEOUT_S`) and
keeps a `ProcessDiedError` naming the child, how it ended and the last lines of its stderr, for
the caller to raise: the server stops serving and exits with it, the `LLM` raises it from the
step that needed the dead rank. A child whose collective failed because a peer left
(`PeerDiedError`) did not fail itself: it exits with PEER_DIED_STATUS, and the launcher names the
peer instead, which may exit after it (its own teardown closes the connection first).

Children never outlive the launcher: each ignores SIGINT (the launcher handles Ctrl-C and stops
them between two steps) and exits, removing the launcher's directory, as soon as its parent is
gone, even if the parent was killed by SIGKILL.
"""

from __future__ import annotations

import codecs
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import minisgl
from minisgl.utils import MinisglError, PeerDiedError, exit_on_error

POLL_S = 0.2  # how often wait_ready looks for a death while no child is ready
STOP_TIMEOUT_S = 5.0  # a child asked to stop (or terminated) gets this long before SIGKILL
PARENT_POLL_S = 0.5  # how often a child checks that its parent is still there
STDERR_TAIL_BYTES = 1 << 14  # the end of a child's stderr kept for the error
STDERR_TAIL_LINES = 10  # ... of which a ProcessDiedError quotes this many lines
STDERR_DRAIN_S = 1.0  # after a death, how long to wait for its last stderr to arrive
PEER_DIED_STATUS = 3  # a child's exit status for "a peer died under my collective"
PEER_DEATH_GRACE_S = 10.0  # how long a PeerDiedError waits for the peer that died to be named
# A child is `python -c CHILD_COMMAND`, reading its work from stdin (see `child_main`).
CHILD_COMMAND = "import minisgl.launcher; minisgl.launcher.child_main()"


class ProcessDiedError(MinisglError):
    """A child process died; the launcher stopped the others, which cannot go on without it."""


def describe_exit(returncode: int) -> str:
    """'killed by SIGKILL' or 'exited with status 1'."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a real-time signal has no name
        return f"killed by signal {-returncode}"


@dataclass(frozen=True)
class ReadySignal:
    """The children's end of the launcher's ready pipe, passed to a child as an argument:
    `send(value)` tells the launcher this child is ready (`Launcher.wait_ready` counts them).
    The child inherits the pipe under the same descriptor number (Popen's `pass_fds`)."""

    fd: int

    def send(self, value: object) -> None:
        os.write(self.fd, b"\n")  # one line per ready child; the value is not needed


class Launcher:
    """Start children, watch them, stop them: the one owner of a group of processes.

    It owns a fresh temporary directory (`directory`) for whatever the children share, the
    sockets of a server or the rendezvous file of a tensor-parallel group; `stop` removes it.
    """

    def __init__(self, prefix: str = "minisgl-") -> None:
        self.directory = tempfile.mkdtemp(prefix=prefix)
        self.processes: dict[str, subprocess.Popen] = {}
        # The first child that died, set once the others are stopped.
        self.failure: ProcessDiedError | None = None
        self._stopping = False  # set by begin_stop: exits are expected from then on
        self._first_death: str | None = None
        self._died = threading.Event()  # set with `failure`
        self._on_death: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._tails: dict[str, deque[bytes]] = {}
        self._readers: dict[str, threading.Thread] = {}
        self._ready_read, ready_write = os.pipe()
        self.ready = ReadySignal(ready_write)
        self._ready_count = 0

    def start(self, name: str, target: Callable[..., None], *args: object) -> None:
        """Start the child `name` running `target(*args)` (both must pickle)."""
        # Spawn, never fork, for three reasons. CUDA cannot be used in a child forked from a
        # process that has used it (a tensor-parallel LLM's rank 0 is the user's process).
        # Forking a process that runs threads (our own stderr readers, the user's) copies
        # locks they may hold, and the child can hang on them. And multiprocessing's "spawn"
        # would run the user's script again in each child, starting the ranks again, unless
        # the script guards its code with `if __name__ == "__main__"`. The price of a fresh
        # interpreter: each child imports torch (and transformers) itself, a few seconds.
        package_root = str(Path(minisgl.__file__).resolve().parent.parent)
        path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD_COMMAND],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(self.ready.fd,),
            env=dict(os.environ, PYTHONPATH=path),
        )
        assert process.stdin is not None and process.stderr is not None
        # The parent's sys.path first, so that the target imports in the child as it does here.
        pickle.dump((sys.path, os.getpid(), self.directory), process.stdin)
        pickle.dump((target, args), process.stdin)
        process.stdin.close()
        self.processes[name] = process
        self._tails[name] = deque()
        reader = threading.Thread(target=self._copy_stderr, args=(name, process), daemon=True)
        reader.start()
        self._readers[name] = reader
        threading.Thread(target=self._reap, args=(name, process), daemon=True).start()

    def wait_ready(self, count: int, timeout_s: float) -> bool:
        """Wait until `count` children have sent on `ready`: True once they have, False after
        `timeout_s`; raise the ProcessDiedError if a child dies first."""
        deadline = time.monotonic() + timeout_s
        while self._ready_count < count:
            self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if select.select([self._ready_read], [], [], min(left, POLL_S))[0]:
                self._ready_count += os.read(self._ready_read, 4096).count(b"\n")
        return True

    def check(self, grace_s: float = 0.0) -> None:
        """Raise the ProcessDiedError if a child died, waiting up to `grace_s` for one to (a
        failed collective means a rank is going, but it may not have exited yet)."""
        self._died.wait(grace_s)
        if self.failure is not None:
            raise self.failure

    def when_one_dies(self, callback: Callable[[], None]) -> None:
        """Call `callback` (in a watcher thread) once a child has died and the others are
        stopped; at once if that has happened already."""
        with self._lock:
            self._on_death = callback
        self._notify_death()

    def begin_stop(self) -> None:
        """From now on a child that exits is not a death: call it before asking them to exit."""
        with self._lock:
            self._stopping = True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait up to `timeout_s` for every child to exit (the caller has asked them to, after
        `begin_stop`), kill those still running, and remove the directory."""
        self.begin_stop()
        self._end_children(timeout_s, terminate=False)
        if self.ready.fd >= 0:
            os.close(self._ready_read)
            os.close(self.ready.fd)
            self.ready = ReadySignal(-1)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _end_children(self, timeout_s: float, terminate: bool) -> None:
        """Wait for each child (terminating it first if asked) and kill it after `timeout_s`."""
        processes = list(self.processes.values())  # start() may still be adding some
        if terminate:
            for process in processes:
                if process.poll() is None:
                    process.terminate()
        deadline = time.monotonic() + timeout_s
        for process in processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _reap(self, name: str, process: subprocess.Popen) -> None:
        """Wait for one child; if it is the first to die, apply the death policy."""
        returncode = process.wait()
        if returncode == PEER_DIED_STATUS and not self._stopping:
            self._died.wait(PEER_DEATH_GRACE_S)  # the peer that died is the one to name
        with self._lock:
            if self._stopping or self._first_death is not None:
                return
            self._first_death = name
        self._readers[name].join(STDERR_DRAIN_S)  # its last words, written before it exited
        self._end_children(STOP_TIMEOUT_S, terminate=True)
        message = f"the {name} process {describe_exit(returncode)} (the others were stopped)"
        tail = self._stderr_tail(name)
        if tail:
            message += "; its last lines on stderr:\n" + tail
        with self._lock:
            self.failure = ProcessDiedError(message)
        self._died.set()
        self._notify_death()

    def _notify_death(self) -> None:
        """Call the death callback once there are both a callback and a death (and never
        after begin_stop, when the caller is stopping everything itself)."""
        with self._lock:
            callback = self._on_death if self.failure is not None and not self._stopping else None
            if callback is not None:
                self._on_death = None  # once
        if callback is not None:
            callback()

    def _copy_stderr(self, name: str, process: subprocess.Popen) -> None:
        """Copy a child's stderr to ours as it comes, keeping its last STDERR_TAIL_BYTES."""
        assert process.stderr is not None
        fd = process.stderr.fileno()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        tail, kept = self._tails[name], 0
        while chunk := os.read(fd, 1 << 16):
            tail.append(chunk)
            kept += len(chunk)
            while kept - len(tail[0]) >= STDERR_TAIL_BYTES:
                kept -= len(tail.popleft())
            try:
                sys.stderr.write(decoder.decode(chunk))
                sys.stderr.flush()
            except (AttributeError, OSError, ValueError):  # no stderr here: keep draining
                pass
        process.stderr.close()

    def _stderr_tail(self, name: str) -> str:
        """The last STDERR_TAIL_LINES non-empty lines a child wrote on stderr, indented."""
        text = b"".join(self._tails[name]).decode("utf-8", errors="replace")
        lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
        return "\n".join(f"    {line}" for line in lines[-STDERR_TAIL_LINES:])


def child_main() -> None:
    """The main of every child (`python -c CHILD_COMMAND`): read the parent's sys.path, pid
    and directory, then `(target, args)`, from stdin, and run `target(*args)`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's: it stops us
    path, parent_pid, directory = pickle.load(sys.stdin.buffer)
    sys.path[:] = path

    def exit_with_parent() -> None:
        """A child without its launcher serves no one: leave, and take its directory along
        (the launcher, killed by SIGKILL, could not remove it)."""
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        shutil.rmtree(directory, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    target, args = pickle.load(sys.stdin.buffer)
    with exit_on_error():
        try:
            target(*args)
        except PeerDiedError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(PEER_DIED_STATUS)
