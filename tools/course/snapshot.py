"""Snapshot K: the engine tree as it stands after chapter K, built from one source.

Snapshot K holds the files of chapters <= K plus files brought in early. Symbols of later chapters
are stubbed ("written in chapter M: ...") unless brought in early; chapter K's own symbols are
stubs in a skeleton, reference code in the reference snapshot, and the student's code in a student
snapshot (where unwritten symbols of earlier chapters fall back to the reference).
"""

from __future__ import annotations

import ast
import io
import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.tree import Tree

from course.errors import CourseError
from course.manifest import NEVER, Course
from course.source import (
    FEATURES,
    filter_features,
    filter_init,
    functions,
    is_unwritten,
    replace_functions,
    source_of,
    stub_of,
)

MODES = ("reference", "skeleton", "student")


class StudentFileError(CourseError):
    """A student file that is not valid Python."""


@dataclass
class Fallback:
    """A symbol of an earlier chapter the student has not written: reference code stands in."""

    path: str
    symbol: str
    owner: int
    reason: str


@dataclass
class Snapshot:
    """A tree written to root/minisgl/, and where each of its files came from."""

    root: Path  # the directory holding minisgl/ (what goes on PYTHONPATH)
    # file -> "student", "reference", "skeleton" or "early"
    origins: dict[str, str] = field(default_factory=dict)
    fallbacks: list[Fallback] = field(default_factory=list)
    verbatim: set[str] = field(default_factory=set)  # student files copied without any change

    def student_location(self, path: str, line: int | None) -> str | None:
        """Where a line of a snapshot file is in the student's work/ tree ("file:line", or the
        file alone when fallbacks shifted its lines); None for files that are not the student's."""
        if self.origins.get(path) != "student":
            return None
        where = f"work/minisgl/{path}"
        return f"{where}:{line}" if line is not None and path in self.verbatim else where


def assemble_file(
    course: Course, path: str, k: int, mode: str, student: str | None = None
) -> tuple[str, list[Fallback]]:
    """The text of `path` in snapshot k, in mode "reference", "skeleton" or "student"."""
    ref_lines = course.reference(path).splitlines(keepends=True)
    ref_funcs = functions(ast.parse(course.reference(path)))
    mine = functions(ast.parse(student)) if student is not None else {}
    new_sources: dict[str, list[str]] = {}
    fallbacks: list[Fallback] = []
    for symbol, owner in course.stubs_in(path):
        node = ref_funcs[symbol][0]
        stub_here = mode == "skeleton" or mode == "student" and student is None
        if owner > k or owner == k and stub_here:
            early = owner > k and course.early_start(path, symbol) <= k
            new_sources[symbol] = (
                source_of(ref_lines, node)
                if early
                else stub_of(ref_lines, node, course.message(path, symbol, owner, k))
            )
        elif mode == "student" and owner < k:
            if student is None:
                reason = "no file in work/minisgl/"
            elif symbol not in mine:
                reason = "missing from your file"
            elif is_unwritten(mine[symbol][0]):
                reason = "not written yet"
            else:
                continue
            new_sources[symbol] = source_of(ref_lines, node)
            fallbacks.append(Fallback(path, symbol, owner, reason))
    text = replace_functions(course.reference(path) if student is None else student, new_sources)
    if path.endswith("__init__.py"):
        text = filter_init(text, path, course.files(k), set(course.file_owner))
    if path == FEATURES:
        text = filter_features(text, course.files(k))
    return text, fallbacks


def skeleton_text(course: Course, path: str, k: int) -> str:
    """`path` as the student starts it in chapter k (chapters/chNN_slug/skeleton/<path>)."""
    return assemble_file(course, path, k, "skeleton")[0]


def read_student_file(work: Path, path: str) -> str | None:
    """The student's <work>/<path> (work is a minisgl/ folder), or None; StudentFileError if it
    does not parse."""
    target = work / path
    if not target.is_file():
        return None
    text = target.read_text("utf-8")
    try:
        ast.parse(text)
    except SyntaxError as err:
        raise StudentFileError(f"work/minisgl/{path} line {err.lineno}: {err.msg}") from err
    return text


def build_snapshot(
    course: Course, k: int, mode: str, root: Path, work: Path | None = None
) -> Snapshot:
    """Write snapshot k to root/minisgl/ (replacing what was there). A student snapshot takes
    files of chapters <= k from the student's minisgl/ folder (default work/minisgl/) where
    they exist."""
    work = work or course.work
    assert mode in MODES, mode
    shutil.rmtree(root / "minisgl", ignore_errors=True)
    snapshot = Snapshot(root)
    for path in sorted(course.files(k)):
        owner = course.file_owner.get(path, NEVER)
        student = read_student_file(work, path) if mode == "student" and owner <= k else None
        text, fallbacks = assemble_file(course, path, k, mode, student)
        snapshot.fallbacks += fallbacks
        snapshot.origins[path] = (
            "early"
            if owner > k
            else "student"
            if student is not None
            else "skeleton"
            if mode == "student" and owner == k
            else "reference"
        )
        if student is not None and text == student:
            snapshot.verbatim.add(path)
        (root / "minisgl" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "minisgl" / path).write_text(text, "utf-8", newline="")
    return snapshot


def tree_of(course: Course, k: int) -> tuple[Tree, str]:
    """The file tree of snapshot k, marking new / modified / brought in early, and the
    "Files so far" line."""
    styles = {"new": "green", "modified": "yellow", "early": "blue"}
    tree = Tree(f"minisgl/  (snapshot {k}: {course.chapter(k).name})")
    folders: dict[str, Tree] = {"": tree}
    files = sorted(course.files(k), key=lambda p: p.split("/"))
    for path in files:
        folder, mark = posixpath.dirname(path), course.mark(path, k)
        if folder not in folders:
            parent = folders[posixpath.dirname(folder)]
            folders[folder] = parent.add(posixpath.basename(folder) + "/")
        label = posixpath.basename(path) + (f"  [{styles[mark]}]({mark})[/]" if mark else "")
        early = [
            s
            for s, owner in course.stubs_in(path)
            if owner > k and course.early_start(path, s) <= k and mark != "early"
        ]
        folders[folder].add(label + (f"  [blue](early: {', '.join(early)})[/]" if early else ""))
    counts = {mark: sum(course.mark(p, k) == mark for p in files) for mark in styles}
    return tree, (
        f"Files so far: {len(files)} ({counts['new']} new, {counts['modified']} "
        f"modified, {counts['early']} brought in early)"
    )


def render_tree(course: Course, k: int) -> str:
    """Plain text for the site: the "Files so far" line, then the tree (no colours)."""
    tree, counts = tree_of(course, k)
    plain = Console(file=io.StringIO(), width=120, color_system=None, highlight=False)
    plain.print(tree)
    return counts + "\n" + plain.file.getvalue()


def sync_skeletons(course: Course, write: bool) -> list[str]:
    """The stale files of chapters/*/skeleton/ (rewritten, or removed if no manifest lists
    them, when `write`)."""
    stale: list[str] = []
    for k, m in sorted(course.chapters.items()):
        folder = course.root / "chapters" / m.name / "skeleton"
        expected = {path: skeleton_text(course, path, k) for path in m.new + m.modified}
        existing = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        for path in sorted(existing | set(expected)):
            target = folder / path
            if path not in expected:
                stale.append(f"{target.relative_to(course.root)} (not in the manifest)")
                if write:
                    target.unlink()
            elif path not in existing or target.read_text("utf-8") != expected[path]:
                stale.append(str(target.relative_to(course.root)))
                if write:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(expected[path], "utf-8", newline="")
    return stale
