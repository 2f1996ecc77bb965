"""Practice problems: practice/problems/<slug>/ folders (practice/README.md has the format).

A problem is problem.md (front matter, statement, `## Hint`, `## Explanation`), starter.py,
solution.py and test.py, whose `test_example*` functions are the samples shown to the student.

Where the answer is the engine's own code, solution.py does not copy it: the function keeps its
signature and docstring, and its body is one comment naming the reference function whose body
it is (REFERENCE_BODY); `solution_source` puts that body in, so the two cannot drift.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from course.errors import CourseError
from course.manifest import ENGINE, Course
from course.paths import PYTHON, ROOT
from course.source import (
    body_span,
    definitions,
    derive_starter,
    find_definition,
    functions,
    stub_raise,
)

DIFFICULTIES = ("easy", "medium", "hard")
ENVS = ("browser", "torch", "cuda")  # browser: standard library only (runs in Pyodide too)
TIMEOUTS = {"browser": 20, "torch": 120, "cuda": 300}  # seconds for a whole test run
FRONT_MATTER_KEYS = ("number", "title", "chapter", "difficulty", "env")
PROBLEM_FILES = ("problem.md", "starter.py", "solution.py", "test.py")
SAMPLE_PREFIX = "test_example"
# A solution function's whole body, below its docstring, that is the body of a function of the
# reference engine:    # reference body: scheduler/decode.py:DecodeManager.filter_reqs
REFERENCE_BODY = re.compile(
    r"^(?P<indent>[ \t]+)# reference body: (?P<path>[\w/]+\.py):(?P<qualname>[\w.]+)[ \t]*$",
    re.MULTILINE,
)


class ProblemError(CourseError):
    """A problem folder that does not follow the format."""


@dataclass(frozen=True)
class Problem:
    number: int  # stable id: chapter * 10 + i, i = 1..9
    slug: str  # the folder name
    title: str
    chapter: int
    difficulty: str
    env: str
    path: Path

    @property
    def body(self) -> str:
        """problem.md without its front matter."""
        return split_front_matter((self.path / "problem.md").read_text("utf-8"))[1]

    @property
    def statement(self) -> str:
        """What the student reads first: the body without the Hint and Explanation sections."""
        return "".join(
            text
            for name, text in markdown_sections(self.body)
            if name not in ("hint", "explanation")
        )

    @property
    def hint(self) -> str:
        return section_text(self.body, "hint")

    @property
    def explanation(self) -> str:
        return section_text(self.body, "explanation")

    @property
    def workspace_name(self) -> str:
        return f"{self.number:03d}_{self.slug}.py"

    @property
    def sample_names(self) -> list[str]:
        """The sample tests (functions named test_example*) of test.py."""
        text = (self.path / "test.py").read_text("utf-8")
        return re.findall(rf"^def ({SAMPLE_PREFIX}\w*)\(", text, flags=re.MULTILINE)


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    """Split `---\\nkey: value\\n...\\n---\\nbody` into ({key: value}, body)."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ProblemError("problem.md must start with a `---` line (front matter)")
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise ProblemError("problem.md: the front matter has no closing `---` line")
    meta: dict[str, str] = {}
    for line in lines[1:end]:
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ProblemError(
                f"problem.md: front matter line {line.strip()!r} is not `key: value`"
            )
        meta[key.strip()] = value.strip()
    return meta, "".join(lines[end + 1 :]).lstrip("\n")


def markdown_sections(body: str) -> list[tuple[str, str]]:
    """Split a Markdown body at its `## ` headings: [(lower-case heading or "", text), ...]."""
    sections: list[tuple[str, str]] = [("", "")]
    for line in body.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append((line[3:].strip().lower(), line))
        else:
            name, text = sections[-1]
            sections[-1] = (name, text + line)
    return sections


def section_text(body: str, name: str) -> str:
    """The text of the `## <name>` section, without its heading ("" if absent)."""
    for heading, text in markdown_sections(body):
        if heading == name:
            return text.split("\n", 1)[1].strip() if "\n" in text else ""
    return ""


def parse_problem(folder: Path, chapters: set[int]) -> Problem:
    """Read and validate one problem folder; ProblemError names what is wrong."""
    missing = [name for name in PROBLEM_FILES if not (folder / name).is_file()]
    if missing:
        raise ProblemError(f"{folder.name}: missing {', '.join(missing)}")
    meta, body = split_front_matter((folder / "problem.md").read_text("utf-8"))
    absent = [key for key in FRONT_MATTER_KEYS if not meta.get(key)]
    if absent:
        raise ProblemError(f"{folder.name}: front matter lacks {', '.join(absent)}")
    try:
        number, chapter = int(meta["number"]), int(meta["chapter"])
    except ValueError:
        raise ProblemError(f"{folder.name}: number and chapter must be integers") from None
    if chapter not in chapters:
        raise ProblemError(
            f"{folder.name}: chapter {chapter} is not a chapter of the course "
            f"({min(chapters)}-{max(chapters)})"
        )
    if number // 10 != chapter or number % 10 == 0:
        raise ProblemError(
            f"{folder.name}: number {number} must be chapter * 10 + (1..9) for chapter {chapter}"
        )
    if meta["difficulty"] not in DIFFICULTIES:
        raise ProblemError(
            f"{folder.name}: difficulty {meta['difficulty']!r} is not one of "
            f"{', '.join(DIFFICULTIES)}"
        )
    if meta["env"] not in ENVS:
        raise ProblemError(f"{folder.name}: env {meta['env']!r} is not one of {', '.join(ENVS)}")
    if not re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", folder.name):
        raise ProblemError(f"{folder.name}: the folder name must be lower-case words joined by _")
    headings = [name for name, _ in markdown_sections(body)]
    for needed in ("hint", "explanation"):
        if needed not in headings:
            raise ProblemError(f"{folder.name}: problem.md has no `## {needed.title()}` section")
    return Problem(
        number, folder.name, meta["title"], chapter, meta["difficulty"], meta["env"], folder
    )


def load_problems(folder: Path, chapters: set[int]) -> list[Problem]:
    """Every problem under `folder`, sorted by number; ProblemError on the first malformed one
    or a duplicate number. `chapters` are the course's chapter numbers (from the manifests)."""
    if not folder.is_dir():
        return []
    problems = [
        parse_problem(sub, chapters)
        for sub in sorted(folder.iterdir())
        if sub.is_dir() and (sub / "problem.md").exists()
    ]
    seen: dict[int, str] = {}
    for problem in problems:
        if problem.number in seen:
            raise ProblemError(
                f"problems {seen[problem.number]} and {problem.slug} share number {problem.number}"
            )
        seen[problem.number] = problem.slug
    return sorted(problems, key=lambda p: p.number)


def find_problem(problems: list[Problem], key: str) -> Problem:
    """A problem by number (`41`) or slug (`prepare_inputs`)."""
    for problem in problems:
        if key in (str(problem.number), problem.slug):
            return problem
    raise ProblemError(f"no problem {key!r}: `{PYTHON} practice/judge.py list` shows them all")


def course_problems(root: Path = ROOT) -> list[Problem]:
    """Every problem of the course at `root` (its practice/problems/), checked against the
    chapters of its manifests."""
    return load_problems(root / "practice" / "problems", set(Course.load(root).chapters))


def solution_source(problem: Problem, engine: Path = ROOT / ENGINE) -> str:
    """solution.py with every `# reference body: path:qualname` comment replaced by the body
    (below the docstring) of that function of the engine, indented in its place: the answer
    that is graded, shown (`judge.py solution`) and from which the starter is derived."""
    text = (problem.path / "solution.py").read_text("utf-8")

    def reference_body(match: re.Match[str]) -> str:
        path, qualname = match["path"], match["qualname"]
        try:
            source = (engine / path).read_text("utf-8")
            span = body_span(find_definition(source, qualname))
        except (OSError, CourseError) as error:
            raise ProblemError(
                f"{problem.slug}: solution.py takes the body of {path}:{qualname}: {error}"
            ) from None
        if span is None:
            raise ProblemError(f"{problem.slug}: {path}:{qualname} has no body to take")
        body = "\n".join(source.splitlines()[span[0] - 1 : span[1]])
        return textwrap.indent(textwrap.dedent(body), match["indent"])

    return REFERENCE_BODY.sub(reference_body, text)


def derived_starter(problem: Problem) -> str:
    """The starter.py that solution.py implies. The committed starter says only which functions
    are stubs (with the task each `raise NotImplementedError` states) and which helpers of the
    solution it leaves out; every other line comes from the solution, so the two cannot drift
    (`judge.py sync` rewrites it, `sync --check` names a stale one)."""
    solution = solution_source(problem)
    starter = (problem.path / "starter.py").read_text("utf-8")
    try:
        stubs = {
            name: task
            for name, nodes in functions(ast.parse(starter)).items()
            if (task := stub_raise(nodes[0])) is not None
        }
        given, defined = definitions(ast.parse(starter)), definitions(ast.parse(solution))
        extra = sorted(set(given) - set(defined))
        if extra:  # sync would drop them: everything a starter gives comes from the solution
            raise CourseError(f"it defines {', '.join(extra)}, which solution.py does not")
        omitted = set(defined) - set(given)
        # a left-out class takes its methods with it
        omit = {n for n in omitted if not any(n.startswith(f"{o}.") for o in omitted)}
        return derive_starter(solution, stubs, omit)
    except (SyntaxError, CourseError) as error:
        raise ProblemError(f"{problem.slug}: cannot derive starter.py: {error}") from None
