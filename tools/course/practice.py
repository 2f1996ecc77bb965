"""Grading one practice submission: its file and the problem's test.py, alone in a sandbox.

The tests run with pytest in a fresh temporary directory holding only the submission (as
submission.py) and a copy of test.py, through the same runner as the chapter judge, with a
timeout: a submission that hangs or crashes gets a clear verdict, never a pass.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from course.problems import SAMPLE_PREFIX, Problem
from course.runner import Run, run_pytest, sandbox_env

LOOPS = "does your code loop forever (or wait for something that never comes)?"


def syntax_error(path: Path) -> str:
    """`file:line: message` if the file does not compile, else ""."""
    try:
        compile(path.read_text("utf-8"), str(path), "exec")
    except SyntaxError as error:
        return f"{path}:{error.lineno}: {error.msg}"
    except ValueError as error:  # e.g. null bytes
        return f"{path}: {error}"
    return ""


def grade(
    problem: Problem,
    submission: Path,
    timeout: float,
    env: dict[str, str],
    samples_only: bool = False,
    jobs: int = 1,
) -> Run:
    """Run the problem's tests on `submission`; `env` adds variables (where the models are).
    `jobs` runs at once share the cores: each gets cores / jobs threads (sandbox_env), since
    torch's threads slow down badly when they outnumber the cores."""
    error = syntax_error(submission)
    if error:
        return Run(problem.slug, 0.0, error)
    with tempfile.TemporaryDirectory(prefix=f"practice-{problem.number}-") as name:
        tmp = Path(name)
        shutil.copyfile(submission, tmp / "submission.py")
        # Named test_<...>.py, not test.py: a module `test` would clash with the stdlib's.
        shutil.copyfile(problem.path / "test.py", tmp / "test_submission.py")
        (tmp / "pytest.ini").write_text("[pytest]\n")  # so no project config is picked up
        extra = ["--rootdir", str(tmp), "-c", str(tmp / "pytest.ini")]
        extra += ["-k", SAMPLE_PREFIX] if samples_only else []
        run = run_pytest(
            problem.slug,
            ["test_submission.py"],
            tmp,
            sandbox_env(tmp, jobs, **env),
            tmp / "results.jsonl",
            timeout,
            timeout,
            extra,
        )
    if run.hung or run.verdict.startswith("stopped") or any(c.timed_out for c in run.tests):
        run.verdict = f"stopped after {timeout:g} s: {LOOPS}"
    for case in run.tests:
        if case.is_collection:  # test.py could not import the submission
            case.message = import_error(case.details, submission) or case.details.strip()
            run.verdict = case.message
        else:
            case.message = describe(case.message, case.details, submission)
    if not run.tests:
        run.verdict = import_error(run.output, submission) or run.verdict
    return run


def describe(message: str, details: str, submission: Path) -> str:
    """The assertion's own message (pytest's `assert ...` rewrite cut) and, when the exception
    came from the submission, the line of the student's file where it was raised."""
    lines = []
    for line in message.splitlines():
        if line.startswith("assert "):
            break
        lines.append(line)
    text = ("\n".join(lines).strip() or message.strip()).removeprefix("AssertionError: ")
    raised = re.findall(r"^submission\.py:(\d+): ", details, flags=re.MULTILINE)
    return text + (f"\n(raised at {submission}:{raised[-1]})" if raised else "")


def import_error(output: str, submission: Path) -> str:
    """One line for a test module that could not import the submission."""
    errors = [line[1:].strip() for line in output.splitlines() if line.startswith("E ")]
    if not errors:
        return ""
    message = re.sub(r"\(/\S*submission\.py\)", f"({submission})", " ".join(errors[-2:]))
    return f"{submission}: the tests could not import it: {message}"


def can_import(module: str) -> tuple[bool, str]:
    """Whether a fresh interpreter (as the tests use) imports `module`; its file or the error."""
    return runs_ok(f"import {module}; print(getattr({module}, '__file__', '') or '')")


def runs_ok(code: str) -> tuple[bool, str]:
    """Whether a fresh interpreter runs `code`; its output or its last error line."""
    with tempfile.TemporaryDirectory() as tmp:  # not the repo: what the tests will see
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True, timeout=120
        )
    return done.returncode == 0, (
        done.stdout.strip()
        if done.returncode == 0
        else (done.stderr.strip().splitlines() or ["failed"])[-1]
    )
