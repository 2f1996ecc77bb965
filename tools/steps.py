"""The chapter judge of mini-sglang from Scratch (docs/maintainers.md explains the machinery).

Student commands (they work on your tree in work/minisgl/ and never lose your code):
    .venv/bin/python tools/steps.py list                 chapters and your status
    .venv/bin/python tools/steps.py start K [--force]    copy chapter K's stub files into work/
    .venv/bin/python tools/steps.py test K               chapter K's tests, its main, its GPU tests
    .venv/bin/python tools/steps.py watch K              test K again each time you save a file
    .venv/bin/python tools/steps.py tree K               snapshot K's files: new / modified / early
Instructors:
    .venv/bin/python tools/steps.py grade --submissions DIR --csv FILE   grade many work/ trees
Maintainers (CI):
    .venv/bin/python tools/steps.py check [K]     reference passes, stubs fail, outputs unchanged
    .venv/bin/python tools/steps.py capture [K]   rewrite docs/_outputs/ from the reference mains
    .venv/bin/python tools/steps.py mutate [K]    run the catalogue of wrong answers on the tests
    .venv/bin/python tools/steps.py mutate K --write DIR [--only TEXT]   a tree with one mistake
    .venv/bin/python tools/steps.py mutate [K] --catalogue heldout   mistakes kept from the tests
    .venv/bin/python tools/steps.py sync [--check]   regenerate chapters/*/skeleton/
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    from rich.markup import escape
    from rich.table import Table
except ModuleNotFoundError:  # started with a Python that lacks the project's packages
    sys.exit(
        "steps.py needs the project's environment: run ./run demo (or ./run test) once, "
        "then use .venv/bin/python tools/steps.py"
    )

from course import CourseError
from course.batch import cmd_grade
from course.mutate import CATALOGUES, REPORT, cmd_mutate
from course.manifest import Course
from course.gpu import judge_gpu
from course.checks import (
    HEADROOM,
    MAIN_TIMEOUT_S,
    TEST_TIMEOUT_S,
    Timing,
    check_chapters,
    edited_test_files,
    run_chapter_tests,
    run_mains,
)
from course.outputs import OUTPUTS, another_cpu
from course.paths import BUILD, PYTHON, ROOT, WORK
from course.report import console, print_cases, print_failure, print_snapshot
from course.runner import end_runs_on_interrupt, run_main, sandbox_env
from course.snapshot import build_snapshot, sync_skeletons, tree_of
from course.store import ProgressStore, backup
from course.warm import prefer_warm_runs
from course.workspace import plan_start, sha

WATCH_POLL_S = 0.3  # how often `watch` looks for saved files
SLOWEST_SHOWN = 10  # reference runs `check` lists with their share of the limit


def progress(course: Course) -> ProgressStore:
    return ProgressStore(course.root / WORK / ".progress.json")


# --- student commands -----------------------------------------------------------------------


def cmd_list(course: Course, args: argparse.Namespace) -> int:
    store = progress(course)
    styles = {"passed": "green", "in progress": "yellow", "not started": "dim"}
    table = Table("ch", "chapter", "title", "status")
    for k, m in sorted(course.chapters.items()):
        status = store.get(k).get("status", "not started")
        status = "in progress" if status == "failed" else status
        table.add_row(str(k), m.name, escape(m.title), f"[{styles[status]}]{status}[/]")
    console.print(table)
    passed = sum(store.get(k).get("status") == "passed" for k in course.chapters)
    console.print(f"Progress: {passed}/{len(course.chapters)} chapters passed")
    return 0


def cmd_start(course: Course, args: argparse.Namespace) -> int:
    """Copy chapter K's stub files into work/minisgl/ without losing student code."""
    k, m, store = args.chapter, course.chapter(args.chapter), progress(course)
    plan, conflicts = plan_start(course, k, store.get("files"), args.force)
    if conflicts:
        for path in conflicts:
            console.print(f"[red]refused:[/] work/minisgl/{path} has your changes")
        console.print(
            "Nothing was written. With --force these files are replaced, "
            "and a backup of each is kept next to it."
        )
        return 1
    for step in plan:
        target = course.work / step.path
        what = step.what + (f" -> {backup(target).name}" if step.backs_up else "")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(step.text, "utf-8", newline="")
        console.print(f"  work/minisgl/{step.path}: {escape(what)}")
    store.update("files", **{step.path: sha(step.text) for step in plan})
    if store.get(k).get("status") != "passed":
        store.update(k, status="in progress")
    console.print(f"[bold]Chapter {k}: {escape(m.title)}[/] — you write:")
    for stub in m.stubs:
        path, symbol = stub.split(":", 1)
        console.print(
            f"  [bold]{symbol}[/] in work/minisgl/{path}: {escape(course.task(path, symbol))}",
            soft_wrap=True,
        )
    console.print(f"Read: {m.docs}\nThen: {PYTHON} tools/steps.py test {k}")
    return 0


def cmd_test(course: Course, args: argparse.Namespace) -> int:
    """Assemble snapshot K from the student's tree; run K's tests, then its main, then its GPU
    tests where there is CUDA; report."""
    k, m, store = args.chapter, course.chapter(args.chapter), progress(course)
    root = course.root / BUILD / "student" / f"{k:02d}"
    work = args.work.resolve() if args.work else None
    recorded = not args.select and work is None  # a partial run, or another tree, is no status

    def verdict(ok: bool, why: str) -> int:
        if recorded:
            store.update(k, status="passed" if ok else "failed", strict=args.strict)
        console.print(
            f"[bold {'green' if ok else 'red'}]chapter {k} "
            f"{'PASSED' if ok else 'FAILED'}[/]: {escape(why)}"
        )
        return 0 if ok else 1

    try:
        snap = build_snapshot(course, k, "student", root, work=work)
    except CourseError as err:
        return verdict(False, f"{err} (fix this syntax error first)")
    if args.verbose:
        print_snapshot(snap)
    if snap.fallbacks and args.strict:
        return verdict(
            False,
            f"--strict: {len(snap.fallbacks)} symbols of chapters < {k} are not "
            "yours yet (--verbose lists them)",
        )
    if m.why_not_here:
        return verdict(False, m.why_not_here)
    earlier = [course.chapters[j] for j in sorted(course.chapters, reverse=True) if j < k]
    if args.all or args.strict:
        for skipped in [c for c in earlier if c.why_not_here]:
            console.print(f"[yellow]skipped:[/] {escape(skipped.why_not_here)}")
    else:
        earlier = []
    chapters = [m] + [c for c in earlier if not c.why_not_here]  # a gap: a chapter not written
    gpu_files = dict.fromkeys(t.split("::")[0] for c in chapters for t in c.gpu_tests)
    edited = edited_test_files(course, [c.tests for c in chapters] + list(gpu_files))
    if edited:
        return verdict(
            False,
            f"{', '.join(edited)} differ from the committed version "
            "(restore with `git checkout -- <file>`)",
        )
    tree_name = escape(str(work)) if work else "work/minisgl/"
    also = ", ".join(str(c.number) for c in chapters[1:])
    label = f"chapter {k} tests" + (f" and chapters {also}" if also else "")
    console.print(f"Running {label} on your tree ({tree_name}) ...")
    extra = ["-k", args.select] if args.select else []
    # The main runs beside the tests, each with half the cores: a verdict in about the time of
    # the longer of the two. It is stopped as soon as a test fails (then it would not count).
    stop_main = threading.Event()
    beside = ThreadPoolExecutor(1)
    main_run = None
    if not args.select:
        main_env = sandbox_env(root, jobs=2)
        main_run = beside.submit(
            run_main,
            course.root / m.main,
            root,
            course.root,
            args.main_timeout,
            main_env,
            stop_main.is_set,
        )
    tests = None
    try:
        jobs = 2 if main_run else 1
        tests = run_chapter_tests(
            course, [c.tests for c in chapters], root, jobs, args.test_timeout, extra, label
        )
    finally:
        if tests is None or not tests.ok:
            stop_main.set()
        beside.shutdown(wait=False)
    rerun = f"{PYTHON} tools/steps.py test {k}" + (f" --work {args.work}" if work else "")
    problems: list[str] = []
    if not tests.ok:
        console.print(
            f"[red]{escape(tests.verdict)}[/] ({tests.seconds:.0f} s); {len(tests.passed)} passed"
        )
        print_cases(tests)
        case = tests.failures[0] if tests.failures else None
        if case is not None:
            test_file = course.root / chapters[0].tests
            again = rerun if case.is_collection else f"{rerun} -k {case.name}"
            print_failure(course, k, snap, tests, case, test_file, again)
        elif tests.hung:
            console.print(f"Hint: {tests.hung} never finished: does your code loop forever?")
        problems.append(f"{len(tests.failures) or 'no'} failing tests")
    else:
        console.print(f"[green]{len(tests.passed)} tests passed[/] ({tests.seconds:.0f} s)")
    if args.select:
        return verdict(
            tests.ok, problems[0] if problems else f"the tests matching -k {args.select} pass"
        )
    if tests.ok and main_run is not None:
        main = main_run.result()
        if main.ok:
            console.print(f"[green]main {m.main} ran[/] ({main.seconds:.0f} s)")
        else:
            console.print(escape(main.output.strip()[-1500:]))
            problems.append(f"the main {m.main} {main.verdict}")
    gpu = judge_gpu(course, k, chapters, snap, rerun, "--no-gpu" if args.no_gpu else "")
    if not gpu.ok:
        problems.append(gpu.why)
    if problems:
        return verdict(False, "; ".join(problems))
    following = (
        f"{PYTHON} tools/steps.py start {k + 1}"
        if k + 1 in course.chapters
        else "you finished the last chapter"
    )
    console.print(f"Next: {following}; practice: {PYTHON} practice/judge.py list --chapter {k}")
    passed = f"{len(tests.passed)} tests" + (
        f", the main and {gpu.passed} GPU tests" if gpu.passed else " and the main"
    )
    return verdict(True, f"{passed} pass")


def cmd_watch(course: Course, args: argparse.Namespace) -> int:
    """Run `test K` now and again each time a file under work/ changes, until Ctrl-C."""

    tree, shown = (args.work, str(args.work)) if args.work else (course.work, "work/minisgl/")

    def stamp() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in tree.rglob("*.py") if p.is_file()}

    seen = None
    try:
        while True:
            now = stamp()
            if now != seen:
                seen = now
                console.clear()
                cmd_test(course, args)
                console.print(
                    f"[dim]Watching {escape(shown)} for changes (chapter {args.chapter});"
                    " Ctrl-C to stop.[/]"
                )
            time.sleep(WATCH_POLL_S)
    except KeyboardInterrupt:
        console.print("Stopped watching.")
        return 0


def cmd_tree(course: Course, args: argparse.Namespace) -> int:
    tree, counts = tree_of(course, args.chapter)
    console.print(tree)
    console.print(counts)
    return 0


# --- maintainer commands --------------------------------------------------------------------


def cmd_check(course: Course, args: argparse.Namespace) -> int:
    numbers = [args.chapter] if args.chapter is not None else sorted(course.chapters)
    failures, start = 0, time.monotonic()
    for k in numbers:
        m = course.chapter(k)
        missing = [p for p in (m.main, m.tests) if not (course.root / p).is_file()]
        if missing:
            console.print(f"{m.name}: [red]missing {', '.join(missing)}[/]")
            return 1
    timings: list[Timing] = []
    main_env = another_cpu() if args.another_cpu else None
    checked = check_chapters(course, numbers, args.jobs, args.test_timeout, main_env)
    for m, problems, summary, chapter_timings in checked:
        failures += bool(problems)
        timings += chapter_timings
        console.print(
            f"{m.name}: {'[red]FAIL[/]' if problems else '[green]ok[/]'} {summary} "
            f"({time.monotonic() - start:.0f} s)"
        )
        for problem in problems:
            console.print(f"  [red]-[/] {escape(problem)}")
    console.print(f"The slowest reference runs (at most {HEADROOM:.0%} of a limit):")
    for timing in sorted(timings, key=lambda t: t.share, reverse=True)[:SLOWEST_SHOWN]:
        console.print(f"  {escape(str(timing))}")
    console.print(
        f"{len(numbers)} chapters checked in {time.monotonic() - start:.0f} s, {failures} failing"
    )
    return 1 if failures else 0


def cmd_capture(course: Course, args: argparse.Namespace) -> int:
    """Run the reference mains and write their output and figure data to docs/_outputs/."""
    numbers = [args.chapter] if args.chapter is not None else sorted(course.chapters)
    outputs = course.root / OUTPUTS
    failed = 0
    for k in numbers:
        m = course.chapter(k)
        ref = build_snapshot(course, k, "reference", course.root / BUILD / "steps" / f"{k:02d}")
        for run in run_mains(course, m, ref.root, outputs):
            if run.ok:
                (outputs / f"{Path(run.label).stem}.txt").write_text(run.output, "utf-8")
            failed += not run.ok
            console.print(f"{run.label}: {run.verdict} ({run.seconds:.0f} s)")
    return 1 if failed else 0


def cmd_sync(course: Course, args: argparse.Namespace) -> int:
    """Regenerate chapters/*/skeleton/; with --check only name the stale files."""
    stale = sync_skeletons(course, write=not args.check)
    for line in stale:
        console.print(f"  {'stale' if args.check else 'wrote'}: {line}")
    if args.check and stale:
        console.print(
            f"[red]{len(stale)} stale skeleton files:[/] run {PYTHON} tools/steps.py sync"
        )
        return 1
    done = "up to date" if args.check else f"{len(stale)} files written"
    console.print(f"skeletons of {len(course.chapters)} chapters: {done}")
    return 0


# --- command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    intro, usage = __doc__.split("\n\n")[:2]
    parser = argparse.ArgumentParser(
        description=intro, epilog=usage, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the course repository")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, help: str, chapter: str = "") -> argparse.ArgumentParser:  # noqa: A002
        p = sub.add_parser(name, help=help)
        p.set_defaults(run=run)
        if chapter:
            p.add_argument("chapter", type=int, nargs="?" if chapter == "?" else None)
        return p

    command("list", cmd_list, "chapters and your status")
    start = command("start", cmd_start, "copy chapter K's stub files into work/minisgl/", "1")
    start.add_argument("--force", action="store_true", help="replace changed files (backed up)")
    test = command("test", cmd_test, "run chapter K's tests, then its main, on your tree", "1")
    watch = command("watch", cmd_watch, "run `test K` again whenever you save a file", "1")
    for p in (test, watch):
        p.add_argument("--all", action="store_true", help="also the tests of chapters < K")
        p.add_argument("--strict", action="store_true", help="only your code, all chapters' tests")
        p.add_argument("-k", dest="select", help="only the tests matching this pytest expression")
        p.add_argument("--verbose", action="store_true", help="show where each file came from")
        p.add_argument("--test-timeout", type=float, default=TEST_TIMEOUT_S, help="s per test")
        p.add_argument("--main-timeout", type=float, default=MAIN_TIMEOUT_S, help="s for the main")
        p.add_argument("--no-gpu", action="store_true", help="skip the GPU tests even with CUDA")
        p.add_argument("--work", type=Path, help="judge this tree instead of work/minisgl/")
    command("tree", cmd_tree, "the files of snapshot K", "1")
    grade = command("grade", cmd_grade, "instructors: grade many students' work/ trees")
    grade.add_argument("--submissions", type=Path, required=True, help="a folder per student")
    grade.add_argument("--csv", type=Path, required=True, help="where to write the grades")
    grade.add_argument("--chapters", help="e.g. 0-8 (default: every chapter)")
    grade.add_argument("--jobs", type=int, default=2, help="chapter runs at once")
    check = command("check", cmd_check, "maintainer: reference passes, stubs fail", "?")
    check.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="runs at once, 1 thread each (default: one per core; more would share the cores "
        "and slow every run, which the headroom check measures)",
    )
    check.add_argument(
        "--test-timeout", type=float, default=TEST_TIMEOUT_S, help="s per test (the students')"
    )
    check.add_argument(
        "--another-cpu",
        action="store_true",
        help="run the mains on another CPU's arithmetic path (outputs must still match)",
    )
    capture = command("capture", cmd_capture, "maintainer: rewrite docs/_outputs/", "?")
    mutate = command("mutate", cmd_mutate, "maintainer: wrong answers the tests reject", "?")
    mutate.add_argument("--sample", type=int, help="run only this many mutants (CI)")
    mutate.add_argument("--seed", type=int, default=0, help="which sample")
    mutate.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    mutate.add_argument("--only", help="only the mutations whose mistake contains this text")
    mutate.add_argument(
        "--catalogue",
        choices=sorted(CATALOGUES),
        default="mutations",
        help="mutations.toml (what the tests were written against) or heldout.toml (mistakes "
        "kept from the test writers, to measure the tests on)",
    )
    mutate.add_argument(
        "--write",
        type=Path,
        metavar="DIR",
        help="run nothing: write chapter K's tree with the reference bodies (and the one --only "
        "mistake) to DIR, for `test K --work DIR`",
    )
    report = argparse.BooleanOptionalAction
    mutate.add_argument("--report", action=report, default=True, help=f"update {REPORT}")
    sync = command("sync", cmd_sync, "maintainer: regenerate chapters/*/skeleton/")
    sync.add_argument("--check", action="store_true", help="only name stale files")
    for many_runs in (grade, check, capture, mutate):
        many_runs.set_defaults(warm=True)
    args = parser.parse_args(argv)
    end_runs_on_interrupt()
    if getattr(args, "warm", False):  # a student's `test` makes one or two runs: started cold
        prefer_warm_runs()
    try:
        return args.run(Course.load(args.root.resolve()).check(), args)
    except CourseError as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        return 2
    except KeyboardInterrupt:
        stopped = "every process the judge started has ended; your files are as they were"
        console.print(f"[yellow]Stopped (Ctrl-C): {stopped}.[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
