"""mkdocs hook: a page per browser practice problem, and Pyodide vendored into the site.

Every practice problem with `env: browser` gets a page `practice/<slug>/`, generated at build
time from its folder (problem.md, starter.py, test.py): the statement, the sample tests, an
editor with Run buttons, and the hint and explanation (hidden until a run fails or passes).
The tests run in the reader's browser: docs/practice/assets/practice.js starts a Web Worker
(worker.js) that loads Pyodide from the site itself and runs practice/web/runner.py, the same
runner the CI check uses under node. Nothing is fetched from a CDN: vendored.py copies the
Pyodide files from the npm package into `site/pyodide/`.

The practice index (docs/practice/index.md) gets its table of problems where it says
`<!-- practice:problems -->`; practice.js fills in each problem's status from localStorage.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from mkdocs.config.config_options import ExtraScriptValue
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from course.paths import PYTHON
from course.problems import SAMPLE_PREFIX, TIMEOUTS, Problem, ProblemError, course_problems

# The repository being built, which need not be the installed course's (a test builds a copy).
ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "practice" / "web"
ASSETS = "practice/assets"  # docs/practice/assets: the page script, the worker, the style
TABLE_MARKER = "<!-- practice:problems -->"


def browser_problems() -> list[Problem]:
    return [p for p in course_problems(ROOT) if p.env == "browser"]


def page_uri(problem: Problem) -> str:
    return f"practice/{problem.slug}.md"


def sample_source(test_py: Path) -> str:
    """The sample tests (`test_example*`) of a test file, with the imports, helpers and
    constants they use, in file order: what the student can read and run."""
    source = test_py.read_text()
    tree = ast.parse(source)
    defined = {}  # top-level name -> its statement
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else [node]
        )
        for target in targets:
            name = getattr(target, "name", None) or getattr(target, "id", None)
            if name:
                defined[name] = node
    keep = [
        n
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        or (isinstance(n, ast.FunctionDef) and n.name.startswith(SAMPLE_PREFIX))
    ]
    todo = list(keep)
    while todo:  # add what the kept statements use, and what that uses in turn
        used = {n.id for n in ast.walk(todo.pop()) if isinstance(n, ast.Name)}
        for name in used:
            node = defined.get(name)
            if node is not None and node not in keep:
                keep.append(node)
                todo.append(node)
    lines = source.splitlines()
    text = ""
    for node in sorted(keep, key=lambda n: n.lineno):
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        block = "\n".join(lines[first - 1 : node.end_lineno])
        imports = isinstance(node, (ast.Import, ast.ImportFrom))
        text += block if not text else f"\n{block}" if imports else f"\n\n\n{block}"
    return text


def hidden_section(css_class: str, title: str, kind: str, markdown: str) -> str:
    """A box shown by practice.js at the right moment (`hidden` until then)."""
    body = "\n".join("    " + line if line else "" for line in markdown.splitlines())
    return (
        f'<div class="{css_class}" hidden markdown="1">\n\n!!! {kind} "{title}"\n\n{body}\n\n</div>'
    )


def problem_page(problem: Problem) -> str:
    """The Markdown of a problem's page."""
    data = {
        "number": problem.number,
        "slug": problem.slug,
        "title": problem.title,
        "timeout": TIMEOUTS["browser"],
        "starter": (problem.path / "starter.py").read_text(),
        "tests": (problem.path / "test.py").read_text(),
    }
    # One line of JSON; `<` escaped so no `</script>` inside the sources can end the element.
    payload = json.dumps(data).replace("<", "\\u003c")
    where = f"practice/problems/{problem.slug}"
    return f"""# {problem.number} · {problem.title}

Chapter {problem.chapter} · {problem.difficulty} · runs in your browser
(or locally: `{PYTHON} practice/judge.py start {problem.number}`)

{problem.statement.strip()}

## Sample tests

```python title="{where}/test.py · samples"
{sample_source(problem.path / "test.py")}
```

*Run the samples* runs these; *Run all tests* runs every test of `{where}/test.py`.

## Your solution

<div class="practice" data-problem="{problem.number}">
<textarea class="practice-editor" spellcheck="false" aria-label="Your solution"></textarea>
<div class="practice-buttons">
<button type="button" class="md-button md-button--primary" data-run="all">Run all tests</button>
<button type="button" class="md-button" data-run="samples">Run the samples</button>
<button type="button" class="md-button" data-reset>Start over</button>
</div>
<p class="practice-status" aria-live="polite"></p>
<div class="practice-results" aria-live="polite"></div>
</div>

<script type="application/json" class="practice-data">{payload}</script>

{hidden_section("practice-hint", "Hint", "tip", problem.hint)}

{hidden_section("practice-explanation", "Explanation", "success", problem.explanation)}
"""


def problems_table() -> str:
    """Every practice problem: browser ones link to their page, with the reader's status."""
    problems = course_problems(ROOT)
    rows = [
        "| # | problem | chapter | difficulty | runs in | your status |",
        "|---|---|---|---|---|---|",
    ]
    for p in problems:
        title = f"[{p.title}]({p.slug}.md)" if p.env == "browser" else p.title
        status = (
            f'<span data-practice-status="{p.number}">new</span>' if p.env == "browser" else "local"
        )
        rows.append(f"| {p.number} | {title} | {p.chapter} | {p.difficulty} | {p.env} | {status} |")
    total = sum(1 for p in problems if p.env == "browser")
    summary = f'<p data-practice-summary="{total}">{total} problems run in the browser.</p>'
    return (
        summary + "\n\n" + "\n".join(rows) + f"\n\nStart a `torch` problem with "
        f"`{PYTHON} practice/judge.py start N`; the judge keeps its status on your machine."
    )


def on_config(config: Any) -> Any:
    """The page script and style, on every page (it also shows statuses in tables)."""
    script = ExtraScriptValue(f"{ASSETS}/practice.js")
    script.type = "module"
    config.extra_javascript.append(script)
    config.extra_css.append(f"{ASSETS}/practice.css")
    return config


def on_files(files: Files, config: Any) -> Files:
    """Add a page per browser problem and the runner (vendored.py adds Pyodide)."""
    files.append(File.generated(config, f"{ASSETS}/runner.py", abs_src_path=str(WEB / "runner.py")))
    try:
        problems = browser_problems()
    except ProblemError as error:
        raise PluginError(f"practice problems: {error}") from None
    for problem in problems:
        files.append(File.generated(config, page_uri(problem), content=problem_page(problem)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri == "practice/index.md":
        if TABLE_MARKER not in markdown:
            raise PluginError(f"practice/index.md lacks the line {TABLE_MARKER}")
        markdown = markdown.replace(TABLE_MARKER, problems_table())
    return markdown
