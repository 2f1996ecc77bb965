"""mkdocs hook: expand directive lines in the pages into content taken from the real sources.

A directive is a line of its own, starting with `::`:

    ::code scheduler/cache.py:CacheManager.allocate_paged   a symbol of solutions/minisgl
    ::code scheduler/cache.py                               a whole file
    ::tree 8                                                 snapshot 8's file tree and counts
    ::output ch08_cache_manager                              docs/_outputs/<name>.txt (captured)
    ::example ch08_cache_manager                             examples/<name>.py + notebook link
    ::test tests/test_ch08_cache_manager.py:test_name        a test function's source
    ::practice 8                                             chapter 8's practice problems

A directive whose target does not exist fails the build, so the site cannot drift from the code.
(Authors drafting a page before its targets exist may set MINISGL_DOCS_DRAFT=1: a missing
target then renders as a warning box instead. CI never sets it.)
Notebooks (examples converted with jupytext) are generated into the site at build time.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import jupytext
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "solutions" / "minisgl"
OUTPUTS = ROOT / "docs" / "_outputs"
EXAMPLES = ROOT / "examples"
DIRECTIVE = re.compile(r"^::(\w+)\s+(\S+)\s*$", re.MULTILINE)


def symbol_source(path: Path, symbol: str | None) -> str:
    """The source of `Class.method` or `function` in a Python file (decorators included)."""
    if not path.is_file():
        raise PluginError(f"no such file: {path.relative_to(ROOT)}")
    text = path.read_text()
    if symbol is None:
        return text.rstrip("\n")
    scope: list[ast.stmt] = ast.parse(text).body
    node: ast.AST | None = None
    for name in symbol.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.ClassDef)) and n.name == name), None)
        if node is None:
            raise PluginError(f"{path.relative_to(ROOT)} has no symbol {symbol!r}")
        scope = getattr(node, "body", [])
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    return textwrap.dedent("\n".join(lines))


def fenced(code: str, lang: str, title: str) -> str:
    return f'```{lang} title="{title}"\n{code}\n```'


def code_directive(target: str, page_dir: str) -> str:
    path, _, symbol = target.partition(":")
    source = symbol_source(ENGINE / path, symbol or None)
    title = f"solutions/minisgl/{path}" + (f" · {symbol}" if symbol else "")
    return fenced(source, "python", title)


def test_directive(target: str, page_dir: str) -> str:
    path, _, symbol = target.partition(":")
    return fenced(symbol_source(ROOT / path, symbol or None), "python",
                  f"{path}" + (f" · {symbol}" if symbol else ""))


def output_directive(target: str, page_dir: str) -> str:
    path = OUTPUTS / f"{target}.txt"
    if not path.is_file():
        raise PluginError(f"no captured output {path.relative_to(ROOT)}: "
                          "run `python tools/steps.py check` to capture it")
    return fenced(path.read_text().rstrip("\n"), "text", f"python examples/{target}.py")


def example_directive(target: str, page_dir: str) -> str:
    path = EXAMPLES / f"{target}.py"
    source = symbol_source(path, None)
    link = relative_link(page_dir, f"notebooks/{target}.ipynb")
    return (fenced(source, "python", f"examples/{target}.py")
            + f"\n\n[:material-notebook: Download as a notebook]({link})")


def tree_directive(target: str, page_dir: str) -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    import steps  # the chapter judge computes snapshots; the site reuses it

    text = steps.render_tree(int(target))
    counts, _, tree = text.partition("\n")
    return f"{counts}\n\n```text\n{tree.strip()}\n```"


def practice_directive(target: str, page_dir: str) -> str:
    sys.path.insert(0, str(ROOT / "practice"))
    import judge

    problems = [p for p in judge.load_problems() if p.chapter == int(target)]
    if not problems:
        return "No practice problems for this chapter yet."
    rows = ["| # | problem | difficulty | runs in |", "|---|---|---|---|"]
    rows += [f"| {p.number} | {p.title} | {p.difficulty} | {p.env} |" for p in problems]
    return ("\n".join(rows) + "\n\nStart one with `python practice/judge.py start N`, check it "
            "with `python practice/judge.py test N`.")


DIRECTIVES: dict[str, Callable[[str, str], str]] = {
    "code": code_directive, "test": test_directive, "output": output_directive,
    "example": example_directive, "tree": tree_directive, "practice": practice_directive,
}


def relative_link(page_dir: str, target: str) -> str:
    """A link from a page in docs/<page_dir>/ to docs/<target> (mkdocs checks and rewrites it)."""
    return "../" * len(Path(page_dir).parts) + target


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    page_dir = str(Path(page.file.src_uri).parent)

    def expand(match: re.Match[str]) -> str:
        name, target = match.group(1), match.group(2)
        if name not in DIRECTIVES:
            raise PluginError(f"{page.file.src_uri}: unknown directive ::{name}")
        try:
            return DIRECTIVES[name](target, page_dir)
        except (PluginError, ImportError, AttributeError, OSError) as error:
            if os.environ.get("MINISGL_DOCS_DRAFT") == "1":
                return f'!!! warning "Draft: ::{name} {target} is missing"\n    {error}'
            raise PluginError(f"{page.file.src_uri}: ::{name} {target}: {error}") from None

    return DIRECTIVE.sub(expand, markdown)


def on_files(files: Files, config: Any) -> Files:
    """Add a notebook for every example, converted by jupytext at build time."""
    for example in sorted(EXAMPLES.glob("*.py")):
        notebook = jupytext.writes(jupytext.read(example), fmt="ipynb")
        files.append(File.generated(config, f"notebooks/{example.stem}.ipynb", content=notebook))
    return files
