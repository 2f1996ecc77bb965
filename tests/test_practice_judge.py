"""Tests of the practice judge (practice/judge.py): its commands, its safety nets (timeout,
syntax errors, never overwriting a student's file) and `check` on real problems.

Most tests use a small problem written into a temporary folder, so they are fast and do not
depend on the real problems; `check` runs on a few real browser problems.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from course.problems import (
    REFERENCE_BODY,
    ProblemError,
    course_problems,
    derived_starter,
    parse_problem,
    solution_source,
)

ROOT = Path(__file__).resolve().parent.parent
JUDGE = ROOT / "practice" / "judge.py"
sys.path.insert(0, str(JUDGE.parent))

import judge  # noqa: E402  (practice/ is not a package)

BROWSER_BUDGET_S = 3.0  # a pure-Python problem is graded in well under this (docs/maintainers.md)

PROBLEM_MD = """\
---
number: {number}
title: Double it
chapter: {chapter}
difficulty: easy
env: {env}
---
Write `double(x)`: return `2 * x`.

```python
>>> double(3)
6
```

## Hint

Multiply by two.

## Explanation

Doubling is adding a number to itself.
"""

TEST_PY = """\
from submission import double


def test_example_three():
    assert double(3) == 6, f"double(3): expected 6, got {double(3)}"


def test_negative():
    assert double(-4) == -8, f"double(-4): expected -8, got {double(-4)}"
"""


def write_problem(
    root: Path,
    slug: str = "double_it",
    number: int = 1,
    chapter: int = 0,
    env: str = "browser",
    solution: str = "def double(x):\n    return 2 * x\n",
    starter: str = "def double(x):\n    raise NotImplementedError('double it')\n",
    test: str = TEST_PY,
) -> Path:
    folder = root / slug
    folder.mkdir(parents=True)
    (folder / "problem.md").write_text(PROBLEM_MD.format(number=number, chapter=chapter, env=env))
    (folder / "starter.py").write_text(starter)
    (folder / "solution.py").write_text(solution)
    (folder / "test.py").write_text(test)
    return folder


def run_judge(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(JUDGE), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def problems(tmp_path: Path) -> Path:
    root = tmp_path / "problems"
    write_problem(root)
    return root


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


# --- loading problems --------------------------------------------------------------------------


def test_load_problems_reads_the_front_matter(problems: Path) -> None:
    [problem] = judge.load_problems(problems)
    assert (
        problem.number,
        problem.slug,
        problem.title,
        problem.chapter,
        problem.difficulty,
        problem.env,
    ) == (1, "double_it", "Double it", 0, "easy", "browser")
    assert "Write `double(x)`" in problem.statement
    assert "Hint" not in problem.statement and "Explanation" not in problem.statement
    assert problem.hint == "Multiply by two."
    assert problem.explanation == "Doubling is adding a number to itself."


def test_the_real_problems_load_and_are_numbered_by_chapter() -> None:
    problems = judge.load_problems()
    assert problems, "practice/problems/ holds no problem"
    for problem in problems:
        assert problem.number // 10 == problem.chapter


@pytest.mark.parametrize(
    "change, message",
    [
        ("difficulty: easy", "difficulty"),
        ("env: browser", "env"),
        ("chapter: 0", "chapter"),
    ],
)
def test_invalid_front_matter_is_reported(tmp_path: Path, change: str, message: str) -> None:
    folder = write_problem(tmp_path)
    md = folder / "problem.md"
    md.write_text(md.read_text().replace(change, change.split(":")[0] + ": 99"))
    with pytest.raises(judge.ProblemError, match=message):
        parse_problem(folder, judge.course_chapters())


def test_duplicate_numbers_are_refused(tmp_path: Path) -> None:
    write_problem(tmp_path, slug="first")
    write_problem(tmp_path, slug="second")
    with pytest.raises(judge.ProblemError, match="share number 1"):
        judge.load_problems(tmp_path)


# --- start -------------------------------------------------------------------------------------


def test_start_copies_the_starter_and_shows_the_statement(problems: Path, workspace: Path) -> None:
    done = run_judge("start", "1", "--problems", str(problems), "--workspace", str(workspace))
    assert done.returncode == 0, done.stdout + done.stderr
    target = workspace / "001_double_it.py"
    assert target.read_text() == (problems / "double_it" / "starter.py").read_text()
    assert "Write double(x)" in done.stdout or "Write `double(x)`" in done.stdout
    assert "Doubling is adding" not in done.stdout, "start must not reveal the explanation"
    assert str(target) in done.stdout.replace("\n", "")


def test_start_never_overwrites_without_force_and_backs_up_with_it(
    problems: Path, workspace: Path
) -> None:
    args = ("--problems", str(problems), "--workspace", str(workspace))
    run_judge("start", "1", *args)
    target = workspace / "001_double_it.py"
    target.write_text("def double(x):\n    return x + x  # my work\n")
    done = run_judge("start", "1", *args)
    assert done.returncode == 0
    assert "my work" in target.read_text(), "start without --force overwrote the student's file"
    assert not list(workspace.glob("*.bak*"))

    done = run_judge("start", "1", "--force", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NotImplementedError" in target.read_text(), "--force must restore the starter"
    [backup] = workspace.glob("001_double_it.py.bak-*")
    assert "my work" in backup.read_text()


# --- test --------------------------------------------------------------------------------------


def test_a_correct_file_passes_shows_the_explanation_and_is_recorded(
    problems: Path, workspace: Path
) -> None:
    args = ("--problems", str(problems), "--workspace", str(workspace))
    run_judge("start", "1", *args)
    (workspace / "001_double_it.py").write_text("def double(x):\n    return x + x\n")
    done = run_judge("test", "1", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_example_three" in done.stdout and "test_negative" in done.stdout
    assert "All 2 tests passed" in done.stdout
    assert "Doubling is adding" in done.stdout
    progress = json.loads((workspace / ".progress.json").read_text())
    assert progress["1"]["status"] == "solved"
    status = run_judge("status", *args)
    assert status.returncode == 0 and "1" in status.stdout


def test_a_failing_file_shows_the_first_failure_and_the_hint(
    problems: Path, workspace: Path, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def double(x):\n    return x * x\n")
    done = run_judge(
        "test", "1", str(wrong), "--problems", str(problems), "--workspace", str(workspace)
    )
    assert done.returncode == 1
    assert "double(3): expected 6, got 9" in done.stdout, done.stdout
    assert "Multiply by two." in done.stdout
    assert "Doubling is adding" not in done.stdout
    progress = json.loads((workspace / ".progress.json").read_text())
    assert progress["1"]["status"] == "tried"


def test_samples_run_only_the_examples(problems: Path, workspace: Path, tmp_path: Path) -> None:
    half = tmp_path / "half.py"
    half.write_text("def double(x):\n    return 6 if x == 3 else 0\n")
    args = ("--problems", str(problems), "--workspace", str(workspace))
    done = run_judge("test", "1", str(half), "--samples", *args)
    assert done.returncode == 0, done.stdout
    assert "test_negative" not in done.stdout
    assert run_judge("test", "1", str(half), *args).returncode == 1


def test_a_syntax_error_is_one_clear_line(problems: Path, workspace: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def double(x):\n    y = 2 *\n    return y\n")
    done = run_judge(
        "test", "1", str(broken), "--problems", str(problems), "--workspace", str(workspace)
    )
    assert done.returncode == 1
    assert f"{broken}:2: invalid syntax" in done.stdout.replace("\n", ""), done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_an_import_error_names_the_missing_name(
    problems: Path, workspace: Path, tmp_path: Path
) -> None:
    misnamed = tmp_path / "misnamed.py"
    misnamed.write_text("def twice(x):\n    return 2 * x\n")
    done = run_judge(
        "test", "1", str(misnamed), "--problems", str(problems), "--workspace", str(workspace)
    )
    assert done.returncode == 1
    assert "cannot import name 'double'" in done.stdout.replace("\n", ""), done.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_infinite_loop_is_stopped_and_fails(
    problems: Path, workspace: Path, tmp_path: Path, how: str
) -> None:
    looping = tmp_path / "looping.py"
    looping.write_text("def double(x):\n    while True:\n        pass\n")
    args = ["test", "1", str(looping), "--problems", str(problems), "--workspace", str(workspace)]
    started = time.monotonic()
    if how == "flag":
        done = run_judge(*args, "--timeout", "2", timeout=60)
    else:
        done = run_judge(*args, env={judge.TIMEOUT_ENV_VAR: "2"}, timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert "stopped after 2 s" in done.stdout, done.stdout
    assert elapsed < 20, f"the run took {elapsed:.1f} s despite a 2 s timeout"


def test_a_browser_problem_is_graded_within_budget(workspace: Path) -> None:
    """A real pure-Python problem, from the command line to the verdict."""
    problem = next(p for p in judge.load_problems() if p.env == "browser")
    args = (
        "test",
        str(problem.number),
        str(problem.path / "solution.py"),
        "--workspace",
        str(workspace),
    )
    run_judge(*args)  # warms the OS file cache, as any student's earlier run did
    started = time.monotonic()
    done = run_judge(*args)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert elapsed < BROWSER_BUDGET_S, (
        f"judge.py test {problem.number} took {elapsed:.2f} s; the budget is {BROWSER_BUDGET_S} s"
    )


# --- check -------------------------------------------------------------------------------------


def test_check_passes_on_real_browser_problems() -> None:
    numbers = [str(p.number) for p in judge.load_problems() if p.env == "browser"][:4]
    done = run_judge("check", *numbers)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check passed" in done.stdout


def test_check_fails_a_broken_problem_and_too_few_per_chapter(tmp_path: Path) -> None:
    write_problem(tmp_path, slug="good", number=1)
    write_problem(
        tmp_path, slug="passing_starter", number=2, starter="def double(x):\n    return 2 * x\n"
    )
    write_problem(
        tmp_path, slug="failing_solution", number=3, solution="def double(x):\n    return 3 * x\n"
    )
    write_problem(
        tmp_path,
        slug="no_samples",
        number=4,
        test=TEST_PY.replace("test_example_three", "test_three"),
    )
    done = run_judge("check", "--problems", str(tmp_path), "--chapters", "0,1")
    out = done.stdout.replace("\n", " ")
    assert done.returncode == 1
    assert "tests that pass on the starter: test_example_three, test_negative" in out
    assert "the solution fails" in out
    assert "no sample test" in out
    assert "chapter 1 has 0 problems" in out
    assert "1/4 problems ok" in out


def test_check_enforces_three_problems_per_chapter(tmp_path: Path) -> None:
    write_problem(tmp_path, slug="one", number=11, chapter=1)
    write_problem(tmp_path, slug="two", number=12, chapter=1)
    done = run_judge("check", "--problems", str(tmp_path), "--chapters", "1")
    assert done.returncode == 1
    assert "chapter 1 has 2 problems" in done.stdout.replace("\n", " ")
    write_problem(tmp_path, slug="three", number=13, chapter=1)
    done = run_judge("check", "--problems", str(tmp_path), "--chapters", "1")
    assert done.returncode == 0, done.stdout
    done = run_judge("check", "--problems", str(tmp_path))  # every chapter of the course
    assert done.returncode == 1 and "chapter 0 has 0 problems" in done.stdout.replace("\n", " ")


def test_a_torch_problem_is_not_graded_while_a_tiny_model_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_problem(tmp_path, env="torch")
    monkeypatch.setattr(judge, "MODELS", tmp_path / "models")  # nothing provisioned there
    run = judge.grade(parse_problem(folder, {0}), folder / "solution.py")
    assert not run.ok and not run.tests
    assert run.verdict.startswith("models/tiny-qwen3, models/tiny-qwen2, models/tiny-llama missing")
    assert "tools/provision.py" in run.verdict


# --- starters derived from solutions -----------------------------------------------------------

SOLUTION_PY = '''\
import math


def half(x: int) -> int:
    return x // 2


def double(x: int) -> int:
    """Return 2 * x."""
    return 2 * x
'''
STARTER_PY = '''\
import math


def double(x: int) -> int:
    """Return 2 * x."""
    raise NotImplementedError("multiply by two")
'''


def test_sync_rewrites_a_starter_from_its_solution_keeping_its_stubs_and_omissions(
    tmp_path: Path,
) -> None:
    folder = write_problem(tmp_path, solution=SOLUTION_PY, starter=STARTER_PY)
    assert run_judge("sync", "--check", "--problems", str(tmp_path)).returncode == 0
    solution = folder / "solution.py"
    solution.write_text(
        SOLUTION_PY.replace('    """Return 2 * x."""', '    """Return x doubled."""')
        .replace("double(x: int) -> int", "double(x: float) -> float")
        .replace("import math\n", "import math\nimport operator\n")
    )
    done = run_judge("sync", "--check", "--problems", str(tmp_path))
    assert done.returncode == 1 and "double_it/starter.py" in done.stdout.replace("\n", "")
    assert run_judge("sync", "--problems", str(tmp_path)).returncode == 0
    assert (folder / "starter.py").read_text() == STARTER_PY.replace(
        '    """Return 2 * x."""', '    """Return x doubled."""'
    ).replace("double(x: int) -> int", "double(x: float) -> float").replace(
        "import math\n", "import math\nimport operator\n"
    ), "the solution's head and imports, the starter's task; half stays left out"
    assert run_judge("sync", "--check", "--problems", str(tmp_path)).returncode == 0


def test_sync_refuses_a_starter_that_defines_what_the_solution_lacks(tmp_path: Path) -> None:
    write_problem(
        tmp_path, solution=SOLUTION_PY, starter=STARTER_PY + "\n\ndef triple(x):\n    pass\n"
    )
    done = run_judge("sync", "--check", "--problems", str(tmp_path))
    assert done.returncode == 2
    assert "it defines triple, which solution.py does not" in done.stdout.replace("\n", " ")


def test_every_real_starter_is_derived_from_its_solution() -> None:
    stale = [
        p.slug
        for p in course_problems()
        if derived_starter(p) != (p.path / "starter.py").read_text()
    ]
    assert stale == [], f"run practice/judge.py sync: {stale}"


ENGINE_PY = '''\
class Doubler:
    def double(self, x: int) -> int:
        """The engine's own docstring."""
        # a comment of the engine
        result = x + x
        return result

    def __init__(self) -> None:
        self.calls = 0
'''

MARKED_SOLUTION_PY = '''\
class Doubler:
    def __init__(self) -> None:
        """Given."""
        # reference body: doubling.py:Doubler.__init__

    def double(self, x: int) -> int:
        """The problem's docstring."""
        # reference body: doubling.py:Doubler.double
'''


def test_a_solution_takes_a_body_from_the_engine_instead_of_a_copy(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "doubling.py").write_text(ENGINE_PY)
    folder = write_problem(tmp_path / "problems", solution=MARKED_SOLUTION_PY)
    problem = parse_problem(folder, {0})
    assert solution_source(problem, engine) == (
        "class Doubler:\n"
        "    def __init__(self) -> None:\n"
        '        """Given."""\n'
        "        self.calls = 0\n"
        "\n"
        "    def double(self, x: int) -> int:\n"
        '        """The problem\'s docstring."""\n'
        "        # a comment of the engine\n"
        "        result = x + x\n"
        "        return result\n"
    ), "the engine's body below its docstring, in the solution's place and indentation"
    (engine / "doubling.py").write_text(ENGINE_PY.replace("def double", "def twice"))
    with pytest.raises(ProblemError, match="double_it: .*doubling.py:Doubler.double"):
        solution_source(problem, engine)


def test_check_and_solution_use_the_solution_with_its_reference_bodies() -> None:
    """A real problem whose solution takes its answer from the engine: graded and shown whole."""
    marked = [
        p.slug
        for p in course_problems()
        if REFERENCE_BODY.search((p.path / "solution.py").read_text())
    ]
    assert "stop_holdback" in marked, marked
    done = run_judge("check", "stop_holdback")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = run_judge("solution", "stop_holdback").stdout
    assert "reference body" not in shown and "self.pending.find(s)" in shown, shown


def test_list_and_solution(problems: Path, workspace: Path) -> None:
    args = ("--problems", str(problems), "--workspace", str(workspace))
    listed = run_judge("list", "--chapter", "0", *args)
    assert listed.returncode == 0 and "Double it" in listed.stdout and "new" in listed.stdout
    shown = run_judge("solution", "1", *args)
    assert shown.returncode == 0 and "return 2 * x" in shown.stdout
    missing = run_judge("test", "99", *args)
    assert missing.returncode != 0 and "no problem" in missing.stdout + missing.stderr
