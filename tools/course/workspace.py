"""The student's tree (work/minisgl/): what `start K` writes there, never losing their code.

A file is replaced only when it is a skeleton the tool handed out and the student has not
changed it; a file of an earlier chapter that chapter K modifies is merged (the student's code
stays, K's new stubs come in); any other changed file is replaced only with --force, after a
backup.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

from course.manifest import Course
from course.snapshot import skeleton_text
from course.source import (
    FEATURES,
    functions,
    is_unwritten,
    replace_functions,
    source_of,
    stub_of,
)


@dataclass
class Step:
    path: str
    what: str  # created / up to date / updated / merged ... / replaced (backup kept)
    text: str

    @property
    def backs_up(self) -> bool:
        return "backup" in self.what


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def merge_modified(
    course: Course, path: str, k: int, mine: str, skeleton: str
) -> tuple[str, list[str]]:
    """The student's earlier file updated for chapter k, keeping everything they wrote:
    chapter k's symbols become stubs unless the student wrote them already; an __init__.py
    gains the skeleton's import lines it lacks."""
    lines = mine.splitlines(keepends=True)
    if path == FEATURES:  # the course's table of parts: chapter k's rows are what runs
        return skeleton, [f"{FEATURES} is chapter {k}'s table now (yours is in the backup)"]
    if path.endswith("__init__.py"):
        have = {line.strip() for line in lines}
        add = [
            line
            for line in skeleton.splitlines(keepends=True)
            if line.startswith("from .") and line.strip() not in have
        ]
        imports = [
            n.end_lineno
            for n in ast.parse(mine).body
            if isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        at = max(imports, default=len(lines))
        lines[-1:] = [lines[-1].rstrip("\n") + "\n"] if lines else []
        return "".join(lines[:at] + add + lines[at:]), [f"added {a.strip()}" for a in add]
    ref_lines = course.reference(path).splitlines(keepends=True)
    ref_funcs, funcs = functions(ast.parse(course.reference(path))), functions(ast.parse(mine))
    new_sources, notes = {}, []
    for symbol, owner in course.stubs_in(path):
        if owner != k:
            continue
        ref, node = ref_funcs[symbol][0], funcs.get(symbol, [None])[0]
        if node is None:
            notes.append(f"{symbol} is missing from your file: copy it from the skeleton")
        elif is_unwritten(node) or source_of(lines, node) == source_of(ref_lines, ref):
            new_sources[symbol] = stub_of(ref_lines, ref, course.message(path, symbol, k, k))
        else:
            notes.append(f"kept your {symbol}")
    return replace_functions(mine, new_sources), notes


def is_pristine(course: Course, path: str, text: str, handed_out: dict[str, str]) -> bool:
    """True when `text` is a skeleton the tool handed out that the student has not changed."""
    return handed_out.get(path) == sha(text) or any(
        text == skeleton_text(course, path, j)
        for j, m in course.chapters.items()
        if path in m.new + m.modified
    )


def plan_start(
    course: Course, k: int, handed_out: dict[str, str], force: bool
) -> tuple[list[Step], list[str]]:
    """What `start k` would write, and the files it refuses to touch without --force."""
    m = course.chapter(k)
    plan: list[Step] = []
    conflicts: list[str] = []
    for path in m.new + m.modified:
        new, target = skeleton_text(course, path, k), course.work / path
        mine = target.read_text("utf-8") if target.is_file() else None
        if mine is None or mine == new or is_pristine(course, path, mine, handed_out):
            plan.append(
                Step(
                    path,
                    "created" if mine is None else "up to date" if mine == new else "updated",
                    new,
                )
            )
        elif path in m.modified and parses(mine):
            merged, notes = merge_modified(course, path, k, mine, new)
            plan.append(
                Step(path, "; ".join(["merged with your code (backup kept)", *notes]), merged)
            )
        elif force:
            plan.append(Step(path, "replaced (backup kept)", new))
        else:
            conflicts.append(path)
    return plan, conflicts
