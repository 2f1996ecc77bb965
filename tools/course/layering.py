"""Snapshot K holds chapter K's code and the code before it, never a later chapter's.

A later chapter extends the engine through the extension points of earlier ones (a registry it
fills, an engine extension it registers) instead of editing earlier files, so an earlier file
names neither a later chapter's modules nor what they define. `later_mentions` finds where a
snapshot's files still do: an import of a module of a later chapter (also inside a function, or
spelled as a string for `find_spec`), or a name that only a later chapter's module defines.
Package `__init__.py` files are exempt: they list their package's modules, and snapshots keep
only the lines of modules that exist (`filter_init`).
"""

from __future__ import annotations

import ast

from course.manifest import NEVER, Course
from course.snapshot import assemble_file
from course.source import module_path


def module_files(course: Course, module: str) -> list[str]:
    path = module_path(module)
    return [p for p in (f"{path}.py", f"{path}/__init__.py") if p in course.file_owner]


def defined_names(tree: ast.Module) -> set[str]:
    """The classes, functions and constants a module defines at its top level."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def later_names(course: Course, k: int) -> dict[str, str]:
    """Names defined only by modules absent from snapshot k -> the file defining them."""
    present = course.files(k)
    earlier: set[str] = set()
    later: dict[str, str] = {}
    for path in course.file_owner:
        if path.endswith("__init__.py"):
            continue
        names = defined_names(ast.parse(course.reference(path)))
        if path in present:
            earlier |= names
        else:
            later.update({name: path for name in names})
    return {name: path for name, path in later.items() if name not in earlier}


def imported_modules(node: ast.AST, path: str) -> list[str]:
    """The minisgl modules an import statement in the file at `path` (under minisgl/) may load:
    `from a import b` names a and a.b (b may be a module), relative imports resolved from the
    file's package; [] for any other node."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("minisgl.")]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the file's package, up level - 1
        package = ["minisgl", *path.split("/")[:-1]]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    if base != "minisgl" and not base.startswith("minisgl."):
        return []
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def mentioned_modules(nodes: list[ast.AST], path: str) -> list[tuple[int, str]]:
    """(line, module) for every minisgl module these nodes of the file at `path` import or
    name in a string."""
    found: list[tuple[int, str]] = []
    for node in nodes:
        found += [(getattr(node, "lineno", 0), m) for m in imported_modules(node, path)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("minisgl.") and " " not in node.value:
                found.append((node.lineno, node.value))
    return found


def runtime_nodes(tree: ast.Module) -> list[ast.AST]:
    """The nodes that run: not annotations, and not `if TYPE_CHECKING:` blocks (type-only
    names of later chapters are allowed: they are never imported at run time)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        for annotation in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if isinstance(annotation, ast.AST):
                skipped.update(id(n) for n in ast.walk(annotation))
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def later_mentions(course: Course, k: int) -> list[tuple[str, int, str]]:
    """Where the files of snapshot k (reference code) mention a later chapter's module or
    name at run time: (path, line, what), one per mention. Files brought in early are given
    code, and count as present."""
    later = later_names(course, k)
    present = course.files(k)
    problems: list[tuple[str, int, str]] = []
    for path in sorted(present):
        if path.endswith("__init__.py") or course.file_owner.get(path, NEVER) > k:
            continue  # package lists, and files brought in early as given code
        tree = ast.parse(assemble_file(course, path, k, "reference")[0])
        nodes = runtime_nodes(tree)
        bound = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        bound |= {a.arg for n in nodes if isinstance(n, ast.arguments) for a in n.args}
        for line, module in mentioned_modules(nodes, path):
            files = module_files(course, module)
            if files and not set(files) & present:
                owner = min(course.file_owner[f] for f in files)
                problems.append((path, line, f"imports {module} (chapter {owner})"))
        for node in nodes:
            if isinstance(node, ast.Name) and node.id in later and node.id not in bound:
                where = later[node.id]
                owner = course.file_owner[where]
                problems.append(
                    (path, node.lineno, f"names {node.id} of {where} (chapter {owner})")
                )
    return problems


def imported_files(tree: ast.Module, path: str, present: set[str]) -> set[str]:
    """The files of `present` (paths under minisgl/) that the module at `path` loads with
    its import statements at run time, inside functions too; type-only imports and strings
    do not count (the composition root names every part as a string, loaded lazily)."""
    found: set[str] = set()
    for node in runtime_nodes(tree):
        for module in imported_modules(node, path):
            file = module_path(module)
            found |= {f"{file}.py", f"{file}/__init__.py"} & present
    return found


def import_circles(sources: dict[str, str]) -> list[list[str]]:
    """The import circles among `sources` (path under minisgl/ -> text): every strongly
    connected set of more than one file in the graph of `imported_files`, largest first."""
    present = set(sources)
    graph = {
        path: imported_files(ast.parse(text), path, present) - {path}
        for path, text in sources.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(path: str) -> None:  # Tarjan's algorithm
        index[path] = low[path] = len(index)
        stack.append(path)
        for target in sorted(graph[path]):
            if target not in index:
                visit(target)
                low[path] = min(low[path], low[target])
            elif target in stack:
                low[path] = min(low[path], index[target])
        if low[path] == index[path]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == path:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for path in sorted(graph):
        if path not in index:
            visit(path)
    return sorted(circles, key=len, reverse=True)
