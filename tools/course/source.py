"""Python source surgery with `ast`: find functions, stub their bodies, replace them.

One mechanism serves the skeletons, the snapshots, the nbgrader notebooks and the site: the
reference source stays free of markers, and everything else is derived from its syntax tree.
"""

from __future__ import annotations

import ast
import posixpath
import textwrap

from course.errors import CourseError

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
DefinitionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


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


def find_definition(text: str, qualname: str) -> DefinitionNode:
    """The function or class `Class.method` / `function` / `Class` of a module's source."""
    scope: list[ast.stmt] = ast.parse(text).body
    node: DefinitionNode | None = None
    for name in qualname.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == name
            ),
            None,
        )
        if node is None:
            raise CourseError(f"no symbol {qualname!r}")
        scope = node.body
    assert node is not None
    return node


def first_line(node: DefinitionNode) -> int:
    """Where a definition's source starts: its first decorator, or the def."""
    return min([d.lineno for d in node.decorator_list] + [node.lineno])


def definition_source(text: str, qualname: str) -> str:
    """The dedented source of a symbol, decorators included."""
    node = find_definition(text, qualname)
    return textwrap.dedent("\n".join(text.splitlines()[first_line(node) - 1 : node.end_lineno]))


def has_docstring(node: FunctionNode) -> bool:
    first = node.body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def body_span(node: DefinitionNode) -> tuple[int, int] | None:
    """The 1-based line range of a definition's body below its docstring (None if the
    docstring is all there is): what the site folds as a stub's reference solution."""
    first = node.body[0]
    assert first.end_lineno is not None and node.end_lineno is not None
    documented = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    start = first.end_lineno + 1 if documented else first.lineno
    return (start, node.end_lineno) if start <= node.end_lineno else None


def task_of(node: FunctionNode, qualname: str) -> str:
    """What the student is asked to do: the first line of the docstring."""
    doc = (ast.get_docstring(node) or "").strip()
    return doc.splitlines()[0].strip() if doc else f"implement {qualname}"


def source_of(lines: list[str], node: FunctionNode) -> list[str]:
    return lines[first_line(node) - 1 : node.end_lineno]


def head_of(lines: list[str], node: FunctionNode) -> list[str]:
    """The function's lines from its decorators to the end of its docstring (or of the def)."""
    body = node.body[0]
    if lines[body.lineno - 1][: body.col_offset].strip():
        raise CourseError(f"line {node.lineno}: {node.name}'s body shares a line with its def")
    keep_to = body.end_lineno if has_docstring(node) else body.lineno - 1
    return lines[first_line(node) - 1 : keep_to]


def stub_of(lines: list[str], node: FunctionNode, message: str) -> list[str]:
    """The function's head (decorators, signature, docstring), then `raise NotImplementedError`."""
    body = node.body[0]
    indent = lines[body.lineno - 1][: body.col_offset]
    literal = '"' + message.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return head_of(lines, node) + [f"{indent}raise NotImplementedError({literal})\n"]


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
    spans = [
        (first_line(found[q][0]), found[q][0].end_lineno, src)
        for q, src in new_sources.items()
        if q in found
    ]
    for start, end, src in sorted(spans, key=lambda span: span[0], reverse=True):
        lines[start - 1 : end] = src
    return "".join(lines)


def filter_init(text: str, path: str, present: set[str]) -> str:
    """Drop the `from .x import ...` and `from minisgl import x` statements of an __init__.py
    whose module x is absent (the second kind imports a package that extends this one)."""
    package = posixpath.dirname(path)
    lines = text.splitlines(keepends=True)
    for node in reversed(ast.parse(text).body):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1 and node.module:
            modules = [posixpath.join(package, *node.module.split("."))]
        elif node.level == 0 and node.module == "minisgl":
            modules = [alias.name for alias in node.names]
        else:
            continue
        if not any({f"{m}.py", f"{m}/__init__.py"} & present for m in modules):
            del lines[node.lineno - 1 : node.end_lineno]
    return "".join(lines)


def symbol_at(text: str, line: int) -> str | None:
    """The qualified name of the innermost function of `text` containing `line`, if any."""
    best: tuple[int, str] | None = None
    for qualname, nodes in functions(ast.parse(text)).items():
        for node in nodes:
            start = first_line(node)
            if start <= line <= (node.end_lineno or start) and (best is None or start > best[0]):
                best = (start, qualname)
    return best[1] if best else None
