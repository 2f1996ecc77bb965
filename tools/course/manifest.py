"""The chapter manifests (chapters/chNN_slug/chapter.toml) and the ownership they imply.

A manifest names its chapter's `new` files, the earlier files it `modified`, the `stubs` the
student writes (`path:function` or `path:Class.method`), the later files or symbols its main
needs as given code (`early`) and, optionally, the `gpu_tests` that judge the chapter on a GPU
(`tests/test_gpu_x.py` or `tests/test_gpu_x.py::test_name`) and the Python modules it `needs`
that some platforms lack. Paths in the first four lists are
relative to solutions/minisgl/; `docs`, `main`, `tests` and `gpu_tests` are relative to the
repository root. Nothing else in the repository lists the chapters: every tool discovers them
here.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from course.errors import CourseError
from course.paths import STUDENT_TREE
from course.source import functions, stub_of, task_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

NEVER = 10**9  # the chapter of something no chapter declares
# How to get a module a manifest `needs`, where the platform lacks it.
WHERE_TO_GET = {
    "triton": "Triton publishes wheels for Linux only: judge this chapter on Linux, in WSL or "
    "in a Linux container, where ./run installs it",
}
ENGINE = Path("solutions") / "minisgl"


@dataclass(frozen=True)
class Manifest:
    number: int
    slug: str
    title: str
    stage: int
    docs: str
    main: str
    tests: str
    new: list[str]
    modified: list[str]
    stubs: list[str]
    early: list[str]
    gpu_tests: list[str] = field(default_factory=list)  # run after the others where CUDA is
    # Python modules the chapter's tests and main import that some platforms cannot install
    # (Triton has wheels for Linux only): where one is missing, the judge says so by name.
    needs: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"ch{self.number:02d}_{self.slug}"

    @property
    def missing_modules(self) -> list[str]:
        """The modules of `needs` that this interpreter (the judge's, which runs the tests)
        cannot import."""
        return [name for name in self.needs if importlib.util.find_spec(name) is None]

    @property
    def why_not_here(self) -> str:
        """Why this machine cannot judge the chapter ("" when it can)."""
        missing = self.missing_modules
        if not missing:
            return ""
        hints = [WHERE_TO_GET.get(name, f"pip install {name}") for name in missing]
        return (
            f"chapter {self.number} needs {', '.join(missing)}, which is not installed here "
            f"({'; '.join(hints)}); the chapters that do not need it run as usual"
        )

    @classmethod
    def load(cls, path: Path) -> Manifest:
        optional = {f.name for f in fields(cls) if f.default_factory is not MISSING}
        try:
            data = tomllib.loads(path.read_text("utf-8"))
            given = [
                name for name in cls.__dataclass_fields__ if name in data or name not in optional
            ]
            return cls(**{name: data[name] for name in given})  # a required one missing: KeyError
        except (tomllib.TOMLDecodeError, KeyError, TypeError) as error:
            raise CourseError(f"{path}: not a valid chapter manifest ({error})") from None


@dataclass
class Course:
    """The manifests of one repository, and who owns which file and symbol."""

    root: Path
    chapters: dict[int, Manifest]
    file_owner: dict[str, int] = field(default_factory=dict)  # file -> chapter listing it `new`
    stub_owner: dict[tuple[str, str], int] = field(default_factory=dict)  # (file, symbol) -> ch
    early: dict[str, int] = field(default_factory=dict)  # "file" or "file:Symbol" -> first ch
    _reference: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, root: Path) -> Course:
        manifests = [Manifest.load(p) for p in sorted(root.glob("chapters/ch*/chapter.toml"))]
        course = cls(root, {m.number: m for m in manifests})
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
        """The student's engine tree."""
        return self.root / STUDENT_TREE

    @property
    def stages(self) -> dict[int, list[int]]:
        """Stage -> its chapters, in order."""
        stages: dict[int, list[int]] = {}
        for k, m in sorted(self.chapters.items()):
            stages.setdefault(m.stage, []).append(k)
        return stages

    def chapter(self, k: int) -> Manifest:
        if k not in self.chapters:
            raise CourseError(
                f"no chapter {k}: the chapters are {min(self.chapters)}-{max(self.chapters)}"
            )
        return self.chapters[k]

    def chapter_of_page(self, page: str) -> Manifest | None:
        """The chapter whose docs page is `page` (a path under docs/, e.g. chapters/ch08_x.md)."""
        return next((m for m in self.chapters.values() if m.docs == f"docs/{page}"), None)

    def reference(self, path: str) -> str:
        if path not in self._reference:
            self._reference[path] = (self.root / ENGINE / path).read_text("utf-8")
        return self._reference[path]

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

    def inconsistencies(self) -> list[str]:
        """Everything inconsistent in the manifests, in words."""
        out: list[str] = []
        exists = lambda path: (self.root / ENGINE / path).is_file()  # noqa: E731
        if self.chapters and min(self.chapters) != 0:
            out.append(f"chapters/: the first chapter must be 0: {sorted(self.chapters)}")
        for k, m in sorted(self.chapters.items()):
            where = f"chapters/{m.name}/chapter.toml"
            out += [
                f"{where}: {p} does not exist in solutions/minisgl/"
                for p in m.new + m.modified + [e.split(":")[0] for e in m.early]
                if not exists(p)
            ]
            out += [
                f"{where}: {p} is new in chapter {self.file_owner[p]} already"
                for p in m.new
                if self.file_owner[p] != k
            ]
            out += [
                f"{where}: modified {p} must be new in an earlier chapter"
                for p in m.modified
                if self.file_owner.get(p, NEVER) >= k
            ]
            for stub in m.stubs:
                out += self._stub_problems(where, k, m, stub, exists)
            for item in m.early:
                path, _, symbol = item.partition(":")
                owner = self.stub_owner.get((path, symbol)) if symbol else self.file_owner.get(path)
                if owner is None or owner <= k:
                    out.append(f"{where}: early {item} must be a file or stub of a later chapter")
                elif symbol and path not in self.files(k):
                    out.append(f"{where}: early {item}: {path} is not in snapshot {k}")
            out += [
                f"{where}: gpu_tests: {why}"
                for why in map(self._gpu_test_problem, m.gpu_tests)
                if why
            ]
        return out

    def _gpu_test_problem(self, test: str) -> str | None:
        """What is wrong with a `gpu_tests` entry: a test file under tests/, or one test of it
        (`file::function`, `file::Class::method`; a parametrized id's `[...]` is ignored)."""
        path, *names = test.split("::")
        file = self.root / path
        if not (path.startswith("tests/test_") and path.endswith(".py") and file.is_file()):
            return f"{path} is not a test file under tests/"
        if names:
            defined = functions(ast.parse(file.read_text("utf-8")))
            name = ".".join(names).split("[")[0]
            if not name.rsplit(".", 1)[-1].startswith("test") or name not in defined:
                return f"{test}: no such test in {path}"
        return None

    def _stub_problems(self, where: str, k: int, m: Manifest, stub: str, exists) -> list[str]:
        path, symbol = stub.partition(":")[::2]
        out = []
        if self.stub_owner[(path, symbol)] != k or path not in m.new + m.modified:
            out.append(f"{where}: {stub}: stubbed twice, or {path} not new/modified here")
        nodes = functions(ast.parse(self.reference(path))).get(symbol, []) if exists(path) else []
        if len(nodes) != 1:
            return out + [f"{where}: {stub} is defined {len(nodes)} times (need 1)"]
        try:
            stub_of(self.reference(path).splitlines(True), nodes[0], "")
        except CourseError as error:
            out.append(f"{where}: {stub}: {error}")
        return out

    def check(self) -> Course:
        """Raise CourseError listing every inconsistency of the manifests; return self."""
        problems = self.inconsistencies()
        if problems:
            raise CourseError(
                "the chapter manifests are inconsistent:\n  - " + "\n  - ".join(problems)
            )
        return self
