"""How the reference engine is put together, checked on `solutions/minisgl` (docs/maintainers.md,
"How the engine is put together"): no import circle of more than two modules, no object
replacing another's methods, and no object using another class's private members.

A later chapter joins through a row of `features.py` and the public surface of what it extends
(for a step policy: the scheduler's `finish_reason`, `append_tokens`, `release` and managers),
so a reader can follow the control flow from the files themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

from course.layering import import_circles

ENGINE = Path(__file__).resolve().parents[1] / "solutions" / "minisgl"


def engine_sources() -> dict[str, str]:
    """Every module of the reference engine: path under minisgl/ -> text."""
    return {str(path.relative_to(ENGINE)): path.read_text() for path in ENGINE.rglob("*.py")}


def engine_trees() -> dict[str, ast.Module]:
    return {path: ast.parse(text) for path, text in engine_sources().items()}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def is_own(node: ast.expr) -> bool:
    """`self`, `cls` or `super()`: an object reaching into itself."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {ast.unparse(d).split(".")[-1] for d in node.decorator_list}


def class_methods(cls: ast.ClassDef) -> set[str]:
    """The methods a class defines (not its properties, whose assignment is their purpose)."""
    return {
        node.name
        for node in cls.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and not decorator_names(node) & {"property", "setter", "cached_property"}
    }


def private_names(trees: dict[str, ast.Module]) -> set[str]:
    """Every private name the engine defines: module constants and functions, class members,
    and the attributes its objects give themselves (`self._x = ...`)."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if is_own(node.value):  # not a library's private name, patched from outside
                    names.add(node.attr)
    return {name for name in names if is_private(name)}


def assigned_attributes(tree: ast.Module) -> list[tuple[ast.Attribute, ast.ClassDef | None]]:
    """Every attribute assigned (`x.a = ...`, `setattr(x, "a", ...)` as a pseudo-attribute),
    with the class whose code assigns it (None at module level)."""
    found: list[tuple[ast.Attribute, ast.ClassDef | None]] = []

    def visit(node: ast.AST, cls: ast.ClassDef | None) -> None:
        if isinstance(node, ast.ClassDef):
            cls = node
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            targets = [
                ast.Attribute(node.args[0], node.args[1].value, ast.Store(), lineno=node.lineno)
            ]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store):
                    found.append((part, cls))
        for child in ast.iter_child_nodes(node):
            visit(child, cls)

    visit(tree, None)
    return found


def test_no_import_circle_of_more_than_two_modules() -> None:
    """Imports inside functions count; type-only imports and the composition root's strings do
    not. A circle means a lower layer reaches up: move the code or the import to where it
    belongs instead of hiding it inside a function."""
    circles = [c for c in import_circles(engine_sources()) if len(c) > 2]
    assert not circles, "import circles in solutions/minisgl:\n" + "\n".join(map(str, circles))


def test_no_object_assigns_a_method_of_another() -> None:
    """A later chapter is chosen where its part is built (a row of features.py), never patched
    onto a live object: no `x.method = ...` for any method of the engine's classes."""
    trees = engine_trees()
    methods = set().union(
        *(
            class_methods(n)
            for t in trees.values()
            for n in ast.walk(t)
            if isinstance(n, ast.ClassDef)
        )
    )
    problems = []
    for path, tree in trees.items():
        for target, cls in assigned_attributes(tree):
            own = is_own(target.value)
            if (own and cls is not None and target.attr in class_methods(cls)) or (
                not own and target.attr in methods
            ):
                problems.append(f"{path}:{target.lineno}: {ast.unparse(target)} = ...")
    for path, text in engine_sources().items():
        problems += [
            f"{path}:{i}: {line.strip()}"
            for i, line in enumerate(text.splitlines(), 1)
            if "method-assign" in line
        ]
    assert not problems, "methods replaced at run time:\n" + "\n".join(problems)


def test_no_object_uses_another_objects_private_members() -> None:
    """`x._name` only where x is the object itself (`self`, `cls`, `super()`): what another
    part needs is public (the scheduler's `release`, the cache manager's `free`)."""
    trees = engine_trees()
    private = private_names(trees)
    problems = [
        f"{path}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in private and not is_own(node.value)
    ]
    assert not problems, "private members used from outside:\n" + "\n".join(problems)
