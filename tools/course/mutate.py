"""Mutation testing of the chapter tests: how many realistic wrong answers do they reject?

Each chapter keeps a catalogue, chapters/chNN_slug/mutations.toml, of mistakes students really
make, written as data:

    [[mutation]]
    stub = "scheduler/cache.py:CacheManager.allocate_paged"   # one of the chapter's stubs
    find = "div_ceil(req.device_len, self.page_size)"          # occurs once in its reference body
    replace = "req.device_len // self.page_size"
    mistake = "rounds the last page down"

A mutant is the tree a student would have with that one mistake: the reference code of every
stub but the mutated one. It is built and tested exactly as `steps.py test K` does; it is killed
when a test fails (or hangs, or crashes the test process), and survives when every test passes.
A kill by a crash alone is listed: a segfault may not happen on every run.

The report, docs/_reports/mutations.json, keeps per chapter the counts of the last full run and
the SHA-256 of the catalogue and of the test file it ran with, so a test can tell a stale entry.

A second catalogue per chapter, chapters/chNN_slug/heldout.toml (same format), holds mistakes
written from the stubs' docstrings alone by someone who had not read the tests, and is never
used to write them: `mutate K --catalogue heldout` measures how the tests fare on mistakes
nobody listed for them. Its report, docs/_reports/heldout.json, keeps the first run's counts
("before") beside the last ("after").
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from course.paths import BUILD, PYTHON, STUDENT_TREE
from course.errors import CourseError
from course.manifest import Course
from course.report import console
from course.checks import run_chapter_tests
from course.runner import Run
from course.snapshot import build_snapshot
from course.source import first_line, functions

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

MIN_PER_CHAPTER = 5
TARGET_KILL_RATE = 0.95
REPORT = Path("docs") / "_reports" / "mutations.json"
CATALOGUES = {"mutations": REPORT, "heldout": Path("docs") / "_reports" / "heldout.json"}


@dataclass(frozen=True)
class Mutation:
    chapter: int
    stub: str  # "path:Symbol"
    find: str
    replace: str
    mistake: str
    equivalent: str = ""  # why this mutant cannot be told apart (it is expected to survive)

    @property
    def path(self) -> str:
        return self.stub.partition(":")[0]

    @property
    def symbol(self) -> str:
        return self.stub.partition(":")[2]


def catalogue_path(course: Course, k: int, catalogue: str = "mutations") -> Path:
    return course.root / "chapters" / course.chapter(k).name / f"{catalogue}.toml"


def sources_digest(course: Course, k: int, catalogue: str = "mutations") -> dict[str, str]:
    """The report entry's fingerprint of what chapter k's mutants ran with: the SHA-256 of its
    catalogue and of its test file (a change to either makes the entry stale)."""

    def sha256(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""

    return {
        "catalogue_sha256": sha256(catalogue_path(course, k, catalogue)),
        "tests_sha256": sha256(course.root / course.chapter(k).tests),
    }


def load_mutations(course: Course, k: int, catalogue: str = "mutations") -> list[Mutation]:
    path = catalogue_path(course, k, catalogue)
    if not path.is_file():
        return []
    try:
        entries = tomllib.loads(path.read_text("utf-8")).get("mutation", [])
        return [
            Mutation(k, e["stub"], e["find"], e["replace"], e["mistake"], e.get("equivalent", ""))
            for e in entries
        ]
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as error:
        raise CourseError(f"{path}: not a valid mutation catalogue ({error})") from None


def mutated_file(course: Course, mutation: Mutation) -> str:
    """The reference file with the mistake made in the stub's body; CourseError when the
    catalogue no longer fits the code (the stub is gone, or `find` is not there exactly once)."""
    where = f"mutation of {mutation.stub} ({mutation.mistake})"
    if course.stub_owner.get((mutation.path, mutation.symbol)) != mutation.chapter:
        raise CourseError(f"{where}: not a stub of chapter {mutation.chapter}")
    text = course.reference(mutation.path)
    lines = text.splitlines(keepends=True)
    node = functions(ast.parse(text))[mutation.symbol][0]
    first, end = first_line(node), node.end_lineno
    body = "".join(lines[first - 1 : end])
    if body.count(mutation.find) != 1:
        raise CourseError(
            f"{where}: {mutation.find!r} occurs {body.count(mutation.find)} times in its body "
            "(need 1)"
        )
    mutated = (
        "".join(lines[: first - 1])
        + body.replace(mutation.find, mutation.replace)
        + "".join(lines[end:])
    )
    try:
        ast.parse(mutated)
    except SyntaxError as error:
        raise CourseError(f"{where}: the change leaves invalid Python ({error})") from None
    return mutated


def write_tree(course: Course, k: int, work: Path, mutation: Mutation | None = None) -> None:
    """Write to `work` the student tree of chapter k that has every stub's reference body,
    but for the one mistake `mutation` (none: the answer key)."""
    shutil.rmtree(work, ignore_errors=True)
    for path in course.files(k):
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        mutated = mutation is not None and path == mutation.path
        target.write_text(
            mutated_file(course, mutation) if mutated else course.reference(path), "utf-8"
        )


def run_mutant(course: Course, mutation: Mutation, build: Path, jobs: int = 1) -> Run:
    """Build the student tree with this one mistake and run the chapter's tests on it."""
    k = mutation.chapter
    work = build / STUDENT_TREE
    write_tree(course, k, work, mutation)
    root = build / "tree"
    build_snapshot(course, k, "student", root, work=work)
    label = f"{mutation.stub}: {mutation.mistake}"
    return run_chapter_tests(course, [course.chapter(k).tests], root, jobs, label=label)


def sample(mutations: list[Mutation], size: int, seed: int) -> list[Mutation]:
    """A fixed-seed sample, for CI: the harness and the catalogues stay alive."""
    return sorted(
        random.Random(seed).sample(mutations, min(size, len(mutations))),
        key=lambda m: (m.chapter, m.stub),
    )


def cmd_mutate(course: Course, args: argparse.Namespace) -> int:
    """Check every catalogue, run the mutants (all, or a fixed-seed sample), report."""
    if args.write:
        return write_mutant(course, args)
    chapters = [args.chapter] if args.chapter is not None else sorted(course.chapters)
    catalogue = {k: load_mutations(course, k, args.catalogue) for k in chapters}
    if args.only:
        catalogue = {k: [m for m in ms if args.only in m.mistake] for k, ms in catalogue.items()}
    problems = [
        f"chapter {k} has {len(ms)} mutations (at least {MIN_PER_CHAPTER} needed)"
        for k, ms in catalogue.items()
        if len(ms) < MIN_PER_CHAPTER and not args.only and args.catalogue == "mutations"
    ]
    everything = []
    for mutation in (m for ms in catalogue.values() for m in ms):
        try:
            mutated_file(course, mutation)
        except CourseError as error:  # reported; its mutant cannot be built
            problems.append(str(error))
        else:
            everything.append(mutation)
    chosen = sample(everything, args.sample, args.seed) if args.sample else everything
    started = time.monotonic()
    build = course.root / BUILD / "mutants" / str(os.getpid())  # runs at once do not clash
    with ThreadPoolExecutor(args.jobs) as pool:
        runs = list(
            pool.map(
                lambda im: run_mutant(course, im[1], build / str(im[0]), args.jobs),
                enumerate(chosen),
            )
        )
    survivors = [(m, run) for m, run in zip(chosen, runs) if run.ok and not m.equivalent]
    rows = []
    for k in chapters:
        mine = [(m, run) for m, run in zip(chosen, runs) if m.chapter == k and not m.equivalent]
        killed = sum(not run.ok for _, run in mine)
        rows.append((k, killed, len(mine)))
        if mine:  # a sample leaves most chapters out
            console.print(f"chapter {k}: {killed}/{len(mine)} mutants killed")
    for m, _ in survivors:
        console.print(f"  [red]survived[/] ch{m.chapter} {m.stub}: {m.mistake}")
    for m, run in zip(chosen, runs):
        if run.failures and all(case.crashed for case in run.failures):
            console.print(
                f"  [yellow]killed only by a crash[/] ch{m.chapter} {m.stub}: {m.mistake}: "
                f"{run.verdict}"
            )
        elif run.failures and all(case.timed_out for case in run.failures):
            # On a loaded machine a correct test may run out of time too: not a sure kill.
            console.print(
                f"  [yellow]killed only by a timeout[/] ch{m.chapter} {m.stub}: {m.mistake}: "
                f"{run.verdict}"
            )
    for problem in problems:
        console.print(f"  [red]-[/] {problem}")
    console.print(f"{len(chosen)} mutants in {time.monotonic() - started:.0f} s")
    if args.report and not args.sample and not args.only:
        write_report(course, rows, survivors, [m for m in chosen if m.equivalent], args)
    weak = [k for k, killed, total in rows if total and killed < TARGET_KILL_RATE * total]
    return 1 if problems or (survivors if args.sample or args.only else weak) else 0


def write_mutant(course: Course, args: argparse.Namespace) -> int:
    """`mutate K --write DIR [--only TEXT]`: chapter K's tree with the reference bodies, and
    the one catalogued mistake that TEXT names, written to DIR to be judged by `test K --work`
    (on a GPU, say, where the chapter's GPU tests run too)."""
    if args.chapter is None:
        raise CourseError("--write needs a chapter: mutate K --write DIR")
    k = args.chapter
    mutation = None
    if args.only:
        found = [m for m in load_mutations(course, k, args.catalogue) if args.only in m.mistake]
        if len(found) != 1:
            raise CourseError(
                f"--only {args.only!r} matches {len(found)} mistakes of chapter {k} (need 1)"
            )
        mutation = found[0]
    write_tree(course, k, args.write, mutation)
    what = f"{mutation.stub}: {mutation.mistake}" if mutation else "the reference bodies"
    console.print(f"wrote chapter {k}'s tree with {escape(what)} to {args.write}")
    console.print(f"judge it: {PYTHON} tools/steps.py test {k} --work {args.write}")
    return 0


def write_report(
    course: Course,
    rows: list[tuple[int, int, int]],
    survivors: list[tuple[Mutation, Run]],
    equivalent: list[Mutation],
    args: argparse.Namespace,
) -> None:
    """Update the catalogue's report, docs/_reports/mutations.json or heldout.json (one entry
    per chapter, kept from earlier runs); the maintainers' page draws its tables from them
    (`::mutations`). The held-out report keeps a chapter's first run as its "before"."""
    path = course.root / CATALOGUES[args.catalogue]
    path.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(path.read_text("utf-8")) if path.is_file() else {}
    flag = "" if args.catalogue == "mutations" else f" --catalogue {args.catalogue}"
    for k, killed, total in rows:
        if not total:
            continue
        entry = {
            "chapter": course.chapters[k].name,
            "killed": killed,
            "total": total,
            "date": date.today().isoformat(),
            "command": f"{PYTHON} tools/steps.py mutate {k}{flag} --report",
            **sources_digest(course, k, args.catalogue),
            "survivors": [f"{m.stub}: {m.mistake}" for m, _ in survivors if m.chapter == k],
            "equivalent": [
                f"{m.stub}: {m.mistake}: {m.equivalent}" for m in equivalent if m.chapter == k
            ],
        }
        if args.catalogue == "heldout":
            earlier = report.get(str(k), {})
            keys = ("killed", "total", "date", "tests_sha256", "survivors")
            entry["before"] = earlier.get("before") or {key: entry[key] for key in keys}
        report[str(k)] = entry
    ordered = dict(sorted(report.items(), key=lambda item: int(item[0])))
    path.write_text(json.dumps(ordered, indent=2) + "\n", "utf-8")
