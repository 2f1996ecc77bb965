"""nbgrader for instructors (tools/grading.py): the generated notebooks come from the same
source as the skeletons; nbgrader autogrades a class of three (reference, untouched, one broken
function) and exports the CSV; batch grading (`steps.py grade`) of the engine trees those
notebooks wrote gives the same verdicts.

Needs the `grading` extra (`pip install -e ".[grading]"`, ./run installs it).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import grading  # noqa: E402
from course import batch, runner  # noqa: E402  (runner.TestCase: pytest would collect TestCase)
from course.manifest import Course  # noqa: E402
from course.snapshot import assemble_file, skeleton_text  # noqa: E402

CHAPTERS = sorted(k for k, m in Course.load(ROOT).chapters.items() if m.stubs)
CHAPTER = 1  # the chapter the class is graded on: its tests and main are quick
BROKEN = "is_greedy"  # the function the third student gets wrong
MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\n", re.MULTILINE)


def notebook_cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        if isinstance(cell["source"], list):
            cell["source"] = "".join(cell["source"])
    return cells


def file_cells(cells: list[dict]) -> dict[str, str]:
    """{path under minisgl/: file text} of a notebook's %%writefile cells."""
    files = {}
    for cell in cells:
        first, _, text = cell["source"].partition("\n")
        if first.startswith("%%writefile "):
            files[first.split(f"{grading.WORK.as_posix()}/", 1)[1]] = text
    return files


@pytest.fixture(scope="module")
def course() -> Course:
    return Course.load(ROOT)


@pytest.mark.parametrize("k", CHAPTERS)
def test_solution_cells_are_the_reference_between_markers(course: Course, k: int) -> None:
    notebook = grading.chapter_notebook(course, k)
    files = file_cells(notebook["cells"])
    assert list(files) == grading.stubbed_files(course, k)
    for path, text in files.items():
        assert MARKERS.sub("", text) == assemble_file(course, path, k, "reference")[0], path
        regions = len(re.findall(r"### BEGIN SOLUTION", text))
        assert regions == sum(owner == k for _, owner in course.stubs_in(path)), path


@pytest.mark.parametrize("k", CHAPTERS)
def test_cleared_solution_cells_are_the_skeleton(course: Course, k: int) -> None:
    """With each marked region replaced by a stub, as nbgrader releases it, a file cell is the
    chapter's skeleton file (but for the stub's message)."""
    region = re.compile(
        r"^(\s*)### BEGIN SOLUTION\n.*?^\s*### END SOLUTION\n", re.MULTILINE | re.DOTALL
    )
    message = re.compile(r"raise NotImplementedError\(.*\)$", re.MULTILINE)
    for path, text in file_cells(grading.chapter_notebook(course, k)["cells"]).items():
        released = region.sub(lambda m: f"{m.group(1)}raise NotImplementedError()\n", text)
        skeleton = skeleton_text(course, path, k)
        assert message.sub("raise", released) == message.sub("raise", skeleton), path


def test_one_grade_cell_per_test_function_and_a_hidden_main(course: Course) -> None:
    cells = grading.chapter_notebook(course, CHAPTER)["cells"]
    graded = {
        c["metadata"]["nbgrader"]["grade_id"]: c
        for c in cells
        if c["metadata"]["nbgrader"]["grade"]
    }
    tests = grading.test_functions(course, CHAPTER)
    assert list(graded) == [*tests, "main"]
    assert all(graded[t]["metadata"]["nbgrader"]["locked"] for t in graded)
    assert "### BEGIN HIDDEN TESTS" in graded["main"]["source"]


def test_a_file_that_does_not_parse_fails_every_check_naming_the_line(tmp_path: Path) -> None:
    grader = grading.NotebookGrader(CHAPTER, tmp_path)
    path = grading.stubbed_files(grader.course, CHAPTER)[0]
    (tmp_path / grading.WORK / path).write_text("def broken(:\n    pass\n")
    grader.run_tests()
    test = grading.test_functions(grader.course, CHAPTER)[0]
    for check in (lambda: grader.check(test), grader.check_main):
        with pytest.raises(AssertionError, match=rf"work/minisgl/{path} line 1"):
            check()


def test_batch_grading_counts_the_tests_after_a_timeout_as_not_run(
    tmp_path: Path, course: Course, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that times out ends the run (course.pytest_plugin): the test functions after it
    get a "not run" row and count against the score, as their grade cells do in nbgrader."""
    tests = grading.test_functions(course, CHAPTER)
    timeout = f"{runner.TIMEOUT_MARK}30s: {tests[1]} did not finish"
    ran = [runner.TestCase(tests[0], "passed"), runner.TestCase(tests[1], "failed", timeout)]
    monkeypatch.setattr(
        batch,
        "run_chapter_tests",
        lambda *args: runner.Run("tests", 30.0, "1 of 2 failed", tests=ran),
    )
    (tmp_path / "ada" / "minisgl").mkdir(parents=True)
    grade = batch.grade_one(course, tmp_path / "ada", CHAPTER, tmp_path / "build", 1)
    assert [(c.name, c.outcome) for c in grade.cases] == [
        (tests[0], "passed"),
        (tests[1], "failed"),
        *((test, batch.NOT_RUN) for test in tests[2:]),
    ]
    assert grade.cases[-1].message == f"not run: the run ended at {tests[1]}"
    assert grade.score == f"1/{len(tests)}"


def nbgrader(course_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """An nbgrader command in the course directory (it runs `alembic` from the venv's bin/)."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(
        [str(Path(bin_dir) / "nbgrader"), *args],
        cwd=course_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return done


def break_function(cells: list[dict], name: str) -> list[dict]:
    """The reference notebook with the solution of `name` replaced by a wrong answer."""
    solution = re.compile(
        rf"(def {name}\(.*\n(?:.*\n)*?(\s*)### BEGIN SOLUTION\n)"
        rf"(?:.*\n)*?(\s*### END SOLUTION)"
    )
    for cell in cells:
        new = solution.sub(
            lambda m: f"{m.group(1)}{m.group(2)}return False\n{m.group(3)}", cell["source"], count=1
        )
        if new != cell["source"]:
            cell["source"] = new
            return cells
    raise AssertionError(f"no solution of {name} in the notebook")


@pytest.mark.slow
def test_nbgrader_autogrades_a_class_and_batch_grading_agrees(
    tmp_path: Path, course: Course
) -> None:
    if shutil.which("nbgrader", path=str(Path(sys.executable).parent)) is None:
        if os.environ.get("CI"):
            pytest.fail("nbgrader is not installed: pip install -e '.[grading]'")
        pytest.skip("nbgrader is not installed (pip install -e '.[grading]')")
    course_dir = tmp_path / "course"
    name = course.chapter(CHAPTER).name
    assert grading.main(["course", str(course_dir), "--chapters", str(CHAPTER)]) == 0
    nbgrader(course_dir, "generate_assignment", name, "--force")

    source = course_dir / "source" / name / f"{name}.ipynb"
    release = course_dir / "release" / name / f"{name}.ipynb"
    notebook = json.loads(source.read_text())
    notebook["cells"] = break_function(notebook_cells(source), BROKEN)
    submissions = {
        "reference": source.read_text(),
        "untouched": release.read_text(),
        "broken": json.dumps(notebook),
    }
    for student, text in submissions.items():
        folder = course_dir / "submitted" / student / name
        folder.mkdir(parents=True)
        (folder / f"{name}.ipynb").write_text(text)
    started = time.monotonic()
    nbgrader(course_dir, "autograde", name)
    print(f"autograde: {(time.monotonic() - started) / len(submissions):.1f} s per student")
    nbgrader(course_dir, "export", "--to", "grades.csv")

    rows = {r["student_id"]: r for r in csv.DictReader((course_dir / "grades.csv").open())}
    assert set(rows) == set(submissions)
    scores = {student: float(row["score"]) for student, row in rows.items()}
    full = float(rows["reference"]["max_score"])
    assert scores["reference"] == full > 0
    assert scores["untouched"] == 0
    assert 0 < scores["broken"] < full

    failed = {
        student: failed_grade_cells(course_dir / "autograded" / student / name / f"{name}.ipynb")
        for student in submissions
    }
    assert not failed["reference"]
    assert set(failed["untouched"]) == {*grading.test_functions(course, CHAPTER), "main"}
    assert failed["broken"], "no grade cell of the broken submission failed"
    for test, message in failed["broken"].items():
        assert BROKEN.replace("_", "") in test.replace("_", ""), f"{test} failed: {message}"
        assert message.startswith(test), f"the failure does not name the test: {message}"

    # Batch grading (steps.py grade) of the trees the notebooks wrote: the same verdicts.
    trees = tmp_path / "trees"
    trees.mkdir()
    for student in submissions:
        (trees / student).symlink_to(course_dir / "autograded" / student / name)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "steps.py"),
            "grade",
            "--submissions",
            str(trees),
            "--csv",
            str(tmp_path / "batch.csv"),
            "--chapters",
            str(CHAPTER),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    print(f"batch grade: {(time.monotonic() - started) / len(submissions):.1f} s per student")
    batch_failed: dict[str, set[str]] = {student: set() for student in submissions}
    for row in csv.DictReader((tmp_path / "batch.csv").open()):
        if row["outcome"] in ("failed", "error", batch.NOT_RUN):
            batch_failed[row["student"]].add(row["test"].split("[")[0])
    for student in submissions:
        assert batch_failed[student] == set(failed[student]) - {"main"}, student


def failed_grade_cells(notebook: Path) -> dict[str, str]:
    """{grade id: error message} of the grade cells that failed in an autograded notebook."""
    failed = {}
    for cell in notebook_cells(notebook):
        errors = [o for o in cell.get("outputs", []) if o["output_type"] == "error"]
        if errors and cell["metadata"]["nbgrader"].get("grade"):
            failed[cell["metadata"]["nbgrader"]["grade_id"]] = errors[0]["evalue"]
    return failed
