#!/usr/bin/env python3
"""The practice judge: small problems about the engine, graded on your machine.

    python practice/judge.py doctor            is everything installed?
    python practice/judge.py list --chapter 4  the problems of chapter 4, with your status
    python practice/judge.py start 41          copy the starter into practice/workspace/
    python practice/judge.py test 41           grade your file (--samples: only the examples)
    python practice/judge.py solution 41       the reference answer (after you tried)
    python practice/judge.py status            solved / tried per chapter
    python practice/judge.py check             maintainers and CI: every problem is sound

A problem is a folder practice/problems/<slug>/ with problem.md (front matter + statement +
`## Hint` + `## Explanation`), starter.py, solution.py and test.py (see practice/README.md).
Tests run with pytest in a subprocess, in a fresh temporary directory that holds only the file
under test (as submission.py) and a copy of test.py, with a timeout: a submission that hangs
or crashes gets a clear verdict, never a pass. Nothing here imports torch.

The documentation site imports `load_problems` to list each chapter's problems.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

PRACTICE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PRACTICE_DIR.parent
PROBLEMS_DIR = PRACTICE_DIR / "problems"
WORKSPACE_DIR = PRACTICE_DIR / "workspace"
MODELS_DIR = REPO_ROOT / "models"
PROGRESS_FILE = ".progress.json"  # inside the workspace

CHAPTERS = range(0, 12)  # the chapters practice problems may belong to
DIFFICULTIES = ("easy", "medium", "hard")
ENVS = ("browser", "torch", "cuda")  # browser: stdlib only, could run in Pyodide
# Seconds a whole test run may take before it is stopped (a submission that loops forever).
TIMEOUTS = {"browser": 20, "torch": 120, "cuda": 300}
TIMEOUT_ENV_VAR = "PRACTICE_TIMEOUT"  # overrides TIMEOUTS, e.g. for the judge's own tests
MIN_PROBLEMS_PER_CHAPTER = 3
FRONT_MATTER_KEYS = ("number", "title", "chapter", "difficulty", "env")
PROBLEM_FILES = ("problem.md", "starter.py", "solution.py", "test.py")
SAMPLE_PREFIX = "test_example"  # tests shown to the student and run by --samples
TINY_MODELS = ("tiny-qwen3", "tiny-qwen2", "tiny-llama")  # what torch problems load
PROVISION_HINT = "python tools/provision.py"

# Logs (CI) are wider than the 80 columns rich assumes when stdout is not a terminal.
console = Console(highlight=False,
                  width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 120)))


class ProblemError(Exception):
    """A problem folder that does not follow the format (practice/README.md)."""


# --- problems ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One problem folder, as its front matter describes it."""

    number: int  # stable id: chapter * 10 + i, i = 1..9
    slug: str  # the folder name
    title: str
    chapter: int
    difficulty: str  # easy | medium | hard
    env: str  # browser | torch | cuda
    path: Path  # the folder

    @property
    def body(self) -> str:
        """problem.md without its front matter."""
        return split_front_matter((self.path / "problem.md").read_text())[1]

    @property
    def statement(self) -> str:
        """What the student reads first: the body without the Hint and Explanation sections."""
        sections = markdown_sections(self.body)
        return "".join(text for name, text in sections if name not in ("hint", "explanation"))

    @property
    def hint(self) -> str:
        return section_text(self.body, "hint")

    @property
    def explanation(self) -> str:
        return section_text(self.body, "explanation")

    @property
    def workspace_name(self) -> str:
        return f"{self.number:03d}_{self.slug}.py"

    @property
    def timeout(self) -> float:
        override = os.environ.get(TIMEOUT_ENV_VAR)
        return float(override) if override else TIMEOUTS[self.env]


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    """Split `---\\nkey: value\\n...\\n---\\nbody` into ({key: value}, body)."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ProblemError("problem.md must start with a `---` line (front matter)")
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            break
    else:
        raise ProblemError("problem.md: the front matter has no closing `---` line")
    meta: dict[str, str] = {}
    for line in lines[1:end]:
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ProblemError(f"problem.md: front matter line {line.strip()!r} is not "
                               "`key: value`")
        meta[key.strip()] = value.strip()
    return meta, "".join(lines[end + 1 :]).lstrip("\n")


def markdown_sections(body: str) -> list[tuple[str, str]]:
    """Split a Markdown body at its `## ` headings: [(lower-case heading or "", text), ...]."""
    sections: list[tuple[str, str]] = [("", "")]
    for line in body.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append((line[3:].strip().lower(), line))
        else:
            name, text = sections[-1]
            sections[-1] = (name, text + line)
    return sections


def section_text(body: str, name: str) -> str:
    """The text of the `## <name>` section, without its heading ("" if absent)."""
    for heading, text in markdown_sections(body):
        if heading == name:
            return text.split("\n", 1)[1].strip() if "\n" in text else ""
    return ""


def parse_problem(folder: Path) -> Problem:
    """Read and validate one problem folder; raise ProblemError naming what is wrong."""
    missing = [name for name in PROBLEM_FILES if not (folder / name).is_file()]
    if missing:
        raise ProblemError(f"{folder.name}: missing {', '.join(missing)}")
    meta, body = split_front_matter((folder / "problem.md").read_text())
    absent = [key for key in FRONT_MATTER_KEYS if not meta.get(key)]
    if absent:
        raise ProblemError(f"{folder.name}: front matter lacks {', '.join(absent)}")
    try:
        number, chapter = int(meta["number"]), int(meta["chapter"])
    except ValueError:
        raise ProblemError(f"{folder.name}: number and chapter must be integers") from None
    if chapter not in CHAPTERS:
        raise ProblemError(f"{folder.name}: chapter {chapter} is not in 0-{CHAPTERS[-1]}")
    if number // 10 != chapter or number % 10 == 0:
        raise ProblemError(f"{folder.name}: number {number} must be chapter * 10 + (1..9) "
                           f"for chapter {chapter}")
    if meta["difficulty"] not in DIFFICULTIES:
        raise ProblemError(f"{folder.name}: difficulty {meta['difficulty']!r} is not one of "
                           f"{', '.join(DIFFICULTIES)}")
    if meta["env"] not in ENVS:
        raise ProblemError(f"{folder.name}: env {meta['env']!r} is not one of {', '.join(ENVS)}")
    if not re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", folder.name):
        raise ProblemError(f"{folder.name}: the folder name must be lower-case words joined by _")
    headings = [name for name, _ in markdown_sections(body)]
    for needed in ("hint", "explanation"):
        if needed not in headings:
            raise ProblemError(f"{folder.name}: problem.md has no `## {needed.title()}` section")
    return Problem(number, folder.name, meta["title"], chapter, meta["difficulty"], meta["env"],
                   folder)


def load_problems(root: Path | str | None = None) -> list[Problem]:
    """Every problem under `root` (default practice/problems), sorted by number.

    Raises ProblemError on the first malformed problem or a duplicate number. The docs hook
    uses this to list a chapter's problems: [p for p in load_problems() if p.chapter == k].
    """
    root = Path(root) if root is not None else PROBLEMS_DIR
    if not root.is_dir():
        return []
    problems = [parse_problem(folder) for folder in sorted(root.iterdir())
                if folder.is_dir() and (folder / "problem.md").exists()]
    seen: dict[int, str] = {}
    for problem in problems:
        if problem.number in seen:
            raise ProblemError(f"problems {seen[problem.number]} and {problem.slug} share "
                               f"number {problem.number}")
        seen[problem.number] = problem.slug
    return sorted(problems, key=lambda p: p.number)


def find_problem(problems: list[Problem], key: str) -> Problem:
    """A problem by number (`41`) or slug (`prepare_inputs`)."""
    for problem in problems:
        if key == str(problem.number) or key == problem.slug:
            return problem
    raise SystemExit(f"no problem {key!r}: `python practice/judge.py list` shows them all")


def defined_names(path: Path) -> set[str]:
    """Top-level functions and classes a Python file defines (what the student writes)."""
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def sample_names(problem: Problem) -> list[str]:
    """Names of the sample tests (functions named test_example*) in test.py."""
    text = (problem.path / "test.py").read_text()
    return re.findall(rf"^def ({SAMPLE_PREFIX}\w*)\(", text, flags=re.MULTILINE)


# --- running tests -----------------------------------------------------------------------------


@dataclass
class TestOutcome:
    name: str
    passed: bool
    message: str = ""  # the failure's assertion message or exception, "" if passed


@dataclass
class RunResult:
    """What one test run of one file gave."""

    tests: list[TestOutcome] = field(default_factory=list)
    error: str = ""  # a problem outside any test: syntax error, timeout, crash, import error
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.tests) and all(t.passed for t in self.tests)

    @property
    def failures(self) -> list[TestOutcome]:
        return [t for t in self.tests if not t.passed]


def syntax_error(path: Path) -> str:
    """`file:line: message` if the file does not compile, else ""."""
    try:
        compile(path.read_text(), str(path), "exec")
    except SyntaxError as error:
        return f"{path}:{error.lineno}: {error.msg}"
    except ValueError as error:  # e.g. null bytes
        return f"{path}: {error}"
    return ""


def run_tests(problem: Problem, submission: Path, samples_only: bool = False,
              timeout: float | None = None) -> RunResult:
    """Run the problem's tests on `submission` in a subprocess, in a fresh temp directory."""
    started = time.monotonic()
    error = syntax_error(submission)
    if error:
        return RunResult(error=error)
    timeout = timeout if timeout is not None else problem.timeout
    with tempfile.TemporaryDirectory(prefix=f"practice-{problem.number}-") as tmp_name:
        tmp = Path(tmp_name)
        shutil.copyfile(submission, tmp / "submission.py")
        # Named test_<...>.py, not test.py: a module `test` would clash with the stdlib's.
        shutil.copyfile(problem.path / "test.py", tmp / "test_submission.py")
        (tmp / "pytest.ini").write_text("[pytest]\n")  # so no project config is picked up
        report = tmp / "report.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "--rootdir", str(tmp), "-c", str(tmp / "pytest.ini"),
                   f"--junitxml={report}", "test_submission.py"]
        if samples_only:
            command += ["-k", SAMPLE_PREFIX]
        # One intra-op thread (unless you set OMP_NUM_THREADS): the tiny models gain nothing
        # from more, and `check` runs two tests at once on a small machine.
        env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONPATH": str(tmp),
               "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
               "PRACTICE_MODELS": str(MODELS_DIR), "PRACTICE_REPO": str(REPO_ROOT)}
        process = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the whole group: pytest and its children
            process.communicate()
            return RunResult(error=f"stopped after {timeout:g} s: does your code loop forever "
                                   "(or wait for something that never comes)?",
                             seconds=time.monotonic() - started)
        result = RunResult(seconds=time.monotonic() - started)
        if report.is_file():
            result.tests, result.error = read_junit(report, submission)
        if not result.tests and not result.error:
            tail = "\n".join(output.strip().splitlines()[-15:])
            result.error = f"the tests did not run (exit status {process.returncode}):\n{tail}"
        return result


def read_junit(report: Path, submission: Path) -> tuple[list[TestOutcome], str]:
    """Test outcomes from pytest's JUnit XML, and a collection error (e.g. an import error)."""
    tests: list[TestOutcome] = []
    for case in ET.parse(report).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None and case.find("skipped") is not None:
            continue
        if bad is not None and not case.get("classname"):  # the test module failed to import
            return [], import_error(bad.text or bad.get("message", ""), submission)
        message = "" if bad is None else describe_failure(bad, submission)
        tests.append(TestOutcome(case.get("name", "?"), bad is None, message))
    return tests, ""


def describe_failure(element: ET.Element, submission: Path) -> str:
    """The assertion message (without pytest's `assert ...` rewrite) plus, when the exception
    came from the submission, the line of the student's file where it was raised."""
    message = element.get("message", "")
    lines = []
    for line in message.splitlines():
        if line.startswith("assert "):
            break
        lines.append(line)
    text = ("\n".join(lines).strip() or message.strip()).removeprefix("AssertionError: ")
    return text + raised_at(element.text or "", submission)


def import_error(text: str, submission: Path) -> str:
    """One line for a test module that could not import the submission, e.g.
    `ImportError: cannot import name 'f' from 'submission'`, or an error raised at import."""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    message = " ".join(errors[-2:]) if errors else (text.strip().splitlines() or ["?"])[-1]
    message = re.sub(r"\(/\S*submission\.py\)", f"({submission})", message)
    return f"{submission}: the tests could not import it: {message}" + raised_at(text, submission)


def raised_at(traceback: str, submission: Path) -> str:
    """`(raised at FILE:LINE)` for the deepest frame of a pytest traceback in the submission."""
    lines = re.findall(r"^submission\.py:(\d+): ", traceback, flags=re.MULTILINE)
    return f"\n(raised at {submission}:{lines[-1]})" if lines else ""


# --- progress ----------------------------------------------------------------------------------


def progress_path(workspace: Path) -> Path:
    return workspace / PROGRESS_FILE


def load_progress(workspace: Path) -> dict[str, dict]:
    """{number: {"status": "solved" | "tried", "attempts": n, "last": iso time}}."""
    path = progress_path(workspace)
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def record_result(workspace: Path, problem: Problem, passed: bool) -> None:
    """Remember the outcome; a solved problem stays solved."""
    progress = load_progress(workspace)
    entry = progress.get(str(problem.number), {"status": "tried", "attempts": 0})
    entry["attempts"] = entry.get("attempts", 0) + 1
    entry["last"] = datetime.now().isoformat(timespec="seconds")
    if passed:
        entry["status"] = "solved"
    progress[str(problem.number)] = entry
    workspace.mkdir(parents=True, exist_ok=True)
    progress_path(workspace).write_text(json.dumps(progress, indent=2, sort_keys=True) + "\n")


def status_of(progress: dict[str, dict], problem: Problem) -> str:
    return progress.get(str(problem.number), {}).get("status", "new")


STATUS_STYLE = {"solved": "[green]solved[/]", "tried": "[yellow]tried[/]", "new": "[dim]new[/]"}


# --- commands ----------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """Problems with number, title, chapter, difficulty, env and your status."""
    progress = load_progress(args.workspace)
    table = Table(title="Practice problems")
    for column in ("#", "title", "chapter", "difficulty", "env", "status"):
        table.add_column(column, justify="right" if column == "#" else "left")
    for p in load_problems(args.problems):
        if args.chapter is None or p.chapter == args.chapter:
            table.add_row(str(p.number), p.title, str(p.chapter), p.difficulty, p.env,
                          STATUS_STYLE[status_of(progress, p)])
    console.print(table)
    console.print("Start one with [bold]python practice/judge.py start N[/].")
    return 0


def show_statement(problem: Problem) -> None:
    console.print(Panel(Markdown(problem.statement),
                        title=f"{problem.number} · {problem.title}",
                        subtitle=f"chapter {problem.chapter} · {problem.difficulty} · "
                                 f"{problem.env}"))


def cmd_start(args: argparse.Namespace) -> int:
    """Copy the starter into the workspace (never overwriting without --force) and show the
    statement."""
    problem = find_problem(load_problems(args.problems), args.problem)
    target = args.workspace / problem.workspace_name
    args.workspace.mkdir(parents=True, exist_ok=True)
    show_statement(problem)
    if target.exists() and not args.force:
        console.print(f"You already started: your file {target} is kept as it is. "
                      "Use --force to start over (your file is then backed up).")
    else:
        if target.exists():
            backup = target.with_name(f"{target.name}.{datetime.now():%Y%m%d-%H%M%S}.bak")
            shutil.copy2(target, backup)
            console.print(f"Backed up your previous file to {backup}")
        shutil.copyfile(problem.path / "starter.py", target)
        console.print(f"Wrote the starter to {target}")
    console.print(f"Edit [bold]{target}[/], then run "
                  f"[bold]python practice/judge.py test {problem.number}[/] "
                  "(--samples for the examples only). A hint is shown if a test fails.")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    """Grade the workspace file (or a given file); record the result."""
    problem = find_problem(load_problems(args.problems), args.problem)
    submission = Path(args.file) if args.file else args.workspace / problem.workspace_name
    if not submission.is_file():
        console.print(f"[red]No file {submission}[/]: run "
                      f"python practice/judge.py start {problem.number} first.")
        return 2
    result = run_tests(problem, submission, samples_only=args.samples, timeout=args.timeout)
    report(problem, result, args.samples)
    record_result(args.workspace, problem, result.passed and not args.samples)
    return 0 if result.passed else 1


def report(problem: Problem, result: RunResult, samples_only: bool) -> None:
    """Print each test's verdict, the first failure, and the hint or the explanation."""
    what = "samples" if samples_only else "tests"
    if result.error:  # one line, never wrapped: `file:line: message`
        console.print(f"[red]✗ {problem.number} {problem.slug}: {escape(result.error)}[/]",
                      soft_wrap=True)
        if not result.tests:
            return
    for test in result.tests:
        mark = "[green]✓[/]" if test.passed else "[red]✗[/]"
        console.print(f"  {mark} {escape(test.name)}")
    if result.failures:
        first = result.failures[0]
        console.print(Panel(escape(first.message or "(no message)"),
                            title=f"first failure: {escape(first.name)}",
                            border_style="red"))
    if result.passed:
        console.print(f"[green bold]All {len(result.tests)} {what} passed[/] "
                      f"({result.seconds:.1f} s).")
        if samples_only:
            console.print("Now run the hidden tests too: drop --samples.")
        elif problem.explanation:
            console.print(Panel(Markdown(problem.explanation), title="Explanation",
                                border_style="green"))
        return
    passed = sum(t.passed for t in result.tests)
    console.print(f"[red bold]{passed}/{len(result.tests)} {what} passed.[/]")
    if problem.hint:
        console.print(Panel(Markdown(problem.hint), title="Hint", border_style="yellow"))


def cmd_solution(args: argparse.Namespace) -> int:
    """Print the reference solution."""
    problem = find_problem(load_problems(args.problems), args.problem)
    console.print("Looking is fine once you have tried: compare, then close it and write "
                  "your own from memory.")
    console.print(Syntax((problem.path / "solution.py").read_text(), "python",
                         line_numbers=True))
    if problem.explanation:
        console.print(Panel(Markdown(problem.explanation), title="Explanation"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Solved / tried counts per chapter."""
    progress = load_progress(args.workspace)
    problems = load_problems(args.problems)
    table = Table(title="Your practice")
    for column in ("chapter", "problems", "solved", "tried", "new"):
        table.add_column(column, justify="right")
    for chapter in sorted({p.chapter for p in problems}):
        statuses = [status_of(progress, p) for p in problems if p.chapter == chapter]
        table.add_row(str(chapter), str(len(statuses)), str(statuses.count("solved")),
                      str(statuses.count("tried")), str(statuses.count("new")))
    statuses = [status_of(progress, p) for p in problems]
    table.add_row("all", str(len(statuses)), str(statuses.count("solved")),
                  str(statuses.count("tried")), str(statuses.count("new")), style="bold")
    console.print(table)
    return 0


def python_can_import(module: str) -> tuple[bool, str]:
    """Whether a fresh interpreter (as the tests use) imports `module`; its file or the error."""
    code = f"import {module}; print(getattr({module}, '__file__', '') or '')"
    with tempfile.TemporaryDirectory() as tmp:  # not the repo: what the tests will see
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True,
                              text=True, timeout=120)
    if done.returncode == 0:
        return True, done.stdout.strip()
    return False, (done.stderr.strip().splitlines() or ["failed"])[-1]


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the environment and say what each kind of problem needs."""
    table = Table(title="Environment", show_lines=False)
    for column in ("check", "", "details"):
        table.add_column(column)
    version_ok = sys.version_info >= (3, 10)
    table.add_row("Python >= 3.10", mark(version_ok),
                  escape(f"{sys.version.split()[0]} at {sys.executable}"))
    pytest_ok, pytest_where = python_can_import("pytest")
    table.add_row("pytest", mark(pytest_ok), escape(pytest_where if pytest_ok else
                  f"{pytest_where}; install it: pip install pytest"))
    torch_ok, torch_where = python_can_import("torch")
    table.add_row("torch", mark(torch_ok), escape(torch_where if torch_ok else
                  f"{torch_where}; install the project: pip install -e ."))
    minisgl_ok, minisgl_where = python_can_import("minisgl")
    if minisgl_ok:
        where = Path(minisgl_where).resolve()
        origin = ("the reference engine" if where.is_relative_to(REPO_ROOT / "solutions")
                  else "your own tree" if where.is_relative_to(REPO_ROOT / "work")
                  else "installed from elsewhere")
        table.add_row("minisgl", mark(True), escape(f"{minisgl_where} ({origin})"))
    else:
        table.add_row("minisgl", mark(False),
                      escape(f"{minisgl_where}; run: pip install -e . --no-deps"))
    missing_models = [m for m in TINY_MODELS if not (MODELS_DIR / m / "config.json").is_file()]
    table.add_row("tiny models", mark(not missing_models),
                  f"{', '.join(TINY_MODELS)} in {MODELS_DIR}" if not missing_models else
                  f"missing {', '.join(missing_models)}; run: {PROVISION_HINT}")
    console.print(table)

    browser_ok = version_ok and pytest_ok
    torch_fixes = ([] if torch_ok else ["pip install -e ."]) + \
        ([] if minisgl_ok or not torch_ok else ["pip install -e . --no-deps"]) + \
        ([PROVISION_HINT] if missing_models else [])
    torch_ready = browser_ok and not torch_fixes
    ready = {"browser": browser_ok, "torch": torch_ready,
             "cuda": torch_ready and cuda_available()}
    todo = {"browser": "use Python >= 3.10 and pip install pytest",
            "torch": "run: " + "; ".join(torch_fixes) if torch_fixes else "see browser",
            "cuda": "needs an NVIDIA GPU and a CUDA build of torch"}
    problems = load_problems(args.problems)
    by_env = Table(title="What you can solve here")
    for column in ("env", "problems", "", "to do"):
        by_env.add_column(column)
    for env in ENVS:
        numbers = [str(p.number) for p in problems if p.env == env]
        if numbers:
            by_env.add_row(env, " ".join(numbers), mark(ready[env]),
                           "ready: start one" if ready[env] else todo[env])
    console.print(by_env)
    return 0 if browser_ok else 1


def cuda_available() -> bool:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def mark(ok: bool) -> str:
    return "[green]✓[/]" if ok else "[red]✗[/]"


# --- check (maintainers) -----------------------------------------------------------------------


@dataclass
class CheckRow:
    slug: str
    problem: Problem | None = None
    solution: RunResult | None = None
    starter: RunResult | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def parse_chapter_range(text: str) -> list[int]:
    """"0-11" or "0,2,5-7" -> the chapter numbers."""
    chapters: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        chapters += range(int(low), int(high or low) + 1)
    return chapters


def static_errors(problem: Problem) -> list[str]:
    """What is wrong with a problem's files, without running anything."""
    errors = [] if sample_names(problem) else [f"no sample test ({SAMPLE_PREFIX}*) in test.py"]
    for name in ("starter.py", "solution.py"):
        error = syntax_error(problem.path / name)
        if error:
            errors.append(error)
    if not errors:
        starter, solution = (defined_names(problem.path / n) for n in ("starter.py", "solution.py"))
        if starter - solution:
            errors.append(f"the solution lacks {', '.join(sorted(starter - solution))}")
    return errors


def run_errors(row: CheckRow) -> list[str]:
    """What the solution's and the starter's test runs say is wrong."""
    assert row.solution is not None and row.starter is not None
    errors = []
    if not row.solution.passed:
        first = row.solution.failures[0] if row.solution.failures else None
        reason = row.solution.error or (f"{first.name}: {first.message}" if first else "")
        errors.append(f"the solution fails: {reason}")
    if row.starter.error and not row.starter.tests:
        errors.append(f"the starter does not run: {row.starter.error}")
    elif row.starter.passed:
        errors.append("the starter passes every test: some test is vacuous")
    return errors


def cmd_check(args: argparse.Namespace) -> int:
    """Every problem well-formed, solution passes, starter fails; enough problems per chapter."""
    started = time.monotonic()
    root: Path = args.problems
    folders = sorted(f for f in root.iterdir() if f.is_dir()) if root.is_dir() else []
    rows: list[CheckRow] = []
    numbers: dict[int, str] = {}
    for folder in folders:
        row = CheckRow(folder.name)
        try:
            row.problem = parse_problem(folder)
        except ProblemError as error:
            row.errors.append(str(error))
        names = {row.slug, str(row.problem.number)} if row.problem else {row.slug}
        if args.only and not names & set(args.only):
            continue
        if row.problem is not None:
            if row.problem.number in numbers:
                row.errors.append(f"number {row.problem.number} is also used by "
                                  f"{numbers[row.problem.number]}")
            numbers[row.problem.number] = row.slug
            row.errors += static_errors(row.problem)
        rows.append(row)

    # Two runs per problem (solution, starter), `--jobs` at a time.
    runnable = [row for row in rows if row.problem is not None]
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = {(row.slug, kind): pool.submit(run_tests, row.problem,
                                              row.problem.path / f"{kind}.py")
                for row in runnable for kind in ("solution", "starter")}
        for row in runnable:
            row.solution = runs[row.slug, "solution"].result()
            row.starter = runs[row.slug, "starter"].result()
            row.errors += run_errors(row)

    table = Table(title="practice check")
    for column in ("#", "slug", "ch", "env", "solution", "starter", "verdict"):
        table.add_column(column)
    for row in sorted(rows, key=lambda r: r.problem.number if r.problem else -1):
        p = row.problem
        verdict = "[green]ok[/]" if row.ok else "[red]" + escape("; ".join(row.errors)) + "[/]"
        table.add_row(str(p.number) if p else "?", row.slug, str(p.chapter) if p else "",
                      p.env if p else "", run_summary(row.solution, want_pass=True),
                      run_summary(row.starter, want_pass=False), verdict)
    console.print(table)

    counts = {ch: sum(1 for r in rows if r.problem and r.problem.chapter == ch) for ch in CHAPTERS}
    required = set(parse_chapter_range(args.require_chapters)) if args.require_chapters else set()
    shown = sorted({ch for ch, n in counts.items() if n} | required)
    console.print("Problems per chapter: " + ", ".join(f"ch{ch}: {counts[ch]}" for ch in shown))
    chapter_errors = [] if args.only else [
        f"chapter {ch} has {counts[ch]} problems (at least {MIN_PROBLEMS_PER_CHAPTER} needed)"
        for ch in shown if counts[ch] < MIN_PROBLEMS_PER_CHAPTER]
    for error in chapter_errors:
        console.print(f"[red]{error}[/]")
    failed = [r for r in rows if not r.ok]
    ok = rows and not failed and not chapter_errors
    console.print(f"{'[green]check passed[/]' if ok else '[red]check failed[/]'}: "
                  f"{len(rows) - len(failed)}/{len(rows)} problems ok "
                  f"({time.monotonic() - started:.0f} s, {args.jobs} workers).")
    return 0 if ok else 1


def run_summary(result: RunResult | None, want_pass: bool) -> str:
    """`7/7 pass 3.1s` for a solution, `fails 7/7 2.9s` for a starter; red when wrong."""
    if result is None:
        return ""
    if result.error and not result.tests:
        return f"[red]error[/] {result.seconds:.1f}s"
    total = len(result.tests)
    passed = sum(t.passed for t in result.tests)
    good = result.passed if want_pass else not result.passed
    label = f"{passed}/{total} pass" if want_pass else f"fails {total - passed}/{total}"
    return f"[{'green' if good else 'red'}]{label}[/] {result.seconds:.1f}s"


# --- command line ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # --problems / --workspace work before or after the command (`test 3 --workspace DIR`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--problems", type=Path, default=argparse.SUPPRESS,
                        help="the problems folder (default: practice/problems)")
    common.add_argument("--workspace", type=Path, default=argparse.SUPPRESS,
                        help="your files and progress (default: practice/workspace)")
    parser = argparse.ArgumentParser(prog="judge.py", parents=[common],
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(problems=PROBLEMS_DIR, workspace=WORKSPACE_DIR)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help: str) -> argparse.ArgumentParser:  # noqa: A002
        p = sub.add_parser(name, help=help, parents=[common])
        p.set_defaults(run=run)
        return p

    command("doctor", cmd_doctor, "check Python, torch, minisgl and the models")
    p = command("list", cmd_list, "the problems and your status")
    p.add_argument("--chapter", type=int, help="only this chapter's problems")
    p = command("start", cmd_start, "copy a problem's starter into the workspace")
    p.add_argument("problem", help="number (or slug)")
    p.add_argument("--force", action="store_true", help="start over (backs up your file)")
    p = command("test", cmd_test, "grade your file")
    p.add_argument("problem", help="number (or slug)")
    p.add_argument("file", nargs="?", help="the file to grade (default: your workspace file)")
    p.add_argument("--samples", action="store_true", help="only the examples (test_example*)")
    p.add_argument("--timeout", type=float, help="seconds before the run is stopped "
                   f"(default: {TIMEOUTS['browser']} browser, {TIMEOUTS['torch']} torch)")
    p = command("solution", cmd_solution, "print the reference solution")
    p.add_argument("problem", help="number (or slug)")
    command("status", cmd_status, "solved / tried per chapter")
    p = command("check", cmd_check, "maintainers: every problem is sound (CI)")
    p.add_argument("only", nargs="*", help="only these problem numbers")
    p.add_argument("--jobs", type=int, default=2, help="test runs in parallel (default 2)")
    p.add_argument("--require-chapters", metavar="RANGE",
                   help=f"e.g. 0-11: fail unless each has >= {MIN_PROBLEMS_PER_CHAPTER} problems")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ProblemError as error:
        console.print(f"[red]malformed problem: {error}[/]")
        return 2


if __name__ == "__main__":
    sys.exit(main())
