"""A pytest plugin for sandboxed runs: per-test time limits, a results record, stack dumps.

Each test gets `--test-timeout` seconds. A test that starts processes of its own (chapter 16's
ranks) may ask for more with `@pytest.mark.time_limit(seconds)`: the larger of the two applies,
so a loaded machine does not fail a correct tree.

A test that runs longer is failed where it stands (SIGALRM, so a pure-Python infinite loop is
interrupted), and the session stops there: a stub that loops forever usually hangs every test
that calls it, and one named hang is the whole verdict. Importing a test module (which imports
the student's code) gets the same limit.

SIGALRM cannot stop code that never returns to Python (a wait in C++, a Triton kernel), and
nothing in the process survives a segfault, so the judge watches from outside (runner.py):
- `--record FILE` gets one JSON line when a test (or a module's import) starts to run, with
  the limit it runs under, and one when it has finished, with its result. Written as they
  happen, the results of the tests before a crash are kept, and the judge knows which test was
  running when the process died or overran its limit.
- `--stacks FILE` receives faulthandler's dump of every thread's stack: on a fatal signal
  (SIGSEGV, SIGABRT, ...) and when the judge sends SIGUSR1 before it kills a test at its limit.
Loaded with `-p course.pytest_plugin` and `-p no:faulthandler` (pytest's own would take the
fatal signals back to stderr).
"""

from __future__ import annotations

import faulthandler
import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO

import pytest

from course.runner import COLLECTING, DUMP_SIGNAL, TIMEOUT_MARK


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--test-timeout",
        type=float,
        default=0.0,
        help="seconds one test (or one test module's import) may run; 0: no limit",
    )
    parser.addoption("--record", type=Path, help="JSON lines: each test as it starts and ends")
    parser.addoption("--stacks", type=Path, help="where faulthandler dumps every thread's stack")


def limit_of(config: pytest.Config, at_least: float = 0.0) -> float:
    """The seconds a test may run: `--test-timeout`, or its time_limit mark when larger."""
    seconds = config.getoption("--test-timeout")
    return max(seconds, at_least) if seconds else 0.0


@contextmanager
def time_limit(session: pytest.Session, what: str, seconds: float) -> Iterator[None]:
    if not seconds:
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        session.shouldstop = f"{what} was stopped after {seconds:g} s"
        where = (
            f" (it was at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name})"
            if frame
            else ""
        )
        pytest.fail(f"{TIMEOUT_MARK}{seconds:g}s: {what} did not finish{where}", pytrace=False)

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def failure_text(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The message of a failure or skip, as pytest's JUnit report writes it."""
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return report.longrepr[2].removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message if crash is not None else str(report.longrepr or "")


def outcome_of(reports: list[pytest.TestReport]) -> tuple[str, pytest.TestReport | None]:
    """A test's outcome over its setup, call and teardown: the first phase that did not pass
    decides (a failing call is "failed", a failing fixture "error")."""
    for report in reports:
        if report.failed:
            return ("failed" if report.when == "call" else "error"), report
        if report.skipped:
            return "skipped", report
    return "passed", None


class Recorder:
    """The plugin's hooks, with the record and the stacks file they write (one per session)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        record, stacks = config.getoption("--record"), config.getoption("--stacks")
        self.record = record.open("a", encoding="utf-8") if record else None
        self.stacks: IO[str] | None = None
        if stacks:
            self.stacks = stacks.open("w", encoding="utf-8")
            faulthandler.enable(self.stacks, all_threads=True)
            faulthandler.register(DUMP_SIGNAL, self.stacks, all_threads=True)
        # faulthandler names threads by id: the judge puts the main thread's stack last.
        self.write(main_thread=threading.main_thread().ident)
        self.reports: list[pytest.TestReport] = []  # of the test now running
        self.limit = 0.0  # the limit of the test now running

    def write(self, **fields: object) -> None:
        if self.record:  # one line per event, flushed: the judge reads it while the tests run
            self.record.write(json.dumps(fields) + "\n")
            self.record.flush()

    def running(self, name: str, limit: float, nodeid: str = "") -> None:
        """`name` runs now; from now on it may run `limit` seconds (0: no limit of its own).
        `nodeid` lets the judge deselect it when it reruns the tests after a crash."""
        self.write(running=name, limit=limit, nodeid=nodeid)

    def finished(
        self,
        name: str,
        outcome: str,
        report: pytest.TestReport | pytest.CollectReport | None,
        seconds: float = 0.0,
        limit: float = 0.0,
        nodeid: str = "",
    ) -> None:
        """`name` ended: its outcome, and how long its call ran against the limit it had (the
        maintainer's check wants every limit to leave room for a slower machine)."""
        message, details = (failure_text(report), report.longreprtext) if report else ("", "")
        self.write(
            finished=name,
            outcome=outcome,
            message=message,
            details=details,
            seconds=round(seconds, 3),
            limit=limit,
            nodeid=nodeid,
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.reports, self.limit = [], 0.0
        self.running(item.name, 0.0, item.nodeid)  # setup: a fixture may load a model, no limit
        yield
        call = sum(report.duration for report in self.reports if report.when == "call")
        self.finished(item.name, *outcome_of(self.reports), call, self.limit, item.nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append(report)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        mark = item.get_closest_marker("time_limit")
        seconds = self.limit = limit_of(self.config, mark.args[0] if mark else 0.0)
        self.running(item.name, seconds, item.nodeid)
        with time_limit(item.session, item.name, seconds):
            yield
        self.running(item.name, 0.0, item.nodeid)  # teardown, under no limit, as setup

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector: pytest.Collector) -> Iterator[None]:
        if not isinstance(collector, pytest.Module):
            yield
            return
        name = f"{COLLECTING}{collector.nodeid}"
        seconds = limit_of(self.config)
        self.running(name, seconds)
        with time_limit(collector.session, f"importing {collector.name}", seconds):
            outcome = yield
        report: pytest.CollectReport = outcome.get_result()
        if report.passed:
            self.write(finished=name, outcome="collected")
        else:
            self.finished(name, "error" if report.failed else "skipped", report)

    def pytest_unconfigure(self) -> None:
        if self.stacks:
            faulthandler.unregister(DUMP_SIGNAL)
            faulthandler.disable()
            self.stacks.close()
        if self.record:
            self.record.close()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Recorder(config), "course-recorder")
