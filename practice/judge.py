#!/usr/bin/env python3
"""The practice judge: small problems about the engine, graded on your machine.

    .venv/bin/python practice/judge.py doctor            is everything installed?
    .venv/bin/python practice/judge.py list --chapter 4  the problems of chapter 4, with your status
    .venv/bin/python practice/judge.py start 41          copy the starter into practice/workspace/
    .venv/bin/python practice/judge.py test 41           grade your file (--samples: the examples)
    .venv/bin/python practice/judge.py solution 41       the reference answer (after you tried)
    .venv/bin/python practice/judge.py status            solved / tried per chapter
    .venv/bin/python practice/judge.py check             maintainers and CI: every problem is sound
    .venv/bin/python practice/judge.py sync [--check]    rewrite starters from their solutions

A problem is a folder practice/problems/<slug>/ (practice/README.md has the format). Tests run
with pytest in a subprocess, in a fresh temporary directory that holds only the file under test
(as submission.py) and a copy of test.py, with a timeout: a submission that hangs or crashes
gets a clear verdict, never a pass. The runner, the problem format and the progress store are
the course library's (tools/course/), shared with the chapter judge.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    from rich.markdown import Markdown
    from rich.markup import escape
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.table import Table

    from course import CourseError  # the course library, installed with the project
except ModuleNotFoundError:  # started with a Python that lacks the project's packages
    sys.exit(
        "judge.py needs the project's environment: run ./run demo (or ./run test) once, "
        "then use .venv/bin/python practice/judge.py"
    )

from course.checks import unsound_problem
from course.manifest import Course
from course.paths import MODELS, PRACTICE, PYTHON, ROOT
from course.practice import can_import, runs_ok
from course.practice import grade as grade_in_sandbox
from course.warm import prefer_warm_runs
from course.problems import ENVS, TIMEOUTS, Problem, ProblemError, derived_starter, find_problem
from course.problems import solution_source
from course.problems import load_problems as load_problems_in
from course.report import console, mark, print_practice_run
from course.runner import Run, end_runs_on_interrupt
from course.store import ProgressStore, backup
from course.tiny_models import DENSE_TINY_MODELS

PROBLEMS_DIR = PRACTICE / "problems"
WORKSPACE_DIR = PRACTICE / "workspace"
TIMEOUT_ENV_VAR = "PRACTICE_TIMEOUT"  # overrides TIMEOUTS, e.g. for the judge's own tests
MIN_PROBLEMS_PER_CHAPTER = 3
TINY_MODELS = DENSE_TINY_MODELS  # what torch problems load
# Torch problems' tests read the models from here (they run in a temporary folder).
MODELS_ENV = "PRACTICE_MODELS"
PROVISION = f"run `{PYTHON} tools/provision.py`"


def course_chapters() -> set[int]:
    return set(Course.load(ROOT).chapters)


def load_problems(root: Path | str | None = None) -> list[Problem]:
    """Every problem under `root` (default practice/problems)."""
    return load_problems_in(Path(root) if root else PROBLEMS_DIR, course_chapters())


def grade(
    problem: Problem,
    submission: Path,
    samples_only: bool = False,
    timeout: float | None = None,
    jobs: int = 1,
) -> Run:
    """Grade a file for a problem, with the problem's timeout (or --timeout, or the variable);
    `jobs` runs at once share the cores (each gets its share of threads)."""
    override = os.environ.get(TIMEOUT_ENV_VAR)
    timeout = timeout or (float(override) if override else TIMEOUTS[problem.env])
    missing = missing_models() if problem.env != "browser" else []
    if missing:  # the tests would fail on a missing file, not on the submission
        return Run(problem.slug, 0.0, f"{', '.join(missing)} missing: {PROVISION}")
    env = {MODELS_ENV: str(MODELS)}
    return grade_in_sandbox(problem, submission, timeout, env, samples_only, jobs)


def missing_models() -> list[str]:
    return [f"models/{m}" for m in TINY_MODELS if not (MODELS / m / "config.json").is_file()]


# --- student commands ---------------------------------------------------------------------------


STATUS_STYLE = {"solved": "[green]solved[/]", "tried": "[yellow]tried[/]", "new": "[dim]new[/]"}


def store(args: argparse.Namespace) -> ProgressStore:
    return ProgressStore(args.workspace / ".progress.json")


def cmd_list(args: argparse.Namespace) -> int:
    progress = store(args)
    table = Table("#", "title", "chapter", "difficulty", "env", "status", title="Practice problems")
    for p in load_problems(args.problems):
        if args.chapter is None or p.chapter == args.chapter:
            status = progress.get(p.number).get("status", "new")
            table.add_row(
                str(p.number), p.title, str(p.chapter), p.difficulty, p.env, STATUS_STYLE[status]
            )
    console.print(table)
    console.print(f"Start one with [bold]{PYTHON} practice/judge.py start N[/].")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    """Copy the starter into the workspace (never overwriting without --force)."""
    problem = find_problem(load_problems(args.problems), args.problem)
    target = args.workspace / problem.workspace_name
    args.workspace.mkdir(parents=True, exist_ok=True)
    console.print(
        Panel(
            Markdown(problem.statement),
            title=f"{problem.number} · {problem.title}",
            subtitle=f"chapter {problem.chapter} · {problem.difficulty} · {problem.env}",
        )
    )
    if target.exists() and not args.force:
        console.print(
            f"You already started: your file {target} is kept as it is. "
            "Use --force to start over (your file is then backed up)."
        )
    else:
        if target.exists():
            console.print(f"Backed up your previous file to {backup(target)}")
        shutil.copyfile(problem.path / "starter.py", target)
        console.print(f"Wrote the starter to {target}")
    console.print(
        f"Edit [bold]{target}[/], then run [bold]{PYTHON} practice/judge.py test "
        f"{problem.number}[/] (--samples for the examples only)."
    )
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    problem = find_problem(load_problems(args.problems), args.problem)
    submission = Path(args.file) if args.file else args.workspace / problem.workspace_name
    if not submission.is_file():
        console.print(
            f"[red]No file {submission}[/]: run "
            f"{PYTHON} practice/judge.py start {problem.number} first."
        )
        return 2
    run = grade(problem, submission, args.samples, args.timeout)
    print_practice_run(problem, run, args.samples)
    progress = store(args)
    previous = progress.get(problem.number)
    solved = previous.get("status") == "solved" or (run.ok and not args.samples)
    progress.update(
        problem.number,
        status="solved" if solved else "tried",
        attempts=previous.get("attempts", 0) + 1,
    )
    return 0 if run.ok else 1


def cmd_solution(args: argparse.Namespace) -> int:
    problem = find_problem(load_problems(args.problems), args.problem)
    console.print(
        "Looking is fine once you have tried: compare, then close it and write "
        "your own from memory."
    )
    console.print(Syntax(solution_source(problem), "python", line_numbers=True))
    if problem.explanation:
        console.print(Panel(Markdown(problem.explanation), title="Explanation"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    progress, problems = store(args), load_problems(args.problems)
    table = Table("chapter", "problems", "solved", "tried", "new", title="Your practice")
    for chapter in [*sorted({p.chapter for p in problems}), None]:
        statuses = [
            progress.get(p.number).get("status", "new")
            for p in problems
            if chapter is None or p.chapter == chapter
        ]
        table.add_row(
            "all" if chapter is None else str(chapter),
            str(len(statuses)),
            *(str(statuses.count(s)) for s in ("solved", "tried", "new")),
            style="bold" if chapter is None else None,
        )
    console.print(table)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the environment and say which kinds of problem can be solved here."""
    checks = {"Python >= 3.10": (sys.version_info >= (3, 10), sys.executable)}
    for module in ("pytest", "torch", "minisgl"):
        checks[module] = can_import(module)
    missing = missing_models()
    checks["tiny models"] = (
        not missing,
        f"missing {', '.join(missing)}" if missing else str(MODELS),
    )
    table = Table("check", "", "details", title="Environment")
    for name, (ok, detail) in checks.items():
        table.add_row(name, mark(ok), escape(detail))
    console.print(table)
    browser = checks["Python >= 3.10"][0] and checks["pytest"][0]
    torch_ready = browser and all(checks[n][0] for n in ("torch", "minisgl", "tiny models"))
    ready = {
        "browser": browser,
        "torch": torch_ready,
        "cuda": torch_ready and runs_ok("import torch; assert torch.cuda.is_available()")[0],
    }
    by_env = Table("env", "problems", "", title="What you can solve here")
    problems = load_problems(args.problems)
    for env in ENVS:
        numbers = " ".join(str(p.number) for p in problems if p.env == env)
        if numbers:
            by_env.add_row(env, numbers, mark(ready[env]))
    console.print(by_env)
    if not torch_ready:
        console.print("To set everything up: ./run demo (creates .venv, installs, provisions)")
    return 0 if browser else 1


# --- check (maintainers) -----------------------------------------------------------------------


def graded_solution(problem: Problem, folder: Path) -> Path:
    """A file in `folder` holding the solution as it is graded: with the bodies it takes from
    the reference engine put in (solution_source)."""
    path = folder / f"{problem.slug}.py"
    path.write_text(solution_source(problem), "utf-8")
    return path


def cmd_check(args: argparse.Namespace) -> int:
    started = time.monotonic()
    prefer_warm_runs()  # two runs a problem: each forked from one that imported pytest and torch
    problems = [
        p
        for p in load_problems(args.problems)
        if not args.only or {str(p.number), p.slug} & set(args.only)
    ]
    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(args.jobs) as pool:
        runs = {
            (p.slug, kind): pool.submit(grade, p, path, jobs=args.jobs)
            for p in problems
            for kind, path in (
                ("solution", graded_solution(p, Path(folder))),
                ("starter", p.path / "starter.py"),
            )
        }
        errors = {
            p.slug: unsound_problem(
                p, runs[p.slug, "solution"].result(), runs[p.slug, "starter"].result()
            )
            for p in problems
        }
    table = Table("#", "slug", "ch", "env", "verdict", title="practice check")
    for p in problems:
        table.add_row(
            str(p.number),
            p.slug,
            str(p.chapter),
            p.env,
            "[green]ok[/]"
            if not errors[p.slug]
            else "[red]" + escape("; ".join(errors[p.slug])) + "[/]",
        )
    console.print(table)
    required = set(args.chapters.split(",")) if args.chapters else course_chapters()
    counts = {int(ch): sum(p.chapter == int(ch) for p in problems) for ch in required}
    short = (
        []
        if args.only
        else [
            f"chapter {ch} has {n} problems (at least {MIN_PROBLEMS_PER_CHAPTER} needed)"
            for ch, n in sorted(counts.items())
            if n < MIN_PROBLEMS_PER_CHAPTER
        ]
    )
    for line in short:
        console.print(f"[red]{line}[/]")
    bad = sum(bool(e) for e in errors.values())
    ok = problems and not bad and not short
    console.print(
        f"{'[green]check passed[/]' if ok else '[red]check failed[/]'}: "
        f"{len(problems) - bad}/{len(problems)} problems ok "
        f"({time.monotonic() - started:.0f} s, {args.jobs} workers)."
    )
    return 0 if ok else 1


def cmd_sync(args: argparse.Namespace) -> int:
    """Rewrite each starter.py from its solution.py (derived_starter); --check only names the
    stale ones."""
    stale = [
        (p, text)
        for p in load_problems(args.problems)
        if (text := derived_starter(p)) != (p.path / "starter.py").read_text("utf-8")
    ]
    for problem, text in stale:
        console.print(f"  {'stale' if args.check else 'wrote'}: {problem.path / 'starter.py'}")
        if not args.check:
            (problem.path / "starter.py").write_text(text, "utf-8", newline="")
    if args.check and stale:
        console.print(
            f"[red]{len(stale)} starters differ from their solution:[/] "
            f"run {PYTHON} practice/judge.py sync"
        )
        return 1
    console.print(f"starters: {'up to date' if args.check else f'{len(stale)} written'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--problems",
        type=Path,
        default=argparse.SUPPRESS,
        help="the problems folder (default: practice/problems)",
    )
    common.add_argument(
        "--workspace",
        type=Path,
        default=argparse.SUPPRESS,
        help="your files and progress (default: practice/workspace)",
    )
    parser = argparse.ArgumentParser(
        prog="judge.py",
        parents=[common],
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(problems=PROBLEMS_DIR, workspace=WORKSPACE_DIR)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help: str) -> argparse.ArgumentParser:  # noqa: A002
        p = sub.add_parser(name, help=help, parents=[common])
        p.set_defaults(run=run)
        return p

    command("doctor", cmd_doctor, "check Python, torch, minisgl and the models")
    command("list", cmd_list, "the problems and your status").add_argument(
        "--chapter", type=int, help="only this chapter's problems"
    )
    p = command("start", cmd_start, "copy a problem's starter into the workspace")
    p.add_argument("problem", help="number (or slug)")
    p.add_argument("--force", action="store_true", help="start over (backs up your file)")
    p = command("test", cmd_test, "grade your file")
    p.add_argument("problem", help="number (or slug)")
    p.add_argument("file", nargs="?", help="the file to grade (default: your workspace file)")
    p.add_argument("--samples", action="store_true", help="only the examples (test_example*)")
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds before the run is stopped "
        f"(default: {TIMEOUTS['browser']} browser, {TIMEOUTS['torch']} torch)",
    )
    command("solution", cmd_solution, "print the reference solution").add_argument(
        "problem", help="number (or slug)"
    )
    command("status", cmd_status, "solved / tried per chapter")
    p = command("check", cmd_check, "maintainers: every problem is sound (CI)")
    p.add_argument("only", nargs="*", help="only these problem numbers")
    p.add_argument("--jobs", type=int, default=2, help="test runs in parallel (default 2)")
    p.add_argument("--chapters", help="chapters that need problems, e.g. 0,1 (default: all)")
    command("sync", cmd_sync, "maintainers: rewrite the starters from the solutions").add_argument(
        "--check", action="store_true", help="only name the stale starters (CI)"
    )
    args = parser.parse_args(argv)
    end_runs_on_interrupt()
    try:
        return args.run(args)
    except CourseError as error:
        console.print(
            f"[red]{'malformed problem: ' if isinstance(error, ProblemError) else ''}"
            f"{escape(str(error))}[/]"
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
