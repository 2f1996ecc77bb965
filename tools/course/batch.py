"""Batch grading: many students' engine trees, every chapter's tests, one CSV.

`steps.py grade --submissions DIR --csv FILE` reads DIR/<student>/ (holding work/minisgl/ or
minisgl/), assembles each student's snapshot of each chapter exactly as `steps.py test` does, and
runs the course's own test files on it (never files from the submission; a student's progress
file is never read), sandboxed with the same timeouts. One CSV row per student, chapter and test;
a test that kills the test process gets the outcome "crashed" and the tests after it run in a
fresh process (course.runner); a test that times out ends its run (course.pytest_plugin), and
the test functions the run did not reach get a row with outcome "not run".
"""

from __future__ import annotations

import argparse
import ast
import csv
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from course.paths import BUILD, STUDENT_TREE
from course.errors import CourseError
from course.manifest import Course
from course.report import console
from course.checks import run_chapter_tests
from course.runner import TestCase
from course.snapshot import build_snapshot

CSV_COLUMNS = ("student", "chapter", "test", "outcome", "message")
NOT_RUN = "not run"  # the outcome of a test after one that ended the run


@dataclass
class Grade:
    student: str
    chapter: int
    cases: list[TestCase]
    error: str = ""  # the tree could not be built or tested at all

    @property
    def score(self) -> str:
        passed = sum(case.outcome == "passed" for case in self.cases)
        return f"{passed}/{len(self.cases)}" if self.cases else "0"


def parse_chapters(text: str | None, course: Course) -> list[int]:
    """ "0-8", "3", "0,2,5" -> chapter numbers (default: all)."""
    if not text:
        return sorted(course.chapters)
    numbers: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        numbers += range(int(first), int(last or first) + 1)
    for k in numbers:
        course.chapter(k)  # raises CourseError for a chapter that does not exist
    return numbers


def test_functions(course: Course, k: int) -> list[str]:
    """The chapter's test functions (top-level `test_*`), in file order."""
    tree = ast.parse((course.root / course.chapter(k).tests).read_text("utf-8"))
    return [
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
    ]


def with_unrun_tests(cases: list[TestCase], functions: list[str]) -> list[TestCase]:
    """`cases`, plus a "not run" case per test function without one when a test that timed
    out or crashed (or the test module's import) ended the run, so they count against the
    score. After a crash the tests run on in a fresh process: the last such case is where the
    run ended."""
    ended = next(
        (
            case.name
            for case in reversed(cases)
            if case.timed_out or case.crashed or case.is_collection
        ),
        None,
    )
    if ended is None:
        return cases
    ran = {case.name.split("[")[0] for case in cases}
    return cases + [
        TestCase(name, NOT_RUN, f"not run: the run ended at {ended}")
        for name in functions
        if name not in ran
    ]


def student_tree(folder: Path) -> Path | None:
    """The minisgl/ folder of one submission."""
    for candidate in (folder / STUDENT_TREE, folder / "minisgl"):
        if candidate.is_dir():
            return candidate
    return None


def grade_one(course: Course, student: Path, k: int, build: Path, jobs: int) -> Grade:
    tree = student_tree(student)
    if tree is None:
        return Grade(student.name, k, [], "no work/minisgl/ folder in the submission")
    root = build / student.name / f"{k:02d}"
    try:
        build_snapshot(course, k, "student", root, work=tree)
    except CourseError as error:
        return Grade(student.name, k, [], str(error))
    run = run_chapter_tests(course, [course.chapter(k).tests], root, jobs)
    error = "" if run.tests else run.verdict
    return Grade(student.name, k, with_unrun_tests(run.tests, test_functions(course, k)), error)


def cmd_grade(course: Course, args: argparse.Namespace) -> int:
    students = sorted(p for p in args.submissions.iterdir() if p.is_dir())
    if not students:
        raise CourseError(f"{args.submissions} holds no student folders")
    chapters = parse_chapters(args.chapters, course)
    build = course.root / BUILD / "grade"
    jobs = [(student, k) for student in students for k in chapters]
    console.print(f"Grading {len(students)} students x {len(chapters)} chapters ...")
    with ThreadPoolExecutor(args.jobs) as pool:
        grades = list(pool.map(lambda job: grade_one(course, *job, build, args.jobs), jobs))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for grade in grades:
            if grade.error:
                writer.writerow([grade.student, grade.chapter, "", "error", grade.error])
            for case in grade.cases:
                writer.writerow(
                    [
                        grade.student,
                        grade.chapter,
                        case.name,
                        case.outcome,
                        case.message.splitlines()[0][:300] if case.message else "",
                    ]
                )
    table = Table("student", *(f"ch{k}" for k in chapters), title="Tests passed")
    for student in students:
        row = {g.chapter: g for g in grades if g.student == student.name}
        table.add_row(
            student.name, *(row[k].score if not row[k].error else "error" for k in chapters)
        )
    console.print(table)
    console.print(f"Wrote {args.csv}")
    return 0
