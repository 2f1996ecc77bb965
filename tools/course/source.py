"""Python source surgery with `ast`: find functions, stub their bodies, replace them.

One mechanism serves the skeletons, the snapshots, the nbgrader notebooks and the site: the
reference source stays free of markers, and everything else is derived from its syntax tree.
"""

from __future__ import annotations

import ast
import posixpath
import re
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


def filter_init(text: str, path: str, present: set[str], known: set[str]) -> str:
    """Drop the `from .x import ...` and `from minisgl[.pkg] import x` statements of an
    __init__.py whose module x is absent (the second kind imports a module of another package
    that extends this one). `known` holds every file of the course: a name imported from a
    package that is no file of it (a class, a function) is not a module, and its line stays."""
    package = posixpath.dirname(path)
    lines = text.splitlines(keepends=True)
    for node in reversed(ast.parse(text).body):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1 and node.module:
            modules = [posixpath.join(package, *node.module.split("."))]
        elif node.level == 0 and node.module and node.module.split(".")[0] == "minisgl":
            parts = node.module.split(".")[1:]
            modules = ["/".join([*parts, alias.name]) for alias in node.names]
            modules = [m for m in modules if {f"{m}.py", f"{m}/__init__.py"} & known]
            if not modules:
                continue  # it imports names, not modules
        else:
            continue
        if not any({f"{m}.py", f"{m}/__init__.py"} & present for m in modules):
            del lines[node.lineno - 1 : node.end_lineno]
    return "".join(lines)


FEATURES = "features.py"  # the engine's table of parts (solutions/minisgl/features.py)


def module_path(module: str) -> str:
    """The file path of a module: minisgl.engine.graph -> engine/graph (no .py)."""
    return "/".join(module.split(".")[1:])


def module_file(module: str, present: set[str]) -> bool:
    """Whether the dotted module `minisgl.a.b` is a file of `present` (paths under minisgl/)."""
    path = module_path(module)
    return bool({f"{path}.py", f"{path}/__init__.py"} & present)


def filter_features(text: str, present: set[str]) -> str:
    """Drop the rows of features.py, `Part(chapter, name, "minisgl.x.y:attr", ...),`, whose
    module x/y is absent: a snapshot's table lists only the parts its files hold."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    rows = [
        node
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Part"
        and len(node.args) >= 3
        and isinstance(node.args[2], ast.Constant)
    ]
    for node in sorted(rows, key=lambda row: (row.lineno, row.col_offset), reverse=True):
        if module_file(str(node.args[2].value).partition(":")[0], present):
            continue
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
        end += len(text[end:]) - len(text[end:].lstrip(" ,"))  # its comma
        line_start, line_end = starts[node.lineno - 1], starts[node.end_lineno]  # type: ignore[index]
        if not text[line_start:begin].strip() and not text[end:line_end].strip():
            begin, end = line_start, line_end  # a row on lines of its own: drop them
        text = text[:begin] + text[end:]
    return re.sub(r"= \(\n\)", "= ()", text)  # a table left empty


def symbol_at(text: str, line: int) -> str | None:
    """The qualified name of the innermost function of `text` containing `line`, if any."""
    best: tuple[int, str] | None = None
    for qualname, nodes in functions(ast.parse(text)).items():
        for node in nodes:
            start = first_line(node)
            if start <= line <= (node.end_lineno or start) and (best is None or start > best[0]):
                best = (start, qualname)
    return best[1] if best else None


def stub_raise(node: FunctionNode) -> str | None:
    """The task of a practice stub: the message of the `raise NotImplementedError("...")` that
    opens its body (after the docstring), or None when the body is written code."""
    body = node.body[1:] if has_docstring(node) else node.body
    first = body[0] if body else None
    if not isinstance(first, ast.Raise) or not isinstance(first.exc, ast.Call):
        return None
    call = first.exc
    if not (isinstance(call.func, ast.Name) and call.func.id == "NotImplementedError"):
        return None
    task = call.args[0] if call.args else None
    return task.value if isinstance(task, ast.Constant) and isinstance(task.value, str) else None


def definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """Top-level functions, classes and simply named constants, and the methods of classes,
    by qualified name (the first definition of a name wins)."""
    found: dict[str, ast.stmt] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(prefix + node.name, node)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and not prefix:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, node)

    visit(tree.body, "")
    return found


def derive_starter(solution: str, stubs: dict[str, str], omit: set[str]) -> str:
    """A practice starter: the solution with each function of `stubs` reduced to its head and
    `raise NotImplementedError(<task>)`, and the definitions of `omit` (helpers the student
    designs alone) left out; every other line is the solution's."""
    lines = solution.splitlines(keepends=True)
    tree = ast.parse(solution)
    found = definitions(tree)
    unknown = sorted((set(stubs) | omit) - set(found))
    if unknown:
        raise CourseError(f"the solution defines no {', '.join(unknown)}")
    edits: list[tuple[int, int, list[str | None]]] = []
    for name, task in stubs.items():
        node = found[name]
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            raise CourseError(f"{name} is a stub, but the solution's {name} is not a function")
        edits.append((first_line(node), node.end_lineno or node.lineno, stub_of(lines, node, task)))
    for name in omit:
        node = found[name]
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        end = node.end_lineno or node.lineno
        edits.append((start, end, [None] * (end - start + 1)))  # None: a line taken out
    marked: list[str | None] = list(lines)
    for start, end, new in sorted(edits, reverse=True):
        marked[start - 1 : end] = new
    return "".join(close_gaps(marked))


def close_gaps(lines: list[str | None]) -> list[str]:
    """The lines without those taken out (None). Where lines were taken out, the blank lines
    left around them become the longest run of them (what the formatter put between two
    definitions there), or none at the start or the end of the file."""
    out: list[str] = []
    gap: list[str | None] = []  # blank and taken-out lines since the last line kept
    for line in lines:
        if line is None or not line.strip():
            gap.append(line)
            continue
        out += blank_lines(gap, edge=not out)
        out.append(line)
        gap = []
    return out + blank_lines(gap, edge=True)


def blank_lines(gap: list[str | None], edge: bool) -> list[str]:
    """What replaces a gap of blank (str) and taken-out (None) lines; see close_gaps."""
    kept = [line for line in gap if line is not None]
    if len(kept) == len(gap):
        return kept  # nothing taken out here: the blank lines stay as they are
    if edge:
        return []
    runs = "".join("b" if line is not None else " " for line in gap).split()
    return ["\n"] * max(map(len, runs), default=0)
