"""A pytest plugin for sandboxed runs: each test gets `--test-timeout` seconds.

A test that starts processes of its own (chapter 16's ranks) may ask for more with
`@pytest.mark.time_limit(seconds)`: the larger of the two applies, so a loaded machine does
not fail a correct tree.

A test that runs longer is failed where it stands (SIGALRM, so a pure-Python infinite loop is
interrupted), and the session stops there: a stub that loops forever usually hangs every test
that calls it, and one named hang is the whole verdict. Importing a test module (which imports
the student's code) gets the same limit. Loaded with `-p course.pytest_plugin`.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from course.runner import TIMEOUT_MARK


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--test-timeout",
        type=float,
        default=0.0,
        help="seconds one test (or one test module's import) may run; 0: no limit",
    )


@contextmanager
def time_limit(session: pytest.Session, what: str, at_least: float = 0.0) -> Iterator[None]:
    seconds = session.config.getoption("--test-timeout")
    if not seconds:
        yield
        return
    seconds = max(seconds, at_least)

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    mark = item.get_closest_marker("time_limit")
    with time_limit(item.session, item.name, mark.args[0] if mark else 0.0):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    if isinstance(collector, pytest.Module):
        with time_limit(collector.session, f"importing {collector.name}"):
            yield
    else:
        yield
