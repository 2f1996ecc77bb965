"""What the tools print: one rich console, short verdicts, and the first failure explained.

A failure report points at the student's own code: the failing test, its assertion (pytest shows
the operands), the stubs the test exercises (from the test's source and from the traceback),
which of them are still unwritten, that stub's docstring as the hint, and the command that
reruns just that test on the student's tree.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from course.errors import CourseError
from course.manifest import Course
from course.problems import Problem
from course.runner import Run, TestCase
from course.snapshot import Snapshot
from course.source import find_definition, functions, is_unwritten, symbol_at

MESSAGE_LINES = 12  # of the first failure's assertion
HINT_LINES = 8  # of the stub's docstring
CASE_LINES = 8  # failing tests listed by name; with the two above a report stays within 40 lines


def make_console() -> Console:
    """Logs (CI) are wider than the 80 columns rich assumes when stdout is not a terminal."""
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 120))
    return Console(highlight=False, width=width)


console = make_console()


def mark(ok: bool) -> str:
    return "[green]✓[/]" if ok else "[red]✗[/]"


def print_cases(run: Run, limit: int = CASE_LINES) -> None:
    """One line per failing test (passing ones are counted, not listed)."""
    for case in run.failures[:limit]:
        why = (
            " (stopped: does your code loop forever?)"
            if case.timed_out
            else " (the test process died while it ran)"
            if case.crashed
            else ""
        )
        console.print(f"  {mark(False)} {escape(case.name)}{why}")
    if len(run.failures) > limit:
        console.print(f"  ... and {len(run.failures) - limit} more")


def first_lines(text: str, limit: int) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:limit] + (["..."] if len(lines) > limit else []))


def tree_prefix(course: Course, snapshot: Snapshot) -> str:
    """A regex for the snapshot's minisgl/ folder as tracebacks write it: absolute (frames the
    timeout names) or relative to the course root (pytest's working directory)."""
    tree = snapshot.root / "minisgl"
    forms = [str(tree)] + (
        [str(tree.relative_to(course.root))] if tree.is_relative_to(course.root) else []
    )
    return "(?:" + "|".join(map(re.escape, forms)) + ")"


def student_paths(text: str, course: Course, snapshot: Snapshot) -> str:
    """Rewrite snapshot paths in a traceback to the student's work/ files."""
    prefix = tree_prefix(course, snapshot) + r"/([\w/]+\.py)(?::(\d+))?"

    def where(found: re.Match[str]) -> str:
        line = int(found.group(2)) if found.group(2) else None
        return snapshot.student_location(found.group(1), line) or found.group(0)

    return re.sub(prefix, where, text)


def stubs_in_traceback(
    course: Course, k: int, snapshot: Snapshot, details: str
) -> list[tuple[str, str]]:
    """(file, symbol) of the stubs of chapters <= k (the student's) whose code appears in a
    failure's traceback, innermost last."""
    found: list[tuple[str, str]] = []
    prefix = tree_prefix(course, snapshot) + r"/([\w/]+\.py):(\d+)"
    for path, line in re.findall(prefix, details):
        target = snapshot.root / "minisgl" / path
        symbol = symbol_at(target.read_text("utf-8"), int(line)) if target.is_file() else None
        mine = symbol is not None and course.stub_owner.get((path, symbol), k + 1) <= k
        if mine and (path, symbol) not in found:
            found.append((path, symbol))
    return found


def stubs_named_in_test(
    course: Course, k: int, test_file: Path, test: str
) -> list[tuple[str, str]]:
    """Chapter k's stubs whose names the test function's source mentions."""
    try:
        node = find_definition(test_file.read_text("utf-8"), test.split("[")[0])
    except (CourseError, OSError, SyntaxError):  # a generated test, or no such file
        return []
    names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return [
        (path, symbol)
        for (path, symbol), owner in course.stub_owner.items()
        if owner == k and symbol.rsplit(".", 1)[-1] in names
    ]


# How course.differential's assertion names the stub whose result differs from the reference's.
DIFFERING_STUB = re.compile(r"([\w.]+) \(minisgl/([\w/]+\.py)\) differs from the reference")


def stub_that_differs(course: Course, k: int, message: str) -> list[tuple[str, str]]:
    """Chapter k's stub that a differential test found to differ from the reference, if any."""
    found = DIFFERING_STUB.search(message)
    if found is None or course.stub_owner.get((found[2], found[1])) != k:
        return []
    return [(found[2], found[1])]


def unwritten(course: Course, snapshot: Snapshot, path: str, symbol: str) -> bool:
    """True when the snapshot still has the stub's NotImplementedError body."""
    target = snapshot.root / "minisgl" / path
    if not target.is_file():
        return True
    nodes = functions(ast.parse(target.read_text("utf-8"))).get(symbol)
    return bool(nodes) and is_unwritten(nodes[0])


def docstring_hint(course: Course, path: str, symbol: str) -> str:
    """The stub's docstring: what to write, its invariants and the helpers to call."""
    node = functions(ast.parse(course.reference(path)))[symbol][0]
    return first_lines(ast.get_docstring(node) or f"implement {symbol}", HINT_LINES)


def print_failure(
    course: Course,
    k: int,
    snapshot: Snapshot,
    run: Run,
    case: TestCase,
    test_file: Path,
    rerun: str,
    title: str = "First failure",
) -> None:
    """The first failure, explained in at most ~30 lines."""
    console.print(f"\n[bold]{title}:[/] {escape(case.name)}")
    # A module that failed to import says why at the end of its traceback.
    message = (
        case.message
        if not case.is_collection
        else "\n".join(case.details.strip().splitlines()[-MESSAGE_LINES:])
    )
    message = student_paths(message or "(no message)", course, snapshot)
    console.print("  " + escape(first_lines(message, MESSAGE_LINES)).replace("\n", "\n  "))
    in_trace = stubs_in_traceback(course, k, snapshot, f"{case.message}\n{case.details}")
    differs = stub_that_differs(course, k, case.message or "")
    exercised = differs + [
        s
        for s in in_trace + stubs_named_in_test(course, k, test_file, case.name)
        if s not in differs
    ]
    exercised = list(dict.fromkeys(exercised))
    if in_trace:
        path, symbol = in_trace[-1]
        location = student_paths(f"{case.message}\n{case.details}", course, snapshot)
        lines = re.findall(rf"(work/minisgl/{re.escape(path)}(?::\d+)?)", location)
        console.print(f"  raised in {symbol} ({lines[-1] if lines else 'work/minisgl/' + path})")
    if exercised:
        names = ", ".join(
            symbol + (" (not written yet)" if unwritten(course, snapshot, p, symbol) else "")
            for p, symbol in exercised
        )
        console.print(f"[bold]This test exercises:[/] {escape(names)}")
    if case.timed_out:
        console.print(
            "[bold]Hint:[/] the test was stopped: does your code loop forever, or wait "
            "for something that never comes?"
        )
    elif case.crashed:
        console.print(
            "[bold]Hint:[/] a fatal signal ended the test process: native code (a kernel, "
            "torch) read or wrote memory it does not own (check masks, indices and sizes), "
            "or aborted; the stacks show which line of yours ran last."
        )
    elif exercised:
        path, symbol = next(
            ((p, s) for p, s in exercised if unwritten(course, snapshot, p, s)),
            differs[0] if differs else in_trace[-1] if in_trace else exercised[0],
        )
        console.print(f"[bold]Hint:[/] {symbol} in work/minisgl/{path}:")
        console.print("  " + escape(docstring_hint(course, path, symbol)).replace("\n", "\n  "))
    console.print(f"[bold]Rerun it:[/] {escape(rerun)}", soft_wrap=True)


def print_snapshot(snap: Snapshot) -> None:
    table = Table("file", "from", title=f"Snapshot in {snap.root}")
    for path, origin in snap.origins.items():
        table.add_row(f"minisgl/{path}", origin)
    console.print(table)
    if snap.fallbacks:
        table = Table("chapter", "symbol", "file", "why", title="Reference code used for")
        for f in snap.fallbacks:
            table.add_row(str(f.owner), f.symbol, f.path, f.reason)
        console.print(table)


def print_practice_run(problem: Problem, run: Run, samples: bool) -> None:
    """A practice verdict: each test, the first failure and the hint, or the explanation."""
    what = "samples" if samples else "tests"
    for case in run.tests:
        console.print(f"  {mark(case.outcome == 'passed')} {escape(case.name)}")
    if not run.ok:
        console.print(
            f"[red]✗ {problem.number} {problem.slug}: {escape(run.verdict)}[/]", soft_wrap=True
        )
        if run.failures:
            first = run.failures[0]
            console.print(
                Panel(
                    escape(first.message or "(no message)"),
                    title=f"first failure: {escape(first.name)}",
                    border_style="red",
                )
            )
        if problem.hint:
            console.print(Panel(Markdown(problem.hint), title="Hint", border_style="yellow"))
    else:
        console.print(f"[green bold]All {len(run.tests)} {what} passed[/] ({run.seconds:.1f} s).")
        if samples:
            console.print("Now run the hidden tests too: drop --samples.")
        elif problem.explanation:
            console.print(
                Panel(Markdown(problem.explanation), title="Explanation", border_style="green")
            )
