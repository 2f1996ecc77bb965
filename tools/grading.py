"""nbgrader for instructors: a course directory generated from the chapter manifests.

    .venv/bin/python tools/grading.py course DIR [--chapters 1,4-6]

writes DIR/nbgrader_config.py and, per chapter, DIR/source/chNN_slug/chNN_slug.ipynb. The
notebook has a `%%writefile` solution cell per file of the chapter that holds stubs: the file as
it stands after the chapter (tools/course/snapshot.py, the source of the skeletons too) with the
body of each of the chapter's stubs between `### BEGIN SOLUTION` and `### END SOLUTION`, so
`nbgrader generate_assignment` turns it into the student's starting point. Locked cells then
grade the tree the notebook wrote, exactly as `steps.py test` grades work/: the student's files
go into snapshot K (earlier chapters' code comes from the reference), the course's test file
runs on it once, and one grade cell per test function (1 point) reads its verdict. A hidden
grade cell runs the chapter's main (the slowest check, so it runs only at grading).
docs/instructors.md has the whole workflow.

The notebooks' locked cells import `NotebookGrader` from this file; they find the repository
through the environment variable MINISGL_COURSE, which the generated nbgrader_config.py sets.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from course import CourseError
from course.batch import parse_chapters, test_functions
from course.checks import MAIN_TIMEOUT_S, RUN_TIMEOUT_S, run_chapter_tests
from course.manifest import Course
from course.paths import ROOT, STUDENT_TREE
from course.runner import FAILED, Run, run_main, sandbox_env
from course.snapshot import assemble_file, build_snapshot
from course.source import first_line, functions, head_of, replace_functions

COURSE_ENV = "MINISGL_COURSE"  # the repository, for the notebooks' locked cells
COURSE_ID = "minisgl"
WORK = STUDENT_TREE  # where a notebook writes its files: work/minisgl/ next to the notebook
TEST_POINTS = 1  # per test function (all its parameter sets must pass)
MAIN_POINTS = 2  # the hidden check that the chapter's main runs to its end
# nbgrader stops a cell after this long (its default, 30 s, is less than one test run).
CELL_TIMEOUT_S = max(RUN_TIMEOUT_S, MAIN_TIMEOUT_S) + 60


# --- what the notebooks' locked cells call ---------------------------------------------------


class NotebookGrader:
    """Grades the files a chapter notebook wrote into work/minisgl/ (next to the notebook)."""

    def __init__(self, chapter: int, folder: Path | str = ".") -> None:
        self.course = Course.load(ROOT)
        self.manifest = self.course.chapter(chapter)
        self.work = Path(folder).resolve() / WORK
        self._scratch = tempfile.TemporaryDirectory(prefix=f"minisgl-{self.manifest.name}-")
        self.snapshot = Path(self._scratch.name)  # snapshot K is assembled here
        self.run: Run | None = None
        self.tree_error = ""  # why the student's files could not be assembled
        self.main: Future[Run] | None = None  # the main, started beside the tests at grading
        for path in stubbed_files(self.course, chapter):  # %%writefile makes no folders
            (self.work / path).parent.mkdir(parents=True, exist_ok=True)

    def run_tests(self) -> None:
        """Assemble snapshot K from the notebook's files, run the chapter's tests once, and
        print each verdict (the grade cells below read them)."""
        try:
            build_snapshot(
                self.course, self.manifest.number, "student", self.snapshot, work=self.work
            )
        except CourseError as error:  # e.g. a file that is not valid Python
            self.tree_error = str(error)
            self.run = Run(self.manifest.tests, 0.0, self.tree_error)
        else:
            # nbgrader's autograde runs the hidden main cell too: start the main now, beside
            # the tests (two processes, so each gets half the threads).
            jobs = 2 if os.environ.get("NBGRADER_EXECUTION") == "autograde" else 1
            if jobs == 2:
                pool = ThreadPoolExecutor(1)
                self.main = pool.submit(self.run_main, jobs)
                pool.shutdown(wait=False)  # the main runs on; check_main waits for it
            self.run = run_chapter_tests(self.course, [self.manifest.tests], self.snapshot, jobs)
        print(f"{self.manifest.tests}: {self.run.verdict} ({self.run.seconds:.1f} s)")
        for case in self.run.tests:
            mark = {"passed": "✓", "skipped": "-"}.get(case.outcome, "✗")
            print(
                f"  {mark} {case.name}"
                + (f": {first_line_of(case.message)}" if case.outcome != "passed" else "")
            )

    def check(self, test: str) -> None:
        """The grade of one test function: AssertionError naming the failing case, if any
        (a skipped case counts for nothing)."""
        if self.run is None:
            self.run_tests()
        assert self.run is not None
        cases = [c for c in self.run.tests if c.name == test or c.name.startswith(f"{test}[")]
        if not cases:
            raise AssertionError(f"{test} did not run: {self.run.verdict}")
        failed = [c for c in cases if c.outcome in FAILED]
        if failed:
            raise AssertionError(f"{failed[0].name} {failed[0].outcome}: {failed[0].message}")
        skipped = sum(c.outcome == "skipped" for c in cases)
        print(
            f"{test}: passed"
            + (f" ({len(cases)} cases)" if len(cases) > 1 else "")
            + (f", {skipped} skipped" if skipped else "")
        )

    def check_main(self) -> None:
        """The chapter's main runs to its end on the notebook's engine."""
        if self.run is None:
            self.run_tests()
        if self.tree_error:
            raise AssertionError(f"your files could not be assembled: {self.tree_error}")
        main = self.main.result() if self.main is not None else self.run_main()
        if not main.ok:
            raise AssertionError(f"{self.manifest.main} {main.verdict}\n{main.output[-2000:]}")
        print(f"{self.manifest.main}: ran to its end ({main.seconds:.1f} s)")

    def run_main(self, jobs: int = 1) -> Run:
        """Run the chapter's main on the assembled snapshot (sandboxed, with its timeout)."""
        return run_main(
            self.course.root / self.manifest.main,
            self.snapshot,
            self.course.root,
            MAIN_TIMEOUT_S,
            sandbox_env(self.snapshot, jobs),
        )


def first_line_of(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


# --- generating the course -------------------------------------------------------------------


def stubbed_files(course: Course, k: int) -> list[str]:
    """The files holding chapter k's stubs, in manifest order."""
    return list(dict.fromkeys(stub.partition(":")[0] for stub in course.chapter(k).stubs))


def solution_text(course: Course, path: str, k: int) -> str:
    """`path` as it stands after chapter k, each of chapter k's stub bodies (what follows the
    signature and docstring) between nbgrader's solution markers."""
    text = assemble_file(course, path, k, "reference")[0]
    lines = text.splitlines(keepends=True)
    found = functions(ast.parse(text))
    marked: dict[str, list[str]] = {}
    for symbol, owner in course.stubs_in(path):
        if owner != k:
            continue
        node = found[symbol][0]
        head = head_of(lines, node)
        body = lines[first_line(node) - 1 + len(head) : node.end_lineno]
        first = node.body[0]
        indent = lines[first.lineno - 1][: first.col_offset]
        marked[symbol] = (
            head + [f"{indent}### BEGIN SOLUTION\n"] + body + [f"{indent}### END SOLUTION\n"]
        )
    return replace_functions(text, marked)


def grade_id(text: str) -> str:
    """nbgrader ids are letters, digits, `_` and `-`."""
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in text)


def cell(
    kind: str,
    source: str,
    cell_id: str,
    *,
    solution: bool = False,
    points: int = 0,
    locked: bool = True,
) -> dict:
    """A notebook cell with nbgrader's metadata (schema 3)."""
    meta = {
        "grade": points > 0,
        "grade_id": cell_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if points:
        meta["points"] = points
    made = {"cell_type": kind, "metadata": {"nbgrader": meta}, "source": source}
    if kind == "code":
        made.update(execution_count=None, outputs=[])
    return made


def chapter_notebook(course: Course, k: int) -> dict:
    """The instructor's (source) notebook of chapter k."""
    m = course.chapter(k)
    files = stubbed_files(course, k)
    intro = (
        f"# Chapter {k}: {m.title}\n\n"
        f"Read the chapter first (`{m.docs}` on the course site). Then write the body of "
        f"each function marked `# YOUR CODE HERE` in the file cells below: running a file "
        f"cell writes the file into `{WORK.as_posix()}/` next to this notebook. "
        f"Run every cell from the top: the test cells grade your files with the course's "
        f"tests (`{m.tests}`), as `steps.py test {k}` would; each test function is worth "
        f"{TEST_POINTS} point. At grading, a hidden check also runs the chapter's main "
        f"(`{m.main}`, {MAIN_POINTS} points).\n\n"
        f"The first cell needs the environment variable `{COURSE_ENV}`: your clone of the "
        f"course repository (the course's `nbgrader_config.py` sets it)."
    )
    setup = (
        f"# Locked: finds the course repository, and makes the folders your files go to.\n"
        f"import os, sys\n"
        f"if not os.environ.get({COURSE_ENV!r}):\n"
        f"    raise RuntimeError('set {COURSE_ENV} to your clone of the course repository "
        f"and restart the kernel')\n"
        f"sys.path.insert(0, os.path.join(os.environ[{COURSE_ENV!r}], 'tools'))\n"
        f"from grading import NotebookGrader\n\n"
        f"grader = NotebookGrader({k})"
    )
    cells = [cell("markdown", intro, "intro"), cell("code", setup, "setup")]
    for path in files:
        cells.append(cell("markdown", f"## `minisgl/{path}`", grade_id(f"about_{path}")))
        cells.append(
            cell(
                "code",
                f"%%writefile {(WORK / path).as_posix()}\n" + solution_text(course, path, k),
                grade_id(f"file_{path}"),
                solution=True,
                locked=False,
            )
        )
    cells.append(
        cell(
            "markdown",
            "## Tests\n\nThe next cell runs the chapter's tests on your "
            "files once; each cell after it grades one test function.",
            "tests_intro",
        )
    )
    cells.append(cell("code", "grader.run_tests()", "run_tests"))
    for test in test_functions(course, k):
        cells.append(cell("code", f"grader.check({test!r})", grade_id(test), points=TEST_POINTS))
    cells.append(
        cell(
            "code",
            f"# Hidden until grading: {m.main} runs to its end on your "
            f"engine.\n### BEGIN HIDDEN TESTS\ngrader.check_main()\n"
            f"### END HIDDEN TESTS",
            "main",
            points=MAIN_POINTS,
        )
    )
    for number, made in enumerate(cells):  # notebook cell ids: at most 64 characters
        made["id"] = f"cell-{number}"
    return {
        "cells": cells,
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
    }


NBGRADER_CONFIG = '''"""nbgrader configuration of the minisgl course, from tools/grading.py."""

import os

# The notebooks' locked cells import the grading helpers and tests from the course repository;
# the kernels nbgrader starts inherit this variable.
os.environ.setdefault({env!r}, {root!r})

c = get_config()  # noqa: F821 - nbgrader provides it
c.CourseDirectory.course_id = {course_id!r}
# One run of a chapter's tests (or of its main) may take minutes; a hanging one is stopped.
c.Execute.timeout = {timeout}
# A local exchange for release_assignment / fetch / submit / collect on this machine.
c.Exchange.root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exchange")
'''


def assignment_name(course: Course, k: int) -> str:
    return course.chapter(k).name


def cmd_course(args: argparse.Namespace) -> int:
    course = Course.load(ROOT)
    chapters = [k for k in parse_chapters(args.chapters, course) if course.chapter(k).stubs]
    out: Path = args.directory.resolve()
    (out / "exchange").mkdir(parents=True, exist_ok=True)
    (out / "nbgrader_config.py").write_text(
        NBGRADER_CONFIG.format(
            env=COURSE_ENV, root=str(ROOT), course_id=COURSE_ID, timeout=CELL_TIMEOUT_S
        )
    )
    for k in chapters:
        name = assignment_name(course, k)
        notebook = out / "source" / name / f"{name}.ipynb"
        notebook.parent.mkdir(parents=True, exist_ok=True)
        notebook.write_text(
            json.dumps(chapter_notebook(course, k), indent=1, ensure_ascii=False) + "\n"
        )
        print(
            f"wrote {notebook.relative_to(out)} ({len(test_functions(course, k))} tests, "
            f"{len(stubbed_files(course, k))} files)"
        )
    print(
        f"Course directory: {out}\nNext: cd {out} && nbgrader generate_assignment "
        f"{assignment_name(course, chapters[0])}  (docs/instructors.md)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grading.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    course = sub.add_parser("course", help="generate the nbgrader course directory")
    course.add_argument("directory", type=Path, help="the course directory (made if absent)")
    course.add_argument("--chapters", help="e.g. 1,4-6 (default: every chapter with stubs)")
    course.set_defaults(run=cmd_course)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except CourseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
