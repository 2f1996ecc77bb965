"""Sandboxed runs: a chapter main or a test file in a subprocess, never trusted to end.

Every run is its own process group, killed whole at its timeout or when the user presses
Ctrl-C, so no process of a hanging or crashing student tree outlives the judge. (The commands
that make many runs start them warm, forked from a server that imported torch once: course.warm.)
Tests run under pytest with our plugin (pytest_plugin.py), which writes a record as they run:
each test when it starts, with its time limit, and its result when it ends. The judge reads the
record while the tests run, so it
- kills a test that overran its limit even when it is stuck in native code, where the plugin's
  own timeout cannot reach it (the test fails, named, with every thread's stack, and the run
  stops there, as for a test stuck in Python);
- names the test that was running when the process died (a segfault in a kernel: the outcome
  is "crashed", with the signal and every thread's stack) and keeps the results before it.
One reader of the record serves every tool (the judge, batch grading, mutants, practice).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path

from course import warm

TOOLS = Path(__file__).resolve().parent.parent
TIMEOUT_MARK = "Timeout >"  # how a test stopped at its limit is named (the plugin or the judge)
COLLECTING = "collecting "  # names the import of a test module: "collecting tests/test_x.py"
CRASHED = "crashed"  # the outcome of the test that was running when the test process died
FAILED = ("failed", "error", CRASHED)  # outcomes that count against a run
DUMP_SIGNAL = signal.SIGUSR1  # makes the plugin's faulthandler dump every thread's stack
POLL_S = 0.2  # how often the judge reads the record of a running test process
LIMIT_GRACE_S = 5.0  # past a test's limit, before the judge kills it from outside
DUMP_WAIT_S = 0.5  # for faulthandler to write the stacks before the process is killed


@dataclass
class TestCase:
    name: str
    outcome: str  # "passed", "failed", "error", "skipped" or "crashed"
    message: str = ""  # the assertion or exception, "" when passed
    details: str = ""  # the short traceback
    seconds: float = 0.0  # how long the test itself ran (its fixtures' setup aside)
    limit: float = 0.0  # the limit it ran under (0: none)

    @property
    def is_collection(self) -> bool:
        """The test module itself failed to import (or to be collected)."""
        return self.name.startswith(COLLECTING)

    @property
    def timed_out(self) -> bool:
        return TIMEOUT_MARK in self.message or TIMEOUT_MARK in self.details

    @property
    def crashed(self) -> bool:
        return self.outcome == CRASHED


@dataclass
class Run:
    """One subprocess: a main, or one pytest session over test files."""

    label: str
    seconds: float
    verdict: str  # "passed", or why not
    output: str = ""
    tests: list[TestCase] = field(default_factory=list)
    hung: str | None = None  # the test running when the whole run was stopped

    @property
    def ok(self) -> bool:
        return self.verdict == "passed"

    @property
    def failures(self) -> list[TestCase]:
        return [case for case in self.tests if case.outcome in FAILED]

    @property
    def passed(self) -> list[TestCase]:
        return [case for case in self.tests if case.outcome == "passed"]


@dataclass
class Process:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


# Every process group run_process has started and not yet reaped, from every thread: the
# tools run tests in thread pools (mutants, chapters, students), and a Ctrl-C reaches only the
# main thread, so the groups the workers wait on are killed from here (end_all_runs).
Started = subprocess.Popen | BaseProcess  # a fresh interpreter, or a warm fork (course.warm)
RUNNING: set[Started] = set()
ENDING = threading.Event()  # set once the tool is stopping: run_process starts nothing more


def end_all_runs() -> None:
    """Kill every running group, the thread-pool workers' included, and start no more."""
    ENDING.set()
    for proc in list(RUNNING):
        kill_group(proc)


def end_runs_on_interrupt() -> None:
    """Make Ctrl-C, SIGTERM and SIGHUP kill every running group at once, then raise
    KeyboardInterrupt in the main thread, which the tool reports as a stop.

    Killing first matters: unwinding through a thread pool waits for its workers, and they
    wait for their processes, which would otherwise run on to their time limits."""

    def interrupt(signum: int, frame: object) -> None:
        end_all_runs()
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupt)


def start_process(cmd: list[str], cwd: Path, env: dict[str, str], out: Path, err: Path) -> Started:
    """Start cmd in its own process group, stdout and stderr into `out` and `err`: warm when it
    is this Python (course.warm), else a fresh process."""
    if cmd[0] == sys.executable and len(cmd) > 1 and warm.warm_runs_available(env):
        return warm.start(cmd[1:], cwd, env, out, err)
    with out.open("wb") as stdout, err.open("wb") as stderr:
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )


def wait_process(proc: Started, timeout: float | None) -> int | None:
    """The exit status of `proc` once it ends, waiting at most `timeout` s (None: still running)."""
    if isinstance(proc, subprocess.Popen):
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
    return warm.exit_status(proc, timeout)


def run_process(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    overran: Callable[[], bool] | None = None,
    dump_stacks: bool = False,
) -> Process:
    """Run cmd in its own process group; kill the whole group at the timeout, or as soon as
    `overran()` (asked every POLL_S) says so (returncode None), or on Ctrl-C (then
    KeyboardInterrupt propagates, with nothing left running; also in a worker thread, once
    `end_all_runs` has killed its group). With `dump_stacks` the process gets DUMP_SIGNAL
    first, so that the pytest plugin records every thread's stack."""
    if ENDING.is_set():
        raise KeyboardInterrupt  # the tool is stopping (end_all_runs)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="minisgl-run-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        proc = start_process(cmd, cwd, env, out, err)
        RUNNING.add(proc)
        if ENDING.is_set():  # stopped while this one was starting
            kill_group(proc)
        returncode = None
        try:
            while returncode is None:
                returncode = wait_process(proc, POLL_S if overran else timeout)
                if ENDING.is_set():  # killed by end_all_runs: its result means nothing
                    raise KeyboardInterrupt
                if returncode is None and (
                    time.monotonic() - start >= timeout or (overran is not None and overran())
                ):
                    break
            if returncode is None:
                if dump_stacks:
                    signal_process(proc, DUMP_SIGNAL)
                    time.sleep(DUMP_WAIT_S)
                kill_group(proc)
                wait_process(proc, None)
        except KeyboardInterrupt:
            kill_group(proc)
            wait_process(proc, None)
            raise
        finally:
            RUNNING.discard(proc)
        stdout, stderr = (path.read_text("utf-8", errors="replace") for path in (out, err))
    return Process(returncode, stdout, stderr, time.monotonic() - start)


def signal_process(proc: Started, signum: int) -> None:
    try:
        os.kill(proc.pid, signum)
    except ProcessLookupError:
        pass


def kill_group(proc: Started) -> None:
    """Kill the process and every process of its group (a warm run killed before its first
    line, setsid, has no group yet: then the process alone, which has started nothing)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        signal_process(proc, signal.SIGKILL)


def sandbox_env(pythonpath: Path, jobs: int = 1, **extra: str) -> dict[str, str]:
    """The environment of a sandboxed run: `pythonpath` (the tree under test) comes first on the
    import path, so its `minisgl` shadows every other; then tools/ (the pytest plugin, and no
    minisgl); then the caller's PYTHONPATH entries, for packages installed outside the venv
    (FlashInfer under /tmp/site on the GPU machine, see benchmark/run_gpu.sh).

    Torch slows down badly when its threads outnumber free cores (chapter 0's tests on a busy
    2-core machine: 8 s with 1 thread, 15-80 s with 2), so each of `jobs` concurrent runs gets
    cores / jobs threads, at least one, unless OMP_NUM_THREADS is set."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // jobs))
    inherited = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(pythonpath), str(TOOLS), *inherited]),
        OMP_NUM_THREADS=threads,
        PYTHONDONTWRITEBYTECODE="1",
        TQDM_DISABLE="1",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        **extra,
    )


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def clean_output(text: str) -> str:
    """Output without progress-bar redraws (\\r) and terminal colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    return "".join(line.rsplit("\r", 1)[-1].rstrip() + "\n" for line in text.splitlines())


def run_main(
    main: Path,
    tree: Path,
    cwd: Path,
    timeout: float,
    env: dict[str, str],
    stopped: Callable[[], bool] | None = None,
) -> Run:
    """Run an example through tools/run_main.py, which checks that `minisgl` comes from `tree`
    and prints a secret token when the example ends: a tree that exits early with status 0
    (os._exit(0) at import) does not pass. `stopped()` turning True kills it (its Run then
    means nothing)."""
    token = secrets.token_hex(8)
    env = dict(env, MINISGL_TREE=str(tree), MINISGL_RUN_TOKEN=token)
    cmd = [sys.executable, str(TOOLS / "run_main.py"), str(main)]
    done = run_process(cmd, cwd, env, timeout, overran=stopped)
    if done.returncode is None:
        verdict = f"timed out after {timeout:.0f} s"
    elif done.returncode != 0:
        verdict = f"crashed (exit {done.returncode}): {last_line(done.stderr or done.stdout)}"
    else:
        finished = f"run_main: finished {token}" in done.stderr
        verdict = "passed" if finished else "exited before its end"
    # A passing main's stdout is what the site shows; a failing one's stderr says why.
    output = done.stdout if verdict == "passed" else done.stdout + done.stderr
    return Run(main.name, done.seconds, verdict, clean_output(output))


def run_pytest(
    label: str,
    targets: list[str],
    cwd: Path,
    env: dict[str, str],
    record: Path,
    timeout: float,
    test_timeout: float,
    extra: list[str] | None = None,
) -> Run:
    """Run pytest on `targets` (files or node ids); the plugin writes the results to `record`
    as the tests run, and faulthandler's stacks to `record.with_suffix(".stacks")`.

    `test_timeout` fails the test that runs longer and ends the run there (the tests after it
    do not run: a hang usually hangs every test that calls the same code); `timeout` stops the
    whole run, and the test that was running then is named in `Run.hung`. The test that was
    running when the process died gets the outcome "crashed", and the tests it did not reach
    run in a fresh process (the ones that ended, and the crashed one, deselected), again after
    each crash, so the verdict covers every test and names every crash."""
    started = time.monotonic()
    cases: list[TestCase] = []
    deaths: list[str] = []  # one per crash: "the test process died of ... while running ..."
    outputs: list[str] = []
    done_nodeids: list[str] = []
    while True:
        left = timeout - (time.monotonic() - started)
        deselect = [f"--deselect={nodeid}" for nodeid in done_nodeids]
        run, crashed = run_pytest_once(
            label, targets, cwd, env, record, left, test_timeout, [*(extra or []), *deselect]
        )
        cases += run.tests
        outputs.append(run.output)
        if crashed is None:
            break
        deaths.append(run.verdict)
        done_nodeids += crashed  # the tests that ended in that process, and the crashed one
        if time.monotonic() - started >= timeout:
            break
    seconds, output = time.monotonic() - started, "".join(outputs)
    if not deaths:
        return Run(label, seconds, run.verdict, output, cases, run.hung)
    others = [case for case in cases if not case.crashed]
    failed = sum(case.outcome in FAILED for case in others)
    verdict = "; ".join(deaths) + (
        f"; {failed} of {len(others)} other tests failed" if others else ""
    )
    if run.hung or run.verdict.startswith(("stopped", "no test ran")):
        verdict += f"; then {run.verdict}"
    return Run(label, seconds, verdict, output, cases, run.hung)


def run_pytest_once(
    label: str,
    targets: list[str],
    cwd: Path,
    env: dict[str, str],
    record: Path,
    timeout: float,
    test_timeout: float,
    extra: list[str],
) -> tuple[Run, list[str] | None]:
    """One pytest process of run_pytest: its Run, and when it died in the middle of a test
    (not of an import, where no later test could run either), the node ids of the tests that
    ended in it and of the one that crashed; else None."""
    record.parent.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    stacks = record.with_suffix(".stacks")
    stacks.unlink(missing_ok=True)  # a dump of an earlier run must not be read as this one's
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-v",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:faulthandler",  # pytest's own would send the stacks of a crash to stderr
        "-p",
        "course.pytest_plugin",
        f"--test-timeout={test_timeout:g}",
        f"--record={record}",
        f"--stacks={stacks}",
        "--tb=short",
        *extra,
    ]
    progress = Progress(record, stacks, cwd)
    done = run_process(cmd, cwd, env, timeout, progress.overran, dump_stacks=True)
    progress.read()
    cases, running = progress.cases, progress.running
    if progress.stopped is not None:
        stopped = progress.stopped
        cases.append(
            progress.interrupted(
                stopped,
                "failed",
                f"{TIMEOUT_MARK}{stopped.limit:g}s: {stopped.what} did not finish (stopped from "
                "outside the test process: it was waiting in native code)",
            )
        )
    elif done.returncode is None:  # the whole run ran out of time
        hung = running.name if running else None
        if running:
            why = f"the whole run was stopped while {running.doing}"
            cases.append(
                progress.interrupted(running, "failed", f"{TIMEOUT_MARK}{timeout:g}s: {why}")
            )
        verdict = f"stopped after {timeout:.0f} s" + (f" while running {hung}" if hung else "")
        return Run(label, done.seconds, verdict, done.stdout, cases, hung), None
    elif running is not None:  # the process died in the middle of a test or an import
        death = f"the test process {ended_how(done.returncode)} while {running.doing}"
        cases.append(progress.interrupted(running, CRASHED, death))
        if running.name.startswith(COLLECTING):
            return Run(label, done.seconds, f"no test ran: {death}", done.stdout, cases), None
        crashed = [*progress.finished_nodeids, running.nodeid] if running.nodeid else None
        return Run(label, done.seconds, death, done.stdout, cases), crashed
    bad = [case for case in cases if case.outcome in FAILED]
    if not cases:
        verdict = (
            f"no test ran (pytest exit {done.returncode}): {last_line(done.stdout + done.stderr)}"
        )
    elif bad:
        verdict = f"{len(bad)} of {len(cases)} failed"
    elif done.returncode not in (0, 5):
        verdict = f"pytest exit {done.returncode}: {last_line(done.stdout + done.stderr)}"
    else:
        verdict = "passed"
    return Run(label, done.seconds, verdict, done.stdout, cases), None


def ended_how(returncode: int) -> str:
    """How a process ended, in words: "died of SIGSEGV (signal 11)", "exited with status 1"."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "a signal"
    return f"died of {name} (signal {-returncode})"


@dataclass
class Running:
    """A test (or a test module's import) that the record says has started."""

    name: str
    limit: float  # seconds it may run from `since`; 0: no limit of its own (setup, teardown)
    since: float  # time.monotonic() when the judge read that it started
    nodeid: str = ""  # pytest's id of the test ("" for a module's import)

    @property
    def what(self) -> str:
        """The test's name, or "importing <module>"."""
        if self.name.startswith(COLLECTING):
            return f"importing {self.name.removeprefix(COLLECTING)}"
        return self.name

    @property
    def doing(self) -> str:
        return self.what if self.name.startswith(COLLECTING) else f"running {self.name}"


class Progress:
    """The plugin's record of a pytest run, read while it grows: the tests that finished, the
    one running, and the one the judge stopped at its limit."""

    def __init__(self, record: Path, stacks: Path, cwd: Path) -> None:
        self.record, self.stacks = record, stacks
        self.stacks_shown = stacks.relative_to(cwd) if stacks.is_relative_to(cwd) else stacks
        self.read_up_to = 0  # bytes of the record already read
        self.cases: list[TestCase] = []
        self.running: Running | None = None
        self.stopped: Running | None = None
        self.main_thread: int | None = None
        self.finished_nodeids: list[str] = []  # of the tests that ended, in order

    def read(self) -> None:
        if self.stopped:  # the judge's verdict on it stands, whatever the test did after
            return
        try:
            with self.record.open("rb") as file:
                file.seek(self.read_up_to)
                data = file.read()
        except FileNotFoundError:  # pytest has not configured the plugin yet
            return
        whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        self.read_up_to += len(whole)
        for line in whole.decode("utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # not the plugin's
                continue
            if "running" in event:
                self.running = Running(
                    event["running"], event["limit"], time.monotonic(), event.get("nodeid", "")
                )
            elif "finished" in event:
                self.running = None
                if event.get("nodeid"):
                    self.finished_nodeids.append(event["nodeid"])
                if event["outcome"] != "collected":  # a module that imported is no result
                    self.cases.append(
                        TestCase(
                            event["finished"],
                            event["outcome"],
                            event["message"],
                            event["details"],
                            event.get("seconds", 0.0),
                            event.get("limit", 0.0),
                        )
                    )
            elif "main_thread" in event:
                self.main_thread = event["main_thread"]

    def overran(self) -> bool:
        """Whether the running test is past its limit by LIMIT_GRACE_S: the plugin's own
        timeout could not stop it (it never returned to Python)."""
        self.read()
        running = self.running
        if (
            running
            and running.limit
            and time.monotonic() - running.since > running.limit + LIMIT_GRACE_S
        ):
            self.stopped = running
        return self.stopped is not None

    def interrupted(self, test: Running, outcome: str, message: str) -> TestCase:
        """The result of a test ended from outside: `message`, and as details every thread's
        stack, which faulthandler wrote when the process died or was stopped."""
        stacks = thread_stacks(self.stacks, self.main_thread)
        where = f"\n(every thread's stack: {self.stacks_shown})" if stacks else ""
        seconds = time.monotonic() - test.since
        return TestCase(test.name, outcome, message + where, stacks, seconds, test.limit)


THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def thread_stacks(path: Path, main_thread: int | None) -> str:
    """faulthandler's dump of every thread, rewritten to read like a traceback: each thread's
    frames innermost last, as `file:line in function` (the form failure reports look for
    the student's files in), and the thread that matters last (the one that crashed, or else
    the main thread, where the test runs). Other lines (the fatal error, the loaded extension
    modules, a native stack on Pythons that write one) are kept as they are."""
    try:
        text = path.read_text("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    crashed = "Fatal Python error" in text
    threads: list[tuple[bool, list[str]]] = []  # (matters, lines)
    before, after = [], []
    in_thread = False
    for line in text.splitlines():
        if found := THREAD.match(line):
            ident = int(found.group(2), 16)
            current = found.group(1) == "Current thread"
            matters = current if crashed else ident == main_thread
            title = "Main thread" if ident == main_thread else "Thread"
            threads.append((matters, [f"{title} {found.group(2)} (most recent call last):"]))
            in_thread = True
        elif in_thread and line.startswith(" "):  # a frame, or "<no Python frame>"
            frame = FRAME.match(line)
            threads[-1][1].insert(1, "  {}:{} in {}".format(*frame.groups()) if frame else line)
        elif line.strip():
            in_thread = False
            (after if threads else before).append(line.rstrip())
    threads.sort(key=lambda thread: thread[0])  # stable: the one that matters last
    return "\n".join(before + [line for _, lines in threads for line in lines] + after)
