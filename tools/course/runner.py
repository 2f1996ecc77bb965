"""Sandboxed runs: a chapter main or a test file in a subprocess, never trusted to end.

Every run is its own process group, killed whole at its timeout or when the user presses
Ctrl-C, so no process of a hanging or crashing student tree outlives the judge. Tests run under
pytest with a per-test timeout (the hanging test fails, named, and the
run stops there, see pytest_plugin.py) and report through JUnit XML, read by one parser for
every tool.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent
TIMEOUT_MARK = "Timeout >"  # how course.pytest_plugin names a test it stopped
FAILED = ("failed", "error")  # outcomes that count against a run; "skipped" counts for nothing


@dataclass
class TestCase:
    name: str
    outcome: str  # "passed", "failed", "error" or "skipped"
    message: str = ""  # the assertion or exception, "" when passed
    details: str = ""  # the short traceback

    @property
    def is_collection(self) -> bool:
        """The test module itself failed to import (or to be collected)."""
        return self.name.startswith("collecting ")

    @property
    def timed_out(self) -> bool:
        return TIMEOUT_MARK in self.message or TIMEOUT_MARK in self.details


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


def run_process(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> Process:
    """Run cmd in its own process group; kill the whole group at the timeout (returncode None)
    or on Ctrl-C (then KeyboardInterrupt propagates, with nothing left running)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        return Process(None, out, err, time.monotonic() - start)
    except KeyboardInterrupt:
        kill_group(proc)
        proc.communicate()
        raise
    return Process(proc.returncode, out, err, time.monotonic() - start)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sandbox_env(pythonpath: Path, jobs: int = 1, **extra: str) -> dict[str, str]:
    """The environment of a sandboxed run: only `pythonpath`'s packages shadow the installed ones.

    Torch slows down badly when its threads outnumber free cores (chapter 0's tests on a busy
    2-core machine: 8 s with 1 thread, 15-80 s with 2), so each of `jobs` concurrent runs gets
    cores / jobs threads, at least one, unless OMP_NUM_THREADS is set."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // jobs))
    # tools/ comes after the tree: it holds the pytest plugin, and no minisgl.
    return dict(
        os.environ,
        PYTHONPATH=f"{pythonpath}{os.pathsep}{TOOLS}",
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


def run_main(main: Path, tree: Path, cwd: Path, timeout: float, env: dict[str, str]) -> Run:
    """Run an example through tools/run_main.py, which checks that `minisgl` comes from `tree`
    and prints a secret token when the example ends: a tree that exits early with status 0
    (os._exit(0) at import) does not pass."""
    token = secrets.token_hex(8)
    env = dict(env, MINISGL_TREE=str(tree), MINISGL_RUN_TOKEN=token)
    done = run_process([sys.executable, str(TOOLS / "run_main.py"), str(main)], cwd, env, timeout)
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
    junit: Path,
    timeout: float,
    test_timeout: float,
    extra: list[str] | None = None,
) -> Run:
    """Run pytest on `targets` (files or node ids); results come from its JUnit XML.

    `test_timeout` fails the test that runs longer and ends the run there (the tests after it
    do not run); `timeout` stops the whole run, and the test that was running then is named in
    `Run.hung`."""
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-v",
        "-p",
        "no:cacheprovider",
        "-p",
        "course.pytest_plugin",
        f"--test-timeout={test_timeout:g}",
        "--tb=short",
        "-o",
        "junit_family=xunit1",
        f"--junitxml={junit}",
        *(extra or []),
    ]
    done = run_process(cmd, cwd, env, timeout)
    cases = parse_junit(junit) if done.returncode is not None and junit.is_file() else []
    if done.returncode is None:
        hung = running_test(done.stdout)
        return Run(
            label,
            done.seconds,
            f"stopped after {timeout:.0f} s" + (f" while running {hung}" if hung else ""),
            done.stdout,
            cases,
            hung,
        )
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
    return Run(label, done.seconds, verdict, done.stdout, cases)


def running_test(verbose_output: str) -> str | None:
    """The test pytest -v had started but not finished: its node id lacks an outcome."""
    started = re.findall(r"^(\S+::\S+)(.*)$", verbose_output, flags=re.MULTILINE)
    if started and not re.search(r"PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS", started[-1][1]):
        return started[-1][0].split("::", 1)[1]
    return None


def parse_junit(path: Path) -> list[TestCase]:
    """Every test case of a pytest JUnit report; a module that failed to import is one case
    named after the file, with outcome "error"."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message, details = "passed", "", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                details = child.text or ""
                message = child.get("message") or last_line(details)
                break
        name = case.get("name", "?")
        if not case.get("classname"):  # a collection error: the test module did not import
            name, outcome = f"collecting {name}", "error" if outcome != "skipped" else outcome
        cases.append(TestCase(name, outcome, message, details))
    return cases
