"""mkdocs hook: expand directive lines in the pages into content taken from the real sources.

A directive is a line of its own, starting with `::`:

    ::code scheduler/cache.py:CacheManager.allocate_paged   a symbol of solutions/minisgl
    ::code scheduler/cache.py                               a whole file
    ::tree 8                                                 snapshot 8's file tree and counts
    ::output ch08_cache_manager                              docs/_outputs/<name>.txt (captured)
    ::figure ch08_cache_manager.admission                    docs/_outputs/<name>.json, drawn
    ::example ch08_cache_manager                             examples/<name>.py + notebook link
    ::test tests/test_ch08_cache_manager.py:test_name        a test function's source
    ::file chapters/ch08_cache_manager/chapter.toml          any file of the repository
    ::practice 8                                             chapter 8's practice problems

A measured figure in a sentence is an inline directive that computes it from one committed
result line (`benchmark/results/*.jsonl`), chosen by its fields, or from two (`a` and `b`):

    {{result output_tokens / seconds | ,.0f | variant=minisgl date=2026-12-01T16:32}}
    {{result b.seconds / a.seconds | .1f | variant=minisgl date=2026-12-01T16:32 |
             variant=transformers date=2026-12-01T16:31}}

A table of figures is a line of its own: one row per value of a field, one column per value of
another, each cell computed from the one line that has both values (every line the selector
matches, which must name its date; the caption says what measured them):

    {{table part x batch | host_ms_per_step | .2f | benchmark=decode_profile date=2026-12-01T17:51}}

Each selector of a figure must match exactly one line and name its date (a field equals the
value, quoted if it holds spaces; `date` matches by prefix, `file` names the results file
without `.jsonl`), so a line added later changes no figure. The
figure is rendered with the command, machine and date of its lines as its tooltip.

On a chapter's page, `::code` folds the body of each of that chapter's own stubs (its manifest's
`stubs`) into a closed "Reference solution" box under the open signature and docstring, so a
student reads the task before the answer; code of other chapters stays open.

A directive whose target does not exist fails the build, so the site cannot drift from the code.
(Authors drafting a page before its targets exist may set MINISGL_DOCS_DRAFT=1: a missing
target then renders as a warning box instead. CI never sets it.)
Notebooks (examples converted with jupytext) are generated into the site at build time.
"""

from __future__ import annotations

import ast
import html
import json
import operator
import os
import re
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import jupytext
import nbformat
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from course import CourseError
from course.manifest import Course
from course.paths import PYTHON
from course.problems import course_problems
from course.snapshot import render_tree
from course.source import body_span, definition_source, find_definition, first_line

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402  (the drawing code of ::figure, next to this file)

# The repository being built, which need not be the installed course's (a test builds a copy).
ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "solutions" / "minisgl"
OUTPUTS = ROOT / "docs" / "_outputs"
RESULTS = ROOT / "benchmark" / "results"
EXAMPLES = ROOT / "examples"
DIRECTIVE = re.compile(r"^::(\w+)\s+(\S+)\s*$", re.MULTILINE)
# A result figure, unless it is quoted in a fenced block or a code span (the guide shows one).
RESULT_FIGURE = re.compile(
    r"^(```|~~~).*?^\1[ \t]*$|`[^`\n]*`|\{\{result (.+?)\}\}", re.MULTILINE | re.DOTALL
)
# A table of figures, a line of its own, unless it is quoted in a fenced block.
RESULT_TABLE = re.compile(
    r"^(```|~~~).*?^\1[ \t]*$|^\{\{table (.+?)\}\}[ \t]*$", re.MULTILINE | re.DOTALL
)
JUPYTEXT_HEADER = re.compile(r"\A# ---\n(?:#.*\n)*?# ---\n\s*")
SOLUTION_TITLE = "Reference solution: try it first"


def course() -> Course:
    """The chapter manifests, read once per build (on_pre_build forgets them)."""
    global _COURSE
    if _COURSE is None:
        _COURSE = Course.load(ROOT)
    return _COURSE


_COURSE: Course | None = None


def on_pre_build(config: Any) -> None:
    global _COURSE
    _COURSE = None


def read_source(path: Path) -> str:
    if not path.is_file():
        raise PluginError(f"no such file: {path.relative_to(ROOT)}")
    return path.read_text()


def symbol_source(path: Path, symbol: str | None) -> str:
    """The source of `Class.method` or `function` in a Python file (decorators included)."""
    text = read_source(path)
    return definition_source(text, symbol) if symbol else text.rstrip("\n")


def fenced(code: str, lang: str, title: str = "") -> str:
    header = f'```{lang} title="{title}"' if title else f"```{lang}"
    return f"{header}\n{code}\n```"


def code_directive(target: str, page: str) -> str:
    path, _, symbol = target.partition(":")
    file = ENGINE / path
    text = read_source(file)
    lines = text.splitlines()
    if symbol:
        node = find_definition(text, symbol)
        first, last = first_line(node), node.end_lineno or len(lines)
    else:
        first, last = 1, len(lines)
    folds = []  # (first body line, last body line, stub) of this chapter's stubs shown here
    chapter = course().chapter_of_page(page)
    for stub in chapter.stubs if chapter else ():
        stub_path, _, stub_symbol = stub.partition(":")
        if stub_path == path and (
            not symbol or stub_symbol == symbol or stub_symbol.startswith(symbol + ".")
        ):
            body = body_span(find_definition(text, stub_symbol))
            if body is not None:
                folds.append((*body, stub_symbol))
    title = f"solutions/minisgl/{path}" + (f" · {symbol}" if symbol else "")
    shown = textwrap.dedent("\n".join(lines[first - 1 : last])).splitlines()

    def segment(start: int, end: int) -> str:  # 1-based file lines, inclusive
        return "\n".join(shown[start - first : end - first + 1]).strip("\n")

    parts, cursor = [], first
    for start, end, stub in sorted(folds):
        parts.append(fenced(segment(cursor, start - 1), "python", "" if parts else title))
        label = SOLUTION_TITLE if stub == symbol else f"{SOLUTION_TITLE} · `{stub}`"
        solution = fenced(segment(start, end), "python")
        parts.append(
            f'??? success "{label}"\n\n' + textwrap.indent(solution, "    ", lambda line: True)
        )  # blank lines too
        cursor = end + 1
    rest = segment(cursor, last)
    if rest.strip():
        parts.append(fenced(rest, "python", "" if parts else title))
    return "\n\n".join(parts)


def test_directive(target: str, page: str) -> str:
    path, _, symbol = target.partition(":")
    return fenced(
        symbol_source(ROOT / path, symbol or None),
        "python",
        f"{path}" + (f" · {symbol}" if symbol else ""),
    )


def file_directive(target: str, page: str) -> str:
    """A whole file of the repository, highlighted by its extension (toml, py, yaml, ...)."""
    path = ROOT / target
    return fenced(read_source(path).rstrip("\n"), path.suffix.lstrip(".") or "text", target)


def output_directive(target: str, page: str) -> str:
    path = OUTPUTS / f"{target}.txt"
    if not path.is_file():
        raise PluginError(
            f"no captured output {path.relative_to(ROOT)}: "
            f"run `{PYTHON} tools/steps.py capture` to capture it"
        )
    text = path.read_text().rstrip("\n")
    # A chapter main's output; or any other command's, recorded on its first line as "$ command".
    command, _, rest = text.partition("\n")
    if command.startswith("$ ") and not (EXAMPLES / f"{target}.py").is_file():
        return fenced(rest, "text", command.removeprefix("$ "))
    return fenced(text, "text", f"{PYTHON} examples/{target}.py")


def figure_directive(target: str, page: str) -> str:
    """An inline SVG drawn from the engine state a chapter main captured (figures.py)."""
    path = OUTPUTS / f"{target}.json"
    if not path.is_file():
        raise PluginError(
            f"no captured figure data {path.relative_to(ROOT)}: run "
            f"`{PYTHON} tools/steps.py capture` to capture it (the main writes it "
            "when MINISGL_CAPTURE_DIR is set)"
        )
    try:
        svg, caption = figures.draw(target, json.loads(path.read_text()))
    except (KeyError, ValueError, TypeError) as error:  # no drawing, or data it cannot read
        raise PluginError(f"cannot draw figure {target}: {error!r}") from None
    example = target.partition(".")[0]
    return (
        f'<figure class="minisgl-figure">\n{svg}\n'
        f"<figcaption>{caption} Drawn from a run of <code>examples/{example}.py</code>."
        "</figcaption>\n</figure>"
    )


def example_directive(target: str, page: str) -> str:
    path = EXAMPLES / f"{target}.py"
    source = JUPYTEXT_HEADER.sub("", read_source(path)).rstrip("\n")
    link = relative_link(page, f"notebooks/{target}.ipynb")
    return (
        fenced(source, "python", f"examples/{target}.py")
        + f"\n\n[:material-notebook: Download as a notebook]({link})"
    )


def tree_directive(target: str, page: str) -> str:
    text = render_tree(course(), int(target))
    counts, _, tree = text.partition("\n")
    return f"{counts}\n\n```text\n{tree.strip()}\n```"


def practice_directive(target: str, page: str) -> str:
    """Chapter K's practice problems: browser ones link to their page, the others show the
    command that starts them."""
    problems = [p for p in course_problems(ROOT) if p.chapter == int(target)]
    if not problems:
        return "No practice problems for this chapter yet."
    rows = ["| # | problem | difficulty | runs in | start it |", "|---|---|---|---|---|"]
    for p in problems:
        if p.env == "browser":  # docs/hooks/practice_pages.py generates its page
            title = f"[{p.title}]({relative_link(page, f'practice/{p.slug}.md')})"
            start = "in the browser"
        else:
            title, start = p.title, f"`{PYTHON} practice/judge.py start {p.number}`"
        rows.append(f"| {p.number} | {title} | {p.difficulty} | {p.env} | {start} |")
    return (
        "\n".join(rows) + f"\n\n`{PYTHON} practice/judge.py start N` sets up problem N's "
        f"starter code and prints its statement; `{PYTHON} practice/judge.py test N` "
        "grades it."
    )


def mutations_directive(target: str, page: str) -> str:
    """A mutation report (`steps.py mutate K --report` writes docs/_reports/mutations.json;
    `--catalogue heldout` writes heldout.json, whose entries keep their first run as
    "before")."""
    report = json.loads(read_source(ROOT / target))
    held_out = any("before" in entry for entry in report.values())
    first = "killed before | killed now" if held_out else "mutants killed by its own tests"
    rows = [f"| chapter | {first} | rate | measured | command |", "|---|---|---|---|---|"]
    if held_out:
        rows[1] = "|---|---|---|---|---|---|"
    notes = []
    for entry in report.values():
        rate = entry["killed"] / entry["total"]
        before = entry.get("before")
        then = f"{before['killed']}/{before['total']} ({before['date']}) | " if before else ""
        rows.append(
            f"| {entry['chapter']} | {then}{entry['killed']}/{entry['total']} | {rate:.0%} | "
            f"{entry['date']} | `{entry['command']}` |"
        )
        notes += [f"- survived in {entry['chapter']}: `{s}`" for s in entry["survivors"]]
        notes += [f"- equivalent in {entry['chapter']}: `{s}`" for s in entry["equivalent"]]
    return "\n".join(rows + [""] + notes)


def result_lines() -> list[tuple[str, dict[str, Any]]]:
    """Every committed result line, with the stem of its file."""
    return [
        (path.stem, json.loads(line))
        for path in sorted(RESULTS.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def select_results(selector: str) -> list[tuple[str, dict[str, Any]]]:
    """The result lines whose fields match `key=value ...` (`date` by prefix)."""
    wanted = dict(pair.split("=", 1) for pair in shlex.split(selector))
    if "date" not in wanted:  # without it, a line added later could match too
        raise PluginError(f"the selector '{selector}' names no date")
    return [
        (stem, line)
        for stem, line in result_lines()
        if all(
            (stem if key == "file" else str(line.get(key, ""))).startswith(value)
            if key in ("date", "file")
            else str(line.get(key)) == value
            for key, value in wanted.items()
        )
    ]


def select_result(selector: str) -> tuple[str, dict[str, Any]]:
    """The one result line whose fields match `key=value ...` (`date` by prefix)."""
    found = select_results(selector)
    if len(found) != 1:
        raise PluginError(f"{len(found)} result lines match '{selector}', not one")
    return found[0]


ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate(node: ast.AST, names: dict[str, Any]) -> Any:
    """Arithmetic over the fields of result lines: names, `a.field`, `top[0][2]`, numbers,
    + - * /."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return names[node.value.id][node.attr]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return evaluate(node.value, names)[node.slice.value]  # an item of a list field
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        return ARITHMETIC[type(node.op)](evaluate(node.left, names), evaluate(node.right, names))
    raise PluginError(f"a result figure allows only arithmetic on fields: {ast.unparse(node)}")


def result_figure(spec: str) -> str:
    """`EXPR | FORMAT | SELECTOR [| SELECTOR]`: the figure, titled with what measured it."""
    expression, form, *selectors = (part.strip() for part in spec.split("|"))
    if not 1 <= len(selectors) <= 2:
        raise PluginError(f"a result figure reads one or two result lines: {spec}")
    chosen = [select_result(selector) for selector in selectors]
    labelled = dict(zip("ab", (line for _, line in chosen)))
    names = {**chosen[0][1], **labelled} if len(chosen) == 1 else labelled
    value = compute(expression, names)
    sources = "; ".join(
        f"benchmark/results/{stem}.jsonl: {line['command']} ({line['machine']}, {line['date']})"
        for stem, line in chosen
    )
    return f'<abbr class="measured" title="{html.escape(sources)}">{value:{form}}</abbr>'


def compute(expression: str, names: dict[str, Any]) -> Any:
    """The value of a figure's expression over the fields in `names`."""
    try:
        return evaluate(ast.parse(expression, mode="eval"), names)
    except (KeyError, TypeError, SyntaxError) as error:
        raise PluginError(f"cannot compute '{expression}': {error!r}") from None


def cell(value: Any, form: str) -> str:
    """A table cell: counts as integers, other figures in the table's format."""
    return f"{value:,d}" if isinstance(value, int) else f"{value:{form}}"


def result_table(spec: str) -> str:
    """A markdown table of the lines a selector matches, and its caption, in one of two forms:

    `ROW x COLUMN | EXPR | FORMAT | SELECTOR`: one row per value of field ROW and one column per
    value of COLUMN, each cell EXPR of the one line that has both values;
    `ROW ... | LABEL: EXPR; ... | FORMAT | SELECTOR`: one row per line, labelled by the values of
    the ROW fields, and one column per expression.
    Rows and columns come in the order of the lines."""
    layout, expressions, form, selector = (part.strip() for part in spec.split("|"))
    found = select_results(selector)
    lines = [line for _, line in found]
    if not lines:
        raise PluginError(f"no result line matches '{selector}'")
    if " x " in layout:
        row_key, column_key = (key.strip() for key in layout.split(" x "))
        cells: dict[tuple[Any, Any], str] = {}
        for line in lines:
            place = (line.get(row_key), line.get(column_key))
            if place in cells:
                raise PluginError(
                    f"two lines of '{selector}' have {row_key}, {column_key} = {place}"
                )
            cells[place] = cell(compute(expressions, line), form)
        rows = list(dict.fromkeys(row for row, _ in cells))
        columns = list(dict.fromkeys(column for _, column in cells))
        header = [row_key, *(f"{column_key} {column}" for column in columns)]
        body = [[str(r), *(cells.get((r, c), "") for c in columns)] for r in rows]
    else:
        keys = layout.split()
        labelled = [item.split(":", 1) for item in expressions.split(";")]
        header = [" ".join(keys), *(label.strip() for label, _ in labelled)]
        body = [
            [
                " ".join(str(line.get(key)) for key in keys),
                *(cell(compute(expression.strip(), line), form) for _, expression in labelled),
            ]
            for line in lines
        ]
    sources = dict.fromkeys(
        f"`{line['command']}` ({line['machine']}, {line['date'][:10]}; "
        f"`benchmark/results/{stem}.jsonl`)"
        for stem, line in found
    )
    table = [
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
        *("| " + " | ".join(row) + " |" for row in body),
    ]
    return "\n".join(table) + "\n\nMeasured by " + "; ".join(sources) + ".\n"


DIRECTIVES: dict[str, Callable[[str, str], str]] = {
    "code": code_directive,
    "test": test_directive,
    "file": file_directive,
    "output": output_directive,
    "figure": figure_directive,
    "example": example_directive,
    "tree": tree_directive,
    "practice": practice_directive,
    "mutations": mutations_directive,
}


def relative_link(page: str, target: str) -> str:
    """A link from the page docs/<page> to docs/<target> (mkdocs checks and rewrites it)."""
    return "../" * len(Path(page).parent.parts) + target


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def expand(match: re.Match[str]) -> str:
        name, target = match.group(1), match.group(2)
        if name not in DIRECTIVES:
            raise PluginError(f"{page.file.src_uri}: unknown directive ::{name}")
        try:
            return DIRECTIVES[name](target, page.file.src_uri)
        except (
            PluginError,
            CourseError,
            ImportError,
            AttributeError,
            OSError,
            ValueError,
        ) as error:
            if os.environ.get("MINISGL_DOCS_DRAFT") == "1":
                return f'!!! warning "Draft: ::{name} {target} is missing"\n    {error}'
            raise PluginError(f"{page.file.src_uri}: ::{name} {target}: {error}") from None

    def table(match: re.Match[str]) -> str:
        if match.group(2) is None:  # a fenced block, left as it is
            return match.group(0)
        try:
            return result_table(match.group(2))
        except PluginError as error:
            raise PluginError(f"{page.file.src_uri}: {match.group(0)}: {error}") from None

    def figure(match: re.Match[str]) -> str:
        if match.group(2) is None:  # code, left as it is
            return match.group(0)
        try:
            return result_figure(match.group(2))
        except PluginError as error:
            raise PluginError(f"{page.file.src_uri}: {match.group(0)}: {error}") from None

    markdown = RESULT_TABLE.sub(table, DIRECTIVE.sub(expand, markdown))
    return RESULT_FIGURE.sub(figure, markdown)


# The first cell of every notebook: run the student's own engine when there is one.
USE_WORK_TREE = """\
# Use your own engine (work/minisgl, from `steps.py start`) when it exists, else the installed one.
import sys
from pathlib import Path

for root in (Path.cwd(), *Path.cwd().parents):
    if (root / "work" / "minisgl").is_dir():
        sys.path.insert(0, str(root / "work"))
        break
import minisgl

print(f"using the minisgl tree at {Path(minisgl.__file__).parent}")"""


def on_files(files: Files, config: Any) -> Files:
    """Add a notebook for every example, converted by jupytext at build time."""
    for example in sorted(EXAMPLES.glob("*.py")):
        notebook = jupytext.read(example)
        notebook.cells.insert(0, nbformat.v4.new_code_cell(USE_WORK_TREE))
        files.append(
            File.generated(
                config,
                f"notebooks/{example.stem}.ipynb",
                content=jupytext.writes(notebook, fmt="ipynb"),
            )
        )
    return files
