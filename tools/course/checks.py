"""The maintainer's proof that a chapter works, and the one rule for stubs and starters.

A chapter is sound when its reference snapshot passes its main and tests, every one of its tests
fails on the skeleton (a test that passes on stubs checks nothing the student writes), and its
main still prints what the site shows (docs/_outputs/, volatile figures aside). A practice
problem is sound by the same rule: the solution passes every test, the starter fails every test.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from course.manifest import Course, Manifest
from course.problems import Problem
from course.paths import BUILD
from course.outputs import CAPTURE_ENV, OUTPUTS, output_drift
from course.runner import FAILED, Run, run_main, run_pytest, sandbox_env
from course.snapshot import build_snapshot

MAIN_TIMEOUT_S = 120  # one chapter main
RUN_TIMEOUT_S = 600  # one whole pytest run, should the per-test timeout not fire
TEST_TIMEOUT_S = 30  # one test: a hanging stub is named after this long
# The reference may use at most this share of a limit under check's own parallelism: a
# student's slower laptop, or CI with other work beside it, still has room to pass.
HEADROOM = 1 / 3


@dataclass(frozen=True)
class Timing:
    """How long one reference run (a test's call, or a main) took against its limit."""

    what: str
    seconds: float
    limit: float

    @property
    def share(self) -> float:
        return self.seconds / self.limit if self.limit else 0.0

    def __str__(self) -> str:
        return f"{self.what}: {self.seconds:.1f} s of {self.limit:g} s ({self.share:.0%})"


def timings_of(m: Manifest, tests: Run, mains: list[Run]) -> list[Timing]:
    """The reference's tests and mains of chapter `m`, each against its limit."""
    return [Timing(f"{m.tests}::{c.name}", c.seconds, c.limit) for c in tests.tests if c.limit] + [
        Timing(run.label, run.seconds, MAIN_TIMEOUT_S) for run in mains
    ]


def without_headroom(timings: list[Timing]) -> list[str]:
    return [
        f"{t} is over {HEADROOM:.0%} of its limit: make it faster (no raised limits)"
        for t in timings
        if t.share > HEADROOM
    ]


def run_chapter_tests(
    course: Course,
    test_files: list[str],
    tree: Path,
    jobs: int = 1,
    test_timeout: float = TEST_TIMEOUT_S,
    extra: list[str] | None = None,
    label: str = "",
    run_timeout: float = RUN_TIMEOUT_S,
) -> Run:
    """Run the course's chapter test files (or node ids) on the snapshot at `tree` (the judge,
    its GPU verdict, batch grading and mutants all grade this way)."""
    return run_pytest(
        label or ", ".join(test_files),
        test_files,
        course.root,
        sandbox_env(tree, jobs, MINISGL_TREE=str(tree)),
        tree / "results.jsonl",
        run_timeout,
        test_timeout,
        extra,
    )


def vacuous_tests(
    answer: Run, stubs: Run, answer_word: str = "reference", stub_word: str = "stubs"
) -> list[str]:
    """What is wrong when the answer key (reference or solution) and the stubs (skeleton or
    starter) are both run: the answer must pass every test, the stubs must fail every one."""
    problems = []
    if not answer.ok:
        problems.append(
            f"the {answer_word} fails: {answer.verdict}: "
            + ", ".join(f"{c.name} ({c.message[:200]})" for c in answer.failures)
        )
    passing = [c.name for c in stubs.tests if c.outcome not in FAILED]
    if passing:
        problems.append(f"tests that pass on the {stub_word}: {', '.join(passing)}")
    unseen = sorted({c.name for c in answer.tests} - {c.name for c in stubs.tests})
    if unseen or not stubs.tests:
        problems.append(
            f"tests that never ran on the {stub_word} ({stubs.verdict}): "
            + (", ".join(unseen[:5]) or "all")
        )
    return problems


def unsound_problem(problem: Problem, solution: Run, starter: Run) -> list[str]:
    """What is wrong with a practice problem: samples must exist, and the chapter judge's
    rule holds (the solution passes every test, the starter fails every one)."""
    errors = [] if problem.sample_names else ["no sample test (test_example*) in test.py"]
    return errors + vacuous_tests(solution, starter, "solution", "starter")


def mains_of(course: Course, m: Manifest) -> list[str]:
    """The chapter's main, and for the last chapter of a stage the stage's milestone."""
    milestone = f"examples/stage{m.stage}_milestone.py"
    last = m.number == course.stages[m.stage][-1] and (course.root / milestone).is_file()
    return [m.main] + ([milestone] if last else [])


def run_mains(
    course: Course,
    m: Manifest,
    tree: Path,
    capture: Path,
    jobs: int = 1,
    extra_env: dict[str, str] | None = None,
) -> list[Run]:
    """Run the chapter's mains on `tree`; figure data they dump lands in `capture`.
    `extra_env` is set last (another_cpu(): the arithmetic of another CPU)."""
    capture.mkdir(parents=True, exist_ok=True)
    env = sandbox_env(tree, jobs, **{CAPTURE_ENV: str(capture)}) | (extra_env or {})
    return [
        run_main(course.root / main, tree, course.root, MAIN_TIMEOUT_S, env)
        for main in mains_of(course, m)
    ]


def drifted_outputs(course: Course, runs: list[Run], capture: Path) -> list[str]:
    """Captured outputs whose deterministic part no longer matches a fresh run."""
    problems = []
    fresh = {f"{Path(run.label).stem}.txt": run.output for run in runs if run.ok}
    fresh |= {p.name: p.read_text("utf-8") for p in capture.glob("*.json")}
    for name, text in sorted(fresh.items()):
        committed = course.root / OUTPUTS / name
        if not committed.is_file():
            problems.append(f"{OUTPUTS / name} is missing: run steps.py capture")
        elif drift := output_drift(committed.read_text("utf-8"), text):
            problems.append(f"{OUTPUTS / name} changed (run steps.py capture):\n{drift}")
    return problems


def check_chapters(
    course: Course,
    chapters: list[int],
    jobs: int,
    test_timeout: float = TEST_TIMEOUT_S,
    main_env: dict[str, str] | None = None,
) -> Iterator[tuple[Manifest, list[str], str, list[Timing]]]:
    """Check chapters (each: reference passes its main and tests within HEADROOM of their
    limits, every test fails on the skeleton, outputs unchanged), with every run of every
    chapter in one pool of `jobs` workers so the cores stay busy; yields (manifest, problems,
    summary, timings of the reference) in chapter order.

    Tests get the students' per-test limit (or their time_limit mark): a test too slow for a
    student's run fails here first. `main_env` goes to the mains (run_mains)."""
    build = course.root / BUILD / "steps"
    with ThreadPoolExecutor(jobs) as pool:
        pending = []
        for k in chapters:
            m = course.chapter(k)
            if m.why_not_here:  # this machine cannot run the chapter
                pending.append((m, None, None, None))
                continue
            ref = build_snapshot(course, k, "reference", build / f"{k:02d}")
            skel = build_snapshot(course, k, "skeleton", build / f"{k:02d}-skeleton")
            capture = build / f"{k:02d}-capture"
            tests = [
                pool.submit(
                    run_chapter_tests,
                    course,
                    [m.tests],
                    snap.root,
                    jobs,
                    test_timeout,
                    label=f"{m.tests} on {snap.root.name}",
                )
                for snap in (ref, skel)
            ]
            pending.append(
                (
                    m,
                    tests,
                    pool.submit(run_mains, course, m, ref.root, capture, jobs, main_env),
                    capture,
                )
            )
        for m, tests, mains, capture in pending:
            if tests is None or mains is None or capture is None:
                yield m, [m.why_not_here], "not run", []
                continue
            ref_tests, skel_tests = (job.result() for job in tests)
            main_runs = mains.result()
            problems = [
                f"reference main {run.label}: {run.verdict}\n{run.output[-800:]}"
                for run in main_runs
                if not run.ok
            ]
            problems += drifted_outputs(course, main_runs, capture)
            problems += vacuous_tests(ref_tests, skel_tests)
            timings = timings_of(m, ref_tests, main_runs)
            problems += without_headroom(timings)
            summary = (
                f"main {sum(r.ok for r in main_runs)}/{len(main_runs)}, "
                f"{len(ref_tests.passed)}/{len(ref_tests.tests)} pass on the reference, "
                f"{len(skel_tests.failures)}/{len(skel_tests.tests)} fail on the stubs"
            )
            yield m, problems, summary, timings


def edited_test_files(course: Course, paths: list[str]) -> list[str]:
    """The test files that differ from their committed version (in a git checkout): a judge
    must grade with the course's tests, not with tests a student edited."""
    if not (course.root / ".git").exists() or shutil.which("git") is None:  # a bare copy
        return []
    edited = []
    for path in paths:
        committed = subprocess.run(
            ["git", "show", f"HEAD:{path}"], cwd=course.root, capture_output=True
        )
        if committed.returncode == 0 and committed.stdout != (course.root / path).read_bytes():
            edited.append(path)
    return edited
