"""The judge's verdict when a test kills the test process or hangs in native code (issue 26).

Python's own timeout (SIGALRM) cannot stop code that never returns to the interpreter, and a
segfault ends pytest before it reports anything, so the judge watches from outside: the plugin
records each test as it starts and ends (course/pytest_plugin.py), and the runner kills a test
past its limit, or names the one running when the process died (course/runner.py). Small test
files stand for the student's mistakes: `ctypes.string_at(0)` and `os.abort()` for a kernel
that writes out of bounds, a pthread mutex locked twice for a rank waiting in a collective that
never comes (a wait in C that signals do not interrupt).
"""

from __future__ import annotations

import csv
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from course.runner import (  # noqa: E402
    CRASHED,
    LIMIT_GRACE_S,
    Run,
    run_pytest,
    sandbox_env,
    thread_stacks,
)
from test_steps import run, write_student_calc  # noqa: E402

pytest_plugins = ["test_steps"]  # its fixture `course`: a small fake course in a git repository

SEGFAULT = "ctypes.string_at(0)"
NATIVE_WAIT = (  # a default pthread mutex locked twice by one thread: it waits in C forever
    "ctypes.CDLL(None).pthread_mutex_lock(LOCK)",
    "ctypes.CDLL(None).pthread_mutex_lock(LOCK)",
)
START_S = 15  # generous for starting pytest on a busy machine


def run_tests(folder: Path, body: str, test_timeout: float = 1, timeout: float = 60) -> Run:
    """Run a test file made of `body` with the judge's runner, as `steps.py test` runs one."""
    (folder / "test_student.py").write_text(
        "import ctypes, os, threading\n\nimport pytest\n\nLOCK = ctypes.create_string_buffer(64)\n"
        + textwrap.dedent(body)
    )
    (folder / "pytest.ini").write_text("[pytest]\nmarkers = time_limit(seconds): judged limit\n")
    return run_pytest(
        "student",
        ["test_student.py"],
        folder,
        sandbox_env(folder),
        folder / "out" / "results.jsonl",
        timeout,
        test_timeout,
        ["-c", str(folder / "pytest.ini"), "--rootdir", str(folder)],
    )


def outcomes(run: Run) -> list[tuple[str, str]]:
    return [(case.name, case.outcome) for case in run.tests]


def line_of(folder: Path, text: str) -> int:
    """The line of test_student.py that holds `text` (the last such line)."""
    lines = (folder / "test_student.py").read_text().splitlines()
    return max(number for number, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize(
    "crash, signal", [(SEGFAULT, "SIGSEGV (signal 11)"), ("os.abort()", "SIGABRT (signal 6)")]
)
def test_a_crash_names_the_test_and_the_signal_and_the_tests_after_it_run_in_a_fresh_process(
    tmp_path: Path, crash: str, signal: str
) -> None:
    run = run_tests(
        tmp_path,
        f"""
        def test_first():
            assert 1 + 1 == 3

        def test_second():
            pass

        def test_crash():
            {crash}

        def test_after():
            pass
        """,
    )
    assert outcomes(run) == [
        ("test_first", "failed"),
        ("test_second", "passed"),
        ("test_crash", CRASHED),
        ("test_after", "passed"),
    ]
    assert run.verdict == (
        f"the test process died of {signal} while running test_crash; 1 of 3 other tests failed"
    )
    crashed = run.tests[2]
    assert crashed.crashed and crashed in run.failures
    assert f"the test process died of {signal} while running test_crash" in crashed.message
    assert "Fatal Python error" in crashed.details
    student_frames = [line for line in crashed.details.splitlines() if "test_student.py" in line]
    assert student_frames[-1].endswith(f"test_student.py:{line_of(tmp_path, crash)} in test_crash")


def test_every_crash_is_named_and_every_test_gets_its_verdict(tmp_path: Path) -> None:
    """A kernel that crashes two tests of a chapter: each crash restarts the run after it, so
    the verdict names both and the tests between and after them are judged too."""
    run = run_tests(
        tmp_path,
        f"""
        def test_one():
            {SEGFAULT}

        def test_two():
            pass

        def test_three():
            os.abort()

        @pytest.mark.parametrize("x", [1, 2])
        def test_four(x):
            assert x == 1
        """,
    )
    assert outcomes(run) == [
        ("test_one", CRASHED),
        ("test_two", "passed"),
        ("test_three", CRASHED),
        ("test_four[1]", "passed"),
        ("test_four[2]", "failed"),
    ]
    assert run.verdict == (
        "the test process died of SIGSEGV (signal 11) while running test_one; the test process "
        "died of SIGABRT (signal 6) while running test_three; 1 of 3 other tests failed"
    )
    assert len(run.failures) == 3


def test_a_native_wait_is_stopped_at_the_tests_limit_with_every_threads_stack(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    run = run_tests(
        tmp_path,
        f"""
        def test_first():
            pass

        def helper():
            threading.Event().wait()

        @pytest.mark.time_limit(2)
        def test_waits():
            threading.Thread(target=helper, daemon=True).start()
            {NATIVE_WAIT[0]}
            {NATIVE_WAIT[1]}

        def test_after():
            pass
        """,
    )
    assert time.monotonic() - started < 2 + LIMIT_GRACE_S + START_S
    assert outcomes(run) == [("test_first", "passed"), ("test_waits", "failed")]
    assert run.verdict == "1 of 2 failed"
    waits = run.tests[-1]
    assert waits.timed_out, "the time_limit mark's 2 s apply, as the plugin applies them"
    assert waits.message.startswith("Timeout >2s: test_waits did not finish (stopped from outside")
    lines = waits.details.splitlines()
    titles = [number for number, line in enumerate(lines) if "(most recent call last)" in line]
    assert len(titles) == 2 and lines[titles[-1]].startswith("Main thread"), "main comes last"
    helper = f"test_student.py:{line_of(tmp_path, 'threading.Event')} in helper"
    assert any(line.endswith(helper) for line in lines[titles[0] : titles[1]])
    innermost = f"test_student.py:{line_of(tmp_path, NATIVE_WAIT[1])} in test_waits"
    assert lines[-1].endswith(innermost), "the main thread's innermost frame is last"


def test_a_python_loop_is_still_stopped_by_the_plugin_at_the_limit(tmp_path: Path) -> None:
    run = run_tests(tmp_path, "def test_loops():\n    while True:\n        pass\n")
    assert outcomes(run) == [("test_loops", "failed")] and run.verdict == "1 of 1 failed"
    assert "Timeout >1s: test_loops did not finish (it was at " in run.tests[0].message
    assert run.seconds < LIMIT_GRACE_S + START_S


def test_a_process_that_exits_while_importing_the_tests_names_the_module(tmp_path: Path) -> None:
    run = run_tests(tmp_path, "os._exit(3)\n\ndef test_never():\n    pass\n")
    assert run.verdict == (
        "no test ran: the test process exited with status 3 while importing test_student.py"
    )
    assert outcomes(run) == [("collecting test_student.py", CRASHED)]
    assert run.tests[0].is_collection


def test_the_whole_runs_limit_names_the_test_that_was_running(tmp_path: Path) -> None:
    body = f"def test_waits():\n    {NATIVE_WAIT[0]}\n    {NATIVE_WAIT[1]}\n"
    run = run_tests(tmp_path, body, test_timeout=0, timeout=4)
    assert run.verdict == "stopped after 4 s while running test_waits" and run.hung == "test_waits"
    assert run.tests[0].timed_out and "the whole run was stopped" in run.tests[0].message
    assert (
        f"test_student.py:{line_of(tmp_path, NATIVE_WAIT[1])} in test_waits" in run.tests[0].details
    )


def test_the_stacks_of_a_crash_put_the_crashed_thread_last(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.write_text(
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00000000000000b2 (most recent call first):\n"
        '  File "/k.py", line 9 in kernel\n  File "/w.py", line 3 in worker\n\n'
        "Thread 0x00000000000000a1 (most recent call first):\n"
        '  File "/t.py", line 5 in test_it\n\n'
        "Extension modules: torch._C (total: 1)"
    )
    assert thread_stacks(dump, main_thread=0xA1).splitlines() == [
        "Fatal Python error: Segmentation fault",
        "Main thread 0x00000000000000a1 (most recent call last):",
        "  /t.py:5 in test_it",
        "Thread 0x00000000000000b2 (most recent call last):",
        "  /w.py:3 in worker",
        "  /k.py:9 in kernel",
        "Extension modules: torch._C (total: 1)",
    ]


# --- the commands: steps.py test, grade and mutate on test_steps.py's fake course --------------


def student_body(indent: int, *lines: str) -> str:
    """A stub's body for write_student_calc, which indents its first line: the others by
    `indent` (4 in a function, 8 in a method)."""
    return ("\n" + " " * indent).join(lines)


CRASHING = ("import ctypes", f"return {SEGFAULT}")


def test_steps_test_names_the_crashed_test_and_the_signal_and_keeps_earlier_failures(
    course: Path,
) -> None:
    run(course, "start", "0")
    write_student_calc(course, add="return a - b", total=student_body(8, *CRASHING))
    code, out = run(course, "test", "0")
    assert code == 1
    assert "the test process died of SIGSEGV (signal 11) while running test_total" in out, out
    assert "✗ test_add" in out and "✗ test_total (the test process died while it ran)" in out
    assert "chapter 0 FAILED: 2 failing tests" in out


def test_steps_test_names_a_test_waiting_in_native_code_and_the_students_line(
    course: Path,
) -> None:
    run(course, "start", "0")
    hang = student_body(4, "import ctypes", "LOCK = ctypes.create_string_buffer(64)", *NATIVE_WAIT)
    write_student_calc(course, add=hang, total="return sum(self.items)")
    started = time.monotonic()
    code, out = run(course, "test", "0", "--test-timeout", "2")
    assert code == 1 and time.monotonic() - started < 2 + LIMIT_GRACE_S + START_S
    assert "✗ test_add (stopped: does your code loop forever?)" in out, out
    assert "raised in add (work/minisgl/calc.py:" in out, "the stacks name the student's line"
    assert "wait for something that never comes?" in " ".join(out.split())


def test_grade_writes_crashed_and_grades_the_tests_after_it(course: Path, tmp_path: Path) -> None:
    work = tmp_path / "submissions" / "ada" / "work"
    (work / "minisgl").mkdir(parents=True)
    run(course, "start", "0")
    write_student_calc(course, add=student_body(4, *CRASHING), total="return sum(self.items)")
    for path in (course / "work" / "minisgl").glob("*.py"):
        (work / "minisgl" / path.name).write_text(path.read_text())
    grades = tmp_path / "grades.csv"
    submissions = str(work.parent.parent)
    code, out = run(
        course, "grade", "--submissions", submissions, "--csv", str(grades), "--chapters", "0"
    )
    assert code == 0, out
    rows = {(r["chapter"], r["test"]): r for r in csv.DictReader(grades.open())}
    assert rows[("0", "test_add")]["outcome"] == CRASHED
    assert (
        "died of SIGSEGV (signal 11) while running test_add" in rows[("0", "test_add")]["message"]
    )
    assert rows[("0", "test_total")]["outcome"] == "passed", "run in a fresh process"


def test_mutate_lists_a_mutant_killed_only_by_a_crash(course: Path) -> None:
    (course / "chapters" / "ch00_basics" / "mutations.toml").write_text(
        '[[mutation]]\nstub = "calc.py:add"\nfind = "return a + b"\n'
        f'replace = "import ctypes; return {SEGFAULT}"\nmistake = "reads address 0"\n'
    )
    code, out = run(course, "mutate", "0", "--no-report")
    assert "chapter 0: 1/1 mutants killed" in out, out
    assert (
        "killed only by a crash ch0 calc.py:add: reads address 0: the test process died of "
        "SIGSEGV (signal 11) while running test_add" in " ".join(out.split())
    )


def test_a_terminated_tool_kills_what_its_worker_threads_started(tmp_path: Path) -> None:
    """SIGTERM to a tool whose thread pool waits on two test processes (a third queued): both
    groups die at once, the third never starts, and the tool ends long before their limits."""
    import os
    import signal
    import subprocess

    tool = tmp_path / "tool.py"
    tool.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            from concurrent.futures import ThreadPoolExecutor
            sys.path.insert(0, {str(ROOT / "tools")!r})
            from course.runner import end_runs_on_interrupt, run_process
            end_runs_on_interrupt()
            child = ("import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
                     "time.sleep(120)")
            def run(i):
                pid_file = os.path.join({str(tmp_path)!r}, f"pid{{i}}")
                return run_process([sys.executable, "-c", child, pid_file], {str(tmp_path)!r},
                                   dict(os.environ), 120)
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(run, range(3)))
            """
        )
    )
    parent = subprocess.Popen([sys.executable, str(tool)], stderr=subprocess.DEVNULL)
    pid_files = [tmp_path / "pid0", tmp_path / "pid1"]
    deadline = time.monotonic() + 30
    while not all(f.exists() and f.read_text() for f in pid_files):
        assert time.monotonic() < deadline, "the two test processes never started"
        time.sleep(0.05)
    children = [int(f.read_text()) for f in pid_files]

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    try:
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=20)  # not 120 s: nobody waited for the children's limits
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in children), "a test process outlived its tool"
        assert not (tmp_path / "pid2").exists(), "a queued run started after the stop"
    finally:  # whatever failed, leave nothing running
        parent.kill()
        for pid in children:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
