"""The chapter builder and judge of mini-sglang from Scratch (DESIGN §4-§5).

Student commands (they work on your tree in work/minisgl/ and never lose your code):
    python tools/steps.py list                 chapters and your status
    python tools/steps.py start K [--force]    copy chapter K's skeleton files into work/minisgl/
    python tools/steps.py test K [--strict]    run chapter K's main and tests on your tree
    python tools/steps.py tree K               the files of snapshot K: new / modified / early
Maintainer commands (CI):
    python tools/steps.py check [K] [--allow-missing]   reference passes, stubs fail every test
    python tools/steps.py sync [--check]                regenerate chapters/*/skeleton/

One mechanism serves every chapter. The reference engine in solutions/minisgl/ is the only
source; chapters/chNN_slug/chapter.toml says which files a chapter adds (`new`), which earlier
files it changes (`modified`), which function bodies the student writes (`stubs`) and which
later files or symbols its main needs as given code (`early`). A stub keeps the decorators,
signature and docstring; its body becomes `raise NotImplementedError("chNN: <task>")`, the task
being the docstring's first line. Snapshot K holds the files of chapters <= K plus early ones;
symbols of later chapters are stubbed ("written in chapter M: ...") unless brought in early.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import posixpath
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(__file__).resolve().parent
MAIN_TIMEOUT_S = 120  # one chapter main
TEST_TIMEOUT_S = 600  # one chapter's test file
NEVER = 10**9  # the chapter of something no chapter declares
FAILED = ("failed", "error")
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


# --- manifests ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """One chapters/chNN_slug/chapter.toml. Paths in new/modified/stubs/early are relative to
    solutions/minisgl/; docs, main and tests are relative to the repository root."""

    number: int
    slug: str
    title: str
    stage: int
    docs: str
    main: str
    tests: str
    new: list[str]
    modified: list[str]
    stubs: list[str]  # "path:function" or "path:Class.method"
    early: list[str]  # "path" (a whole file) or "path:Symbol"

    @property
    def name(self) -> str:
        return f"ch{self.number:02d}_{self.slug}"

    @classmethod
    def load(cls, path: Path) -> Manifest:
        data = tomllib.loads(path.read_text("utf-8"))
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


# --- code surgery: find functions, stub their bodies, filter __init__ imports ---------------------


def functions(tree: ast.Module) -> dict[str, list[FunctionNode]]:
    """Module functions and (nested) class methods by qualified name; a name has several nodes
    only when it is defined several times (a property setter, say)."""
    found: dict[str, list[FunctionNode]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.setdefault(prefix + node.name, []).append(node)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return found


def first_line(node: FunctionNode) -> int:
    """Where a function's source starts: its first decorator, or the def."""
    return min([d.lineno for d in node.decorator_list] + [node.lineno])


def has_docstring(node: FunctionNode) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str)


def task_of(node: FunctionNode, qualname: str) -> str:
    """What the student is asked to do: the first line of the docstring."""
    doc = (ast.get_docstring(node) or "").strip()
    return doc.splitlines()[0].strip() if doc else f"implement {qualname}"


def source_of(lines: list[str], node: FunctionNode) -> list[str]:
    return lines[first_line(node) - 1 : node.end_lineno]


def stub_of(lines: list[str], node: FunctionNode, message: str) -> list[str]:
    """The function's lines from decorators to docstring, then `raise NotImplementedError`."""
    body = node.body[0]
    indent = lines[body.lineno - 1][: body.col_offset]
    if indent.strip():
        raise ValueError(f"line {node.lineno}: {node.name}'s body shares a line with its def")
    keep_to = body.end_lineno if has_docstring(node) else body.lineno - 1
    literal = '"' + message.replace("\\", "\\\\").replace('"', '\\"') + '"'
    stub = f"{indent}raise NotImplementedError({literal})\n"
    return lines[first_line(node) - 1 : keep_to] + [stub]


def is_unwritten(node: FunctionNode) -> bool:
    """True when the body (after the docstring) is one `raise NotImplementedError...`."""
    body = node.body[1:] if has_docstring(node) else node.body
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def replace_functions(text: str, new_sources: dict[str, list[str]]) -> str:
    """Replace the whole source of each named function of `text` (names it lacks are ignored);
    every other line stays byte-identical."""
    lines = text.splitlines(keepends=True)
    found = functions(ast.parse(text))
    spans = [(first_line(found[q][0]), found[q][0].end_lineno, src)
             for q, src in new_sources.items() if q in found]
    for start, end, src in sorted(spans, key=lambda span: span[0], reverse=True):
        lines[start - 1 : end] = src
    return "".join(lines)


def filter_init(text: str, path: str, present: set[str]) -> str:
    """Drop the `from .x import ...` statements of an __init__.py whose module x is absent."""
    package = posixpath.dirname(path)
    lines = text.splitlines(keepends=True)
    for node in reversed(ast.parse(text).body):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            module = posixpath.join(package, *node.module.split("."))
            if not {f"{module}.py", f"{module}/__init__.py"} & present:
                del lines[node.lineno - 1 : node.end_lineno]
    return "".join(lines)


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


# --- the course: all manifests and the ownership they imply ---------------------------------------


@dataclass
class Course:
    """The manifests of one repository, and who owns which file and symbol."""

    root: Path
    chapters: dict[int, Manifest]
    file_owner: dict[str, int]  # file -> the chapter listing it under `new`
    stub_owner: dict[tuple[str, str], int]  # (file, symbol) -> the chapter stubbing it
    early: dict[str, int]  # "file" or "file:Symbol" -> the first chapter bringing it in early
    cache: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> Course:
        manifests = [Manifest.load(p) for p in sorted(root.glob("chapters/ch*/chapter.toml"))]
        course = cls(root, {m.number: m for m in manifests}, {}, {}, {})
        for k, m in sorted(course.chapters.items()):
            for path in m.new:
                course.file_owner.setdefault(path, k)
            for stub in m.stubs:
                course.stub_owner.setdefault(stub.partition(":")[::2], k)
            for item in m.early:
                course.early.setdefault(item, k)
        return course

    @property
    def work(self) -> Path:
        return self.root / "work" / "minisgl"

    def chapter(self, k: int) -> Manifest:
        if k not in self.chapters:
            sys.exit(f"no chapter {k}: the chapters are {sorted(self.chapters)}")
        return self.chapters[k]

    def reference(self, path: str) -> str:
        if path not in self.cache:
            self.cache[path] = (self.root / "solutions" / "minisgl" / path).read_text("utf-8")
        return self.cache[path]

    def files(self, k: int) -> set[str]:
        """The files of snapshot k: `new` in chapters <= k, and files brought in early."""
        early = {item for item, j in self.early.items() if j <= k and ":" not in item}
        return {path for path, j in self.file_owner.items() if j <= k} | early

    def mark(self, path: str, k: int) -> str:
        """How `path` shows in snapshot k: new, modified, early, or "" (an earlier file)."""
        m = self.chapters[k]
        if path in m.new or path in m.modified:
            return "new" if path in m.new else "modified"
        return "early" if self.file_owner.get(path, NEVER) > k else ""

    def stubs_in(self, path: str) -> list[tuple[str, int]]:
        return [(symbol, k) for (p, symbol), k in self.stub_owner.items() if p == path]

    def early_start(self, path: str, symbol: str) -> int:
        return min(self.early.get(path, NEVER), self.early.get(f"{path}:{symbol}", NEVER))

    def task(self, path: str, symbol: str) -> str:
        return task_of(functions(ast.parse(self.reference(path)))[symbol][0], symbol)

    def message(self, path: str, symbol: str, owner: int, k: int) -> str:
        """The NotImplementedError message of a stub in snapshot k."""
        task = self.task(path, symbol)
        return f"ch{owner:02d}: {task}" if owner == k else f"written in chapter {owner}: {task}"

    def problems(self) -> list[str]:
        """Everything inconsistent in the manifests, in words."""
        out: list[str] = []
        exists = lambda path: (self.root / "solutions" / "minisgl" / path).is_file()  # noqa: E731
        if sorted(self.chapters) != list(range(len(self.chapters))):
            out.append(f"chapters/: numbers must run 0, 1, 2, ...: {sorted(self.chapters)}")
        for k, m in sorted(self.chapters.items()):
            where = f"chapters/{m.name}/chapter.toml"
            out += [f"{where}: {p} does not exist in solutions/minisgl/" for p in
                    m.new + m.modified + [e.split(":")[0] for e in m.early] if not exists(p)]
            out += [f"{where}: {p} is new in chapter {self.file_owner[p]} already"
                    for p in m.new if self.file_owner[p] != k]
            out += [f"{where}: modified {p} must be new in an earlier chapter"
                    for p in m.modified if self.file_owner.get(p, NEVER) >= k]
            for stub in m.stubs:
                path, symbol = stub.partition(":")[::2]
                if self.stub_owner[(path, symbol)] != k or path not in m.new + m.modified:
                    out.append(f"{where}: {stub}: stubbed twice, or {path} not new/modified here")
                found = functions(ast.parse(self.reference(path))) if exists(path) else {}
                nodes = found.get(symbol, [])
                if len(nodes) != 1:
                    out.append(f"{where}: {stub} is defined {len(nodes)} times (need 1)")
                    continue
                try:
                    stub_of(self.reference(path).splitlines(True), nodes[0], "")
                except ValueError as err:
                    out.append(f"{where}: {stub}: {err}")
            for item in m.early:
                path, _, symbol = item.partition(":")
                owner = self.stub_owner.get((path, symbol)) if symbol else self.file_owner.get(path)
                if owner is None or owner <= k:
                    out.append(f"{where}: early {item} must be a file or stub of a later chapter")
                elif symbol and path not in self.files(k):
                    out.append(f"{where}: early {item}: {path} is not in snapshot {k}")
        return out


# --- snapshots ------------------------------------------------------------------------------------


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
    origins: dict[str, str]  # file -> "student", "reference", "skeleton" or "early"
    fallbacks: list[Fallback]


class StudentFileError(Exception):
    """A student file that is not valid Python."""


def assemble_file(course: Course, path: str, k: int, mode: str,
                  student: str | None = None) -> tuple[str, list[Fallback]]:
    """The text of `path` in snapshot k, in mode "reference", "skeleton" or "student".

    Symbols of chapters > k are reference code if brought in early, else stubs. Chapter k's
    are stubs in a skeleton. A student's text is the base of a student snapshot: chapter k's
    symbols are theirs (stubs without a file), unwritten ones of chapters < k fall back."""
    ref_lines = course.reference(path).splitlines(keepends=True)
    ref_funcs = functions(ast.parse(course.reference(path)))
    mine = functions(ast.parse(student)) if student is not None else {}
    new_sources: dict[str, list[str]] = {}
    fallbacks: list[Fallback] = []
    for symbol, owner in course.stubs_in(path):
        node = ref_funcs[symbol][0]
        stub_here = mode == "skeleton" or mode == "student" and student is None
        if owner > k or owner == k and stub_here:
            message = course.message(path, symbol, owner, k)
            early = owner > k and course.early_start(path, symbol) <= k
            new_sources[symbol] = (source_of(ref_lines, node) if early
                                   else stub_of(ref_lines, node, message))
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
        text = filter_init(text, path, course.files(k))
    return text, fallbacks


def skeleton_text(course: Course, path: str, k: int) -> str:
    """`path` as the student starts it in chapter k (chapters/chNN_slug/skeleton/<path>)."""
    return assemble_file(course, path, k, "skeleton")[0]


def build_snapshot(course: Course, k: int, mode: str, root: Path) -> Snapshot:
    """Write snapshot k to root/minisgl/ (replacing what was there). A student snapshot takes
    files of chapters <= k from work/minisgl/ where they exist."""
    shutil.rmtree(root / "minisgl", ignore_errors=True)
    snapshot = Snapshot(root, {}, [])
    for path in sorted(course.files(k)):
        owner, student = course.file_owner.get(path, NEVER), None
        if mode == "student" and owner <= k and (course.work / path).is_file():
            student = (course.work / path).read_text("utf-8")
            try:
                ast.parse(student)
            except SyntaxError as err:
                raise StudentFileError(f"work/minisgl/{path} line {err.lineno}: {err.msg}") from err
        text, fallbacks = assemble_file(course, path, k, mode, student)
        snapshot.fallbacks += fallbacks
        snapshot.origins[path] = ("early" if owner > k else "student" if student is not None else
                                  "skeleton" if mode == "student" and owner == k else "reference")
        (root / "minisgl" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "minisgl" / path).write_text(text, "utf-8", newline="")
    return snapshot


# --- running mains and tests in subprocesses ------------------------------------------------------


@dataclass
class TestCase:
    name: str
    outcome: str  # "passed", "failed", "error" or "skipped"
    message: str = ""


@dataclass
class Run:
    """One subprocess: a chapter main, or one chapter's test file."""

    label: str
    seconds: float
    verdict: str  # "passed", or why not
    output: str = ""  # a main's stdout
    tests: list[TestCase] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict == "passed"


def run_process(cmd: list[str], cwd: Path, env: dict[str, str],
                timeout: float) -> tuple[int | None, str, str, float]:
    """Run cmd in its own process group, killed whole at the timeout (then rc is None)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err, time.monotonic() - start
    return proc.returncode, out, err, time.monotonic() - start


def tree_env(root: Path, jobs: int) -> dict[str, str]:
    """Only the snapshot's minisgl is importable (tests/conftest.py and run_main.py check it).
    Torch slows down badly when its threads outnumber free cores (chapter 0's tests on a busy
    2-core machine: 8 s with 1 thread, 15-80 s with 2), so each of `jobs` concurrent runs
    gets cores / (2 * jobs) threads, at least one, unless OMP_NUM_THREADS is set."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // (2 * jobs)))
    return dict(os.environ, PYTHONPATH=str(root), MINISGL_TREE=str(root), OMP_NUM_THREADS=threads,
                PYTHONDONTWRITEBYTECODE="1", TQDM_DISABLE="1")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def clean_output(text: str) -> str:
    """stdout without progress-bar redraws (\\r) and terminal colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    return "".join(line.rsplit("\r", 1)[-1].rstrip() + "\n" for line in text.splitlines())


def run_main(course: Course, main: str, root: Path, timeout: float, jobs: int = 1) -> Run:
    """Run a main (examples/...py) through tools/run_main.py, which prints a secret token when
    the main ends: a tree that exits early with status 0 (os._exit(0) at import) does not pass."""
    token = secrets.token_hex(8)
    env = dict(tree_env(root, jobs), MINISGL_RUN_TOKEN=token)
    cmd = [sys.executable, str(TOOLS / "run_main.py"), str(course.root / main)]
    rc, out, err, seconds = run_process(cmd, course.root, env, timeout)
    if rc is None:
        verdict = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        verdict = f"crashed (exit {rc}): {last_line(err or out)}"
    else:
        verdict = "passed" if f"run_main: finished {token}" in err else "exited before its end"
    return Run(main, seconds, verdict, clean_output(out))


def parse_junit(path: Path) -> list[TestCase]:
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "failed" if child.tag == "failure" else child.tag
                message = child.get("message") or last_line(child.text or "")
                break
        cases.append(TestCase(case.get("name", "?"), outcome, message))
    return cases


def run_tests(course: Course, tests: str, root: Path, timeout: float, jobs: int = 1) -> Run:
    """Run one test file with pytest on the tree at root; results come from its junit XML."""
    junit = root / f"junit-{Path(tests).stem}.xml"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", tests, "-q", "-p", "no:cacheprovider", "--tb=short",
           f"--junitxml={junit}"]
    rc, out, err, seconds = run_process(cmd, course.root, tree_env(root, jobs), timeout)
    cases = parse_junit(junit) if rc is not None and junit.is_file() else []
    bad = [c for c in cases if c.outcome in FAILED]
    if rc is None:
        verdict = f"timed out after {timeout:.0f} s"
    elif not cases:
        verdict = f"no test report (pytest exit {rc}): {last_line(err or out)}"
    elif bad:
        verdict = f"{len(bad)} of {len(cases)} failed"
    else:
        verdict = "passed" if rc == 0 else f"pytest exit {rc}: {last_line(out + err)}"
    return Run(tests, seconds, verdict, tests=cases)


def hint(course: Course, message: str) -> str:
    """What a failure message asks the student to do."""
    found = re.search(r"NotImplementedError: (ch\d\d: .*)", message)
    if found:
        for (path, symbol), owner in course.stub_owner.items():
            if course.message(path, symbol, owner, owner) == found.group(1).strip():
                return f"write {symbol} in work/minisgl/{path} (chapter {owner})"
        return "a stub still raises NotImplementedError: write it"
    found = re.search(r"written in chapter (\d+)", message)
    if found:
        return f"this reached chapter {found.group(1)}'s code, stubbed in this snapshot: report it"
    if message.startswith("timed out"):
        return ("look for a loop that never ends; on a slow or busy machine, "
                "raise --main-timeout / --test-timeout")
    return "read the message above, then rerun the failing test alone"


def edited_test_files(course: Course, paths: list[str]) -> list[str]:
    """The test files that differ from their committed version (in a git checkout)."""
    if not (course.root / ".git").exists():
        return []
    edited = []
    for path in paths:
        committed = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=course.root,
                                   capture_output=True)
        if committed.returncode == 0 and committed.stdout != (course.root / path).read_bytes():
            edited.append(path)
    return edited


def show(run: Run) -> None:
    style = "green" if run.ok else "red"
    console.print(f"[{style}]{'PASS' if run.ok else 'FAIL'}[/] {run.label} ({run.seconds:.1f} s): "
                  f"{escape(run.verdict)}")
    for case in run.tests:
        style = "red" if case.outcome in FAILED else "green"
        console.print(f"    [{style}]{case.outcome:7}[/] {escape(case.name)}")


# --- progress: work/.progress.json ----------------------------------------------------------------


def load_progress(course: Course) -> dict:
    path = course.root / "work" / ".progress.json"
    return json.loads(path.read_text("utf-8")) if path.is_file() else {"chapters": {}, "files": {}}


def save_progress(course: Course, progress: dict) -> None:
    path = course.root / "work" / ".progress.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(progress, indent=2, sort_keys=True) + "\n", "utf-8")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- student commands -----------------------------------------------------------------------------


def cmd_list(course: Course) -> int:
    """Chapters with the student's status."""
    progress = load_progress(course)["chapters"]
    styles = {"passed": "green", "in progress": "yellow", "not started": "dim"}
    table = Table("ch", "chapter", "title", "status")
    for k, m in sorted(course.chapters.items()):
        status = progress.get(str(k), {}).get("status", "not started")
        status = "in progress" if status == "failed" else status
        table.add_row(str(k), m.name, escape(m.title), f"[{styles[status]}]{status}[/]")
    console.print(table)
    return 0


def merge_modified(course: Course, path: str, k: int, mine: str,
                   skeleton: str) -> tuple[str, list[str]]:
    """The student's earlier file updated for chapter k, keeping everything they wrote:
    chapter k's symbols become stubs unless the student wrote them already; an __init__.py
    gains the skeleton's import lines it lacks."""
    lines = mine.splitlines(keepends=True)
    if path.endswith("__init__.py"):
        have = {line.strip() for line in lines}
        add = [line for line in skeleton.splitlines(keepends=True)
               if line.startswith("from .") and line.strip() not in have]
        imports = [n.end_lineno for n in ast.parse(mine).body
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
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


def is_pristine(course: Course, path: str, text: str, progress: dict) -> bool:
    """True when `text` is a skeleton we handed out that the student has not changed."""
    return progress["files"].get(path) == sha(text) or any(
        text == skeleton_text(course, path, j) for j, m in course.chapters.items()
        if path in m.new + m.modified)


def cmd_start(course: Course, k: int, force: bool) -> int:
    """Copy chapter k's skeleton files into work/minisgl/ without losing student code."""
    m, progress = course.chapter(k), load_progress(course)
    plan: list[tuple[str, str, str]] = []  # (path, what happens, new text)
    conflicts: list[str] = []
    for path in m.new + m.modified:
        new, target = skeleton_text(course, path, k), course.work / path
        mine = target.read_text("utf-8") if target.is_file() else None
        if mine is None or mine == new or is_pristine(course, path, mine, progress):
            plan.append((path, "created" if mine is None else "up to date" if mine == new else
                         "updated", new))
        elif path in m.modified and parses(mine):
            merged, notes = merge_modified(course, path, k, mine, new)
            plan.append((path, "; ".join(["merged with your code (backup kept)", *notes]), merged))
        elif force:
            plan.append((path, "replaced (backup kept)", new))
        else:
            conflicts.append(path)
    if conflicts:
        for path in conflicts:
            console.print(f"[red]refused:[/] work/minisgl/{path} has your changes")
        console.print("Nothing was written. With --force these files are replaced, "
                      "and a backup of each is kept next to it.")
        return 1
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for path, what, text in plan:
        target = course.work / path
        if "backup" in what:
            shutil.copy2(target, target.with_name(f"{target.name}.bak-{stamp}"))
            what += f" -> {target.name}.bak-{stamp}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, "utf-8", newline="")
        progress["files"][path] = sha(text)
        console.print(f"  work/minisgl/{path}: {escape(what)}")
    entry = progress["chapters"].setdefault(str(k), {})
    entry["status"] = "passed" if entry.get("status") == "passed" else "in progress"
    save_progress(course, progress)
    table = Table("write", "in", "task", title=f"Chapter {k}: {escape(m.title)}")
    for stub in m.stubs:
        path, symbol = stub.split(":", 1)
        table.add_row(symbol, f"work/minisgl/{path}", escape(course.task(path, symbol)))
    console.print(table)
    console.print(f"Read: {m.docs}\nThen: python tools/steps.py test {k}")
    return 0


def cmd_test(course: Course, k: int, strict: bool, main_timeout: float, test_timeout: float) -> int:
    """Assemble snapshot k from the student's tree, run main and tests, report, record."""
    m, progress = course.chapter(k), load_progress(course)
    root = course.root / "build" / "student" / f"{k:02d}"
    chapters = [course.chapters[j] for j in range(k, -1, -1)]

    def verdict(ok: bool, why: str) -> int:
        progress["chapters"][str(k)] = {"status": "passed" if ok else "failed", "strict": strict,
                                        "when": datetime.now().isoformat(timespec="seconds")}
        save_progress(course, progress)
        style = "bold green" if ok else "bold red"
        console.print(f"[{style}]chapter {k} {'PASSED' if ok else 'FAILED'}[/]: {escape(why)}")
        return 0 if ok else 1

    try:
        snap = build_snapshot(course, k, "student", root)
    except StudentFileError as err:
        return verdict(False, f"{err} (fix this syntax error first)")
    table = Table("file", "from", title=f"Snapshot {k} in {root.relative_to(course.root)}")
    for path, origin in snap.origins.items():
        table.add_row(f"minisgl/{path}", origin)
    console.print(table)
    if snap.fallbacks:
        table = Table("chapter", "symbol", "file", "why", title="Reference code used for")
        for f in snap.fallbacks:
            table.add_row(str(f.owner), f.symbol, f.path, f.reason)
        console.print(table)
        if strict:
            return verdict(False, f"--strict: {len(snap.fallbacks)} symbols of chapters <= {k} "
                                  "are not yours yet")
    missing = [p for p in [m.main] + [c.tests for c in chapters] if not (course.root / p).is_file()]
    if missing:
        return verdict(False, f"missing in this checkout: {', '.join(missing)}")
    edited = edited_test_files(course, [c.tests for c in chapters])
    if edited:
        return verdict(False, f"{', '.join(edited)} differ from the committed version "
                              "(restore with `git checkout -- <file>`)")
    runs = [run_main(course, m.main, root, main_timeout)]
    runs += [run_tests(course, c.tests, root, test_timeout) for c in chapters]
    for run in runs:
        show(run)
    failed = [run for run in runs if not run.ok]
    if not failed:
        return verdict(True, f"the main and the tests of chapters {k}..0 pass")
    # The first failing test says most (an assertion); else the first failed run (a crash).
    cases = [(run, case) for run in runs for case in run.tests if case.outcome in FAILED]
    run, case = cases[0] if cases else (failed[0], None)
    message = case.message if case else run.verdict
    where = run.label + (f"::{case.name}" if case else "")
    console.print(f"\n[bold]First failure:[/] {escape(where)}")
    console.print("  " + escape("\n  ".join(message.splitlines()[:8])))
    console.print(f"[bold]Hint:[/] {escape(hint(course, message))}")
    rel = root.relative_to(course.root)
    again = (f"python tools/run_main.py {run.label}" if run.label == m.main else
             f"python -m pytest '{run.label}" + (f"::{case.name}'" if case else "'"))
    console.print(f"Rerun: MINISGL_TREE={rel} PYTHONPATH={rel} {escape(again)}", soft_wrap=True)
    return verdict(False, f"{len(failed)} of {len(runs)} runs failed")


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
        early = [s for s, owner in course.stubs_in(path)
                 if owner > k and course.early_start(path, s) <= k and mark != "early"]
        folders[folder].add(label + (f"  [blue](early: {', '.join(early)})[/]" if early else ""))
    counts = {mark: sum(course.mark(p, k) == mark for p in files) for mark in styles}
    return tree, (f"Files so far: {len(files)} ({counts['new']} new, {counts['modified']} "
                  f"modified, {counts['early']} brought in early)")


def cmd_tree(course: Course, k: int) -> int:
    tree, counts = tree_of(course, k)
    console.print(tree)
    console.print(counts)
    return 0


def render_tree(k: int, root: Path = ROOT) -> str:
    """Plain text for the site: the "Files so far" line, then the tree (no colours)."""
    tree, counts = tree_of(Course.load(root), k)
    plain = Console(file=io.StringIO(), width=120, color_system=None, highlight=False)
    plain.print(tree)
    return counts + "\n" + plain.file.getvalue()


# --- maintainer commands --------------------------------------------------------------------------


def check_chapter(course: Course, m: Manifest,
                  args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """The reference snapshot passes the main and the tests, the skeleton snapshot fails every
    test, and the main's stdout goes to docs/_outputs/. Returns (a table row, problems, notes)."""
    k, start = m.number, time.monotonic()
    build = course.root / "build" / "steps"
    ref = build_snapshot(course, k, "reference", build / f"{k:02d}")
    skel = build_snapshot(course, k, "skeleton", build / f"{k:02d}-skeleton")
    # The last chapter of a stage also runs the stage's milestone: the stage page reads it.
    milestone = f"examples/stage{m.stage}_milestone.py"
    last_of_stage = k == max(j for j, c in course.chapters.items() if c.stage == m.stage)
    mains = [m.main] + ([milestone] if last_of_stage and (course.root / milestone).is_file() else [])
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(run_tests, course, m.tests, ref.root, args.test_timeout, args.jobs),
                pool.submit(run_tests, course, m.tests, skel.root, args.test_timeout, args.jobs)]
        jobs += [pool.submit(run_main, course, path, ref.root, args.main_timeout, args.jobs)
                 for path in mains]
        ref_tests, skel_tests, *main_runs = (job.result() for job in jobs)
    problems = []
    for run in main_runs:
        if run.ok:
            output = course.root / "docs" / "_outputs" / f"{Path(run.label).stem}.txt"
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(run.output, "utf-8")
        else:
            problems.append(f"reference main {run.label}: {run.verdict}")
    main = main_runs[0]
    if not ref_tests.ok:
        failed = ", ".join(c.name for c in ref_tests.tests if c.outcome in FAILED)
        problems.append(f"reference tests: {ref_tests.verdict} {failed}")
    vacuous = [c.name for c in skel_tests.tests if c.outcome not in FAILED]
    if vacuous:
        problems.append(f"tests that do not fail on the stubs: {', '.join(vacuous)}")
    unseen = sorted({c.name for c in ref_tests.tests} - {c.name for c in skel_tests.tests})
    if unseen or not skel_tests.tests:
        problems.append(f"skeleton tests: {skel_tests.verdict}; never ran on the stubs: "
                        + (", ".join(unseen[:5]) + (" ..." if len(unseen) > 5 else "") or "all"))
    notes = [f"not run on the reference: {c.name}: {c.message}"
             for c in ref_tests.tests if c.outcome == "skipped"]
    skel_failed = sum(c.outcome in FAILED for c in skel_tests.tests)
    row = [m.name, f"{'ok' if main.ok else 'FAIL'} ({main.seconds:.0f} s)",
           f"{sum(c.outcome == 'passed' for c in ref_tests.tests)}/{len(ref_tests.tests)} pass "
           f"({ref_tests.seconds:.0f} s)",
           f"{skel_failed}/{len(skel_tests.tests)} fail ({skel_tests.seconds:.0f} s)",
           f"{time.monotonic() - start:.0f} s"]
    return row, problems, notes


def cmd_check(course: Course, args: argparse.Namespace) -> int:
    """Check one chapter or all of them: the maintainer's proof that every chapter works."""
    numbers = [args.chapter] if args.chapter is not None else sorted(course.chapters)
    table = Table("chapter", "reference main", "reference tests", "skeleton tests", "time",
                  "verdict")
    failures, start = 0, time.monotonic()
    for k in numbers:
        m = course.chapter(k)
        missing = [p for p in (m.main, m.tests) if not (course.root / p).is_file()]
        if missing:
            failures += not args.allow_missing
            verdict = "skipped" if args.allow_missing else "[red]missing[/]"
            table.add_row(m.name, "", "", "", "", f"{verdict}: {', '.join(missing)}")
            console.print(f"{m.name}: missing {', '.join(missing)}")
            continue
        row, problems, notes = check_chapter(course, m, args)
        failures += bool(problems)
        table.add_row(*row, "[red]FAIL[/]" if problems else "[green]ok[/]")
        console.print(f"{m.name}: {'FAIL' if problems else 'ok'} ({row[-1]})")
        for problem in problems:
            console.print(f"  [red]-[/] {escape(problem)}")
        for note in notes:
            console.print(f"  [yellow]note:[/] {escape(note)}")
    console.print(table)
    console.print(f"{len(numbers)} chapters checked in {time.monotonic() - start:.0f} s, "
                  f"{failures} failing")
    return 1 if failures else 0


def cmd_sync(course: Course, check: bool) -> int:
    """Regenerate chapters/*/skeleton/; with --check only name the stale files."""
    stale: list[str] = []
    for k, m in sorted(course.chapters.items()):
        folder = course.root / "chapters" / m.name / "skeleton"
        expected = {path: skeleton_text(course, path, k) for path in m.new + m.modified}
        existing = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
        for path in sorted(existing | set(expected)):
            target = folder / path
            if path not in expected:
                stale.append(f"{target.relative_to(course.root)} (not in the manifest)")
                if not check:
                    target.unlink()
            elif path not in existing or target.read_text("utf-8") != expected[path]:
                stale.append(str(target.relative_to(course.root)))
                if not check:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(expected[path], "utf-8", newline="")
    for line in stale:
        console.print(f"  {'stale' if check else 'wrote'}: {line}")
    if check and stale:
        console.print(f"[red]{len(stale)} stale skeleton files:[/] run python tools/steps.py sync")
        return 1
    console.print(f"skeletons of {len(course.chapters)} chapters: "
                  + ("up to date" if check else f"{len(stale)} files written"))
    return 0


# --- command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    intro, usage = __doc__.split("\n\n")[:2]
    parser = argparse.ArgumentParser(description=intro, epilog=usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the course repository")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="chapters and your status")
    start = sub.add_parser("start", help="copy chapter K's skeleton files into work/minisgl/")
    start.add_argument("chapter", type=int)
    start.add_argument("--force", action="store_true", help="replace changed files (backed up)")
    test = sub.add_parser("test", help="run chapter K's main and tests on your tree")
    test.add_argument("chapter", type=int)
    test.add_argument("--strict", action="store_true", help="no reference code for chapters < K")
    check = sub.add_parser("check", help="maintainer: reference passes, stubs fail every test")
    check.add_argument("chapter", type=int, nargs="?")
    check.add_argument("--allow-missing", action="store_true", help="skip missing main/tests")
    check.add_argument("--jobs", type=int, default=3, help="concurrent runs per chapter")
    for p in (test, check):
        p.add_argument("--main-timeout", type=float, default=MAIN_TIMEOUT_S, help="seconds")
        p.add_argument("--test-timeout", type=float, default=TEST_TIMEOUT_S, help="seconds a file")
    sub.add_parser("tree", help="the files of snapshot K").add_argument("chapter", type=int)
    sync = sub.add_parser("sync", help="regenerate chapters/*/skeleton/")
    sync.add_argument("--check", action="store_true", help="only name stale files")
    args = parser.parse_args(argv)

    course = Course.load(args.root.resolve())
    problems = course.problems()
    if problems:
        console.print("[red]The chapter manifests are inconsistent:[/]")
        for problem in problems:
            console.print(f"  - {escape(problem)}")
        return 2
    if args.command == "list":
        return cmd_list(course)
    if args.command == "start":
        return cmd_start(course, args.chapter, args.force)
    if args.command == "test":
        return cmd_test(course, args.chapter, args.strict, args.main_timeout, args.test_timeout)
    if args.command == "tree":
        return cmd_tree(course, args.chapter)
    if args.command == "check":
        return cmd_check(course, args)
    return cmd_sync(course, args.check)


if __name__ == "__main__":
    sys.exit(main())
