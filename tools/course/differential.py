"""Differential tests: a student's stub against the reference's, on the same inputs.

Every stub has an exact contract (its docstring) and an exact implementation of it (its body in
solutions/minisgl/). The chapter tests compare the two on generated inputs, so a mistake nobody
listed fails too:

    from course.differential import assert_same_call
    assert_same_call(DecodeManager.schedule_next_batch, manager)   # manager: the student's type

The reference body is compiled into the student's own module (`reference_function`): it sees the
student's classes and the student's other functions, runs on an equal deep copy of the very same
inputs, and so any difference is this one stub's. The comparison covers the return value (type,
dtype, device, shape, value), every change to the arguments and to `self`, and exceptions (the
type, and the names the reference's message gives).

Where a stub shows only through a loop (the scheduler's), a test records a trace of events from
the student's code and from the code with the chapter's reference bodies in
(`use_reference_stubs`), and `first_difference` says where the two part.
"""

from __future__ import annotations

import __future__
import ast
import copy
import dataclasses
import enum
import inspect
import math
import re
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from course.paths import ROOT
from course.source import find_definition

SOLUTIONS = ROOT / "solutions"
PACKAGE = "minisgl"
# Decorators the reference function is built without: the caller gets the plain function and
# wraps it as the student's attribute is wrapped (see `use_reference_stubs`).
DESCRIPTORS = {"property", "staticmethod", "classmethod", "cached_property"}
MAX_DIFFERENCES = 6  # a report lists this many, the first ones met


def solutions_file(module_name: str) -> Path:
    """minisgl.scheduler.decode -> solutions/minisgl/scheduler/decode.py (or .../__init__.py)."""
    parts = module_name.split(".")
    base = SOLUTIONS.joinpath(*parts)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _is_descriptor(decorator: ast.expr) -> bool:
    name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", "")
    return name in DESCRIPTORS or name in {"setter", "getter", "deleter"}


@cache
def _reference_code(module_name: str, qualname: str) -> tuple[types.CodeType, str, str | None]:
    """The compiled definition of the reference function (inside a class of its owner's name
    for a method, so private names mangle and super() compiles as in the reference), the
    function's name, and that class's name."""
    path = solutions_file(module_name)
    node = find_definition(path.read_text("utf-8"), qualname)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TypeError(f"{qualname} in {path} is not a function")
    node.decorator_list = [d for d in node.decorator_list if not _is_descriptor(d)]
    owner = qualname.rpartition(".")[0].rpartition(".")[2] or None
    definition: ast.stmt = node
    if owner is not None:
        definition = ast.ClassDef(name=owner, bases=[], keywords=[], body=[node], decorator_list=[])
        ast.copy_location(definition, node)
    module = ast.Module(body=[definition], type_ignores=[])
    ast.fix_missing_locations(module)
    # As the reference file is compiled: annotations stay unevaluated. Its own line numbers
    # stay too, so a traceback points into solutions/.
    flags = __future__.annotations.compiler_flag
    return compile(module, str(path), "exec", flags=flags, dont_inherit=True), node.name, owner


def reference_function(owner: type | types.ModuleType, name: str) -> Callable[..., Any]:
    """The reference's body of `owner.name`, compiled with the globals of the student's module
    that defines `owner`: a plain function (take `self` first for a method), decorators such as
    `torch.no_grad()` kept, `property`/`staticmethod` left to the caller."""
    module = sys.modules[owner.__module__] if isinstance(owner, type) else owner
    qualname = f"{owner.__qualname__}.{name}" if isinstance(owner, type) else name
    code, function_name, class_name = _reference_code(module.__name__, qualname)
    namespace = module.__dict__
    # The definition runs at the top of the student's module, so the body's names are the
    # student's globals; the name it binds there is put back at once.
    bound = class_name or function_name
    missing = object()
    before = namespace.get(bound, missing)
    try:
        exec(code, namespace)
        built = namespace[bound]
    finally:
        if before is missing:
            namespace.pop(bound, None)
        else:
            namespace[bound] = before
    function = built.__dict__[function_name] if class_name is not None else built
    if isinstance(function, (staticmethod, classmethod)):
        function = function.__func__
    if isinstance(owner, type) and isinstance(function, types.FunctionType):
        function = _with_class_cell(function, owner)
    if isinstance(function, types.FunctionType):
        function.__qualname__ = f"reference {qualname}"
    return function


def _with_class_cell(function: types.FunctionType, owner: type) -> types.FunctionType:
    """`function` with its __class__ cell (what super() reads) holding the student's class,
    not the stand-in class it was compiled in."""
    code = function.__code__
    if "__class__" not in code.co_freevars:
        return function
    cells = dict(zip(code.co_freevars, function.__closure__ or ()))
    cells["__class__"] = types.CellType(owner)
    rebuilt = types.FunctionType(
        code,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        tuple(cells[v] for v in code.co_freevars),
    )
    rebuilt.__kwdefaults__ = function.__kwdefaults__
    rebuilt.__dict__.update(function.__dict__)
    return rebuilt


# --- comparing two results -------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """How close floating-point values must be (torch.allclose's rtol and atol); exact by
    default, as most stubs state."""

    rtol: float = 0.0
    atol: float = 0.0


EXACT = Tolerance()


def describe(value: Any, limit: int = 160) -> str:
    """A short text of a value for a report (its type and public fields where its repr fails,
    as a dataclass's does while a field is still unset)."""
    import torch

    if isinstance(value, torch.Tensor):
        body = value.tolist() if value.numel() <= 16 else f"{value.numel()} values"
        return f"tensor({body}, dtype={value.dtype}, device={value.device})"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any repr may fail on a half-built object
        text = ""
    if not text or re.fullmatch(r"<.* object at 0x[0-9a-f]+>", text):
        fields = ", ".join(f"{k}={describe(v, 60)}" for k, v in (_fields(value) or {}).items())
        text = f"{type(value).__name__}({fields})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fields(value: Any) -> dict[str, Any] | None:
    """An object's public state as a dict (its __dict__ and __slots__ without the names that
    start with "_": a stub's contract speaks of the public fields, and private ones may hold
    scratch memory), or None for a plain value."""
    if isinstance(value, (type, types.ModuleType)):
        return None
    state: dict[str, Any] = dict(vars(value)) if hasattr(value, "__dict__") else {}
    for klass in type(value).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if hasattr(value, slot):
                state[slot] = getattr(value, slot)
    if not state and not hasattr(value, "__dict__") and not hasattr(type(value), "__slots__"):
        return None
    return {name: field for name, field in state.items() if not name.startswith("_")}


def differences(
    yours: Any, reference: Any, where: str = "result", tolerance: Tolerance = EXACT
) -> list[str]:
    """Where `yours` and `reference` differ, each as "where: yours X, the reference's Y" (the
    first MAX_DIFFERENCES found, depth first). Objects compare by type name and state, so values
    built from different copies of the same classes compare too."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()

    def note(path: str, a: Any, b: Any, what: str = "") -> None:
        found.append(f"{path}{what}: yours {describe(a)}, the reference's {describe(b)}")

    def visit(a: Any, b: Any, path: str) -> None:
        if len(found) >= MAX_DIFFERENCES:
            return
        import torch

        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                return note(path, a, b)
            for what in ("dtype", "device", "shape"):
                if getattr(a, what) != getattr(b, what):
                    return note(path, getattr(a, what), getattr(b, what), f" ({what})")
            if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()):
                if not torch.equal(a.cpu(), b.cpu()):
                    return note(path, a, b)
            elif not torch.allclose(
                a.cpu().double(), b.cpu().double(), tolerance.rtol, tolerance.atol, equal_nan=True
            ):
                worst = (a.cpu().double() - b.cpu().double()).abs().nan_to_num(math.inf).max()
                return note(path, a, b, f" (largest difference {worst.item():.3g})")
            return None
        key = (id(a), id(b))
        if key in seen:  # shared or cyclic structure: compared once
            return None
        seen.add(key)
        if type(a).__name__ != type(b).__name__:
            return note(path, a, b, " (type)")
        if isinstance(a, float) and isinstance(b, float):
            if not (a == b or math.isnan(a) and math.isnan(b)):
                if not math.isclose(a, b, rel_tol=tolerance.rtol, abs_tol=tolerance.atol):
                    note(path, a, b)
            return None
        if isinstance(a, (int, str, bytes, bool, type(None), enum.Enum, range, complex)):
            if a != b:
                note(path, a, b)
            return None
        if isinstance(a, Mapping):
            if list(a.keys()) != list(b.keys()):
                return note(path, list(a.keys()), list(b.keys()), " (keys, in order)")
            for k in a:
                visit(a[k], b[k], f"{path}[{k!r}]")
            return None
        if isinstance(a, (list, tuple)):
            if len(a) != len(b):
                return note(path, a, b, f" (length {len(a)} against {len(b)})")
            for i, (x, y) in enumerate(zip(a, b)):
                visit(x, y, f"{path}[{i}]")
            return None
        if type(a).__module__ == "numpy":
            import numpy

            if not numpy.array_equal(a, b):
                note(path, a, b)
            return None
        if isinstance(a, (set, frozenset)):
            if a != b:
                note(path, sorted(a, key=repr), sorted(b, key=repr))
            return None
        if callable(a) and not hasattr(a, "__dict__"):
            return None  # a builtin or bound method: nothing of the state to compare
        fa, fb = _fields(a), _fields(b)
        if fa is None or fb is None:
            if a != b:
                note(path, a, b)
            return None
        for name in sorted(set(fa) | set(fb)):
            if name not in fa or name not in fb:
                note(f"{path}.{name}", fa.get(name, "<missing>"), fb.get(name, "<missing>"))
                continue
            visit(fa[name], fb[name], f"{path}.{name}")
        return None

    visit(yours, reference, where)
    return found


# --- one call of a stub, both ways ------------------------------------------------------------


@dataclass
class Outcome:
    """What one call did: its result or the exception it raised, and its arguments after."""

    result: Any = None
    error: BaseException | None = None
    arguments: tuple[Any, ...] = ()
    keywords: dict[str, Any] = dataclasses.field(default_factory=dict)


def _call(
    function: Callable[..., Any], args: tuple, kwargs: dict, build: Callable[[], tuple] | None
) -> Outcome:
    if build is not None:  # keyword arguments go with built ones too (a keyword-only flag)
        args, kwargs = build(), copy.deepcopy(kwargs)
    else:
        args, kwargs = copy.deepcopy((args, kwargs))
    try:
        return Outcome(function(*args, **kwargs), None, args, kwargs)
    except Exception as error:  # the comparison decides whether raising was right
        return Outcome(None, error, args, kwargs)


def _error_names(message: str, args: tuple, kwargs: dict, function: Callable[..., Any]) -> set[str]:
    """The words of an error message that name a parameter or a field of an argument."""
    names = set(kwargs)
    try:
        names |= set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        pass
    for value in (*args, *kwargs.values()):
        names |= set(_fields(value) or ())
    return {word for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message) if word in names}


def call_differences(
    stub: Callable[..., Any],
    *args: Any,
    tolerance: Tolerance = EXACT,
    reference: Callable[..., Any] | None = None,
    build: Callable[[], tuple] | None = None,
    observe: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> list[str]:
    """Call the student's `stub` and the reference's on equal deep copies of the arguments
    (or on two tuples of them, each made by `build()`, for inputs deepcopy cannot copy
    faithfully); the differences in result, raised exception, and arguments after the call
    (`self` first for a method: pass the unbound method, `Class.method`, and the object).

    With `observe`, what is compared besides exceptions is `observe(result, *arguments)` of
    each side, after the call, instead of the result and the arguments: for state the
    contract speaks of in a private field (a pool's buffer), or for the part of a result the
    contract fixes where it leaves the rest free."""
    reference = reference or reference_of(stub)
    mine, theirs = _call(stub, args, kwargs, build), _call(reference, args, kwargs, build)
    args = mine.arguments
    if mine.error is not None or theirs.error is not None:
        raised = (
            f"raised: yours {_exception(mine.error)}, the reference's {_exception(theirs.error)}"
        )
        if isinstance(theirs.error, NotImplementedError):
            # The reference's body called code of the student's that is still a stub: never a
            # match, or a skeleton would pass wherever both sides stop at the same stub.
            return [f"{raised} (the reference's body calls code of yours not written yet)"]
        if mine.error is None or theirs.error is None:
            return [raised]
        if type(mine.error).__name__ != type(theirs.error).__name__:
            return [raised]
        wanted = _error_names(str(theirs.error), args, kwargs, reference)
        missing = {w for w in wanted if w not in str(mine.error)}
        if missing:
            return [
                f"error message: yours {str(mine.error)!r} does not name {sorted(missing)}, "
                f"as the reference's {str(theirs.error)!r} does"
            ]
        return []
    if observe is not None:
        seen = [observe(o.result, *o.arguments, **o.keywords) for o in (mine, theirs)]
        return differences(*seen, "what is observed after the call", tolerance)[:MAX_DIFFERENCES]
    names = _argument_names(stub, len(args))
    found = differences(mine.result, theirs.result, "return value", tolerance)
    for name, a, b in zip(names, mine.arguments, theirs.arguments):
        found += differences(a, b, name, tolerance)
    for name in kwargs:
        found += differences(mine.keywords[name], theirs.keywords[name], name, tolerance)
    return found[:MAX_DIFFERENCES]


def _exception(error: BaseException | None) -> str:
    return "nothing" if error is None else f"{type(error).__name__}({str(error)!r})"


def _argument_names(function: Callable[..., Any], count: int) -> list[str]:
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) else f"argument {i}" for i in range(count)]


def reference_of(stub: Callable[..., Any]) -> Callable[..., Any]:
    """The reference function of a student's function or unbound method."""
    function = inspect.unwrap(stub.fget if isinstance(stub, property) else stub)
    module = sys.modules[function.__module__]
    owner_name, _, name = function.__qualname__.rpartition(".")
    owner: type | types.ModuleType = module
    for part in filter(None, owner_name.split(".")):
        owner = getattr(owner, part)
    return reference_function(owner, name)


def assert_same_call(
    stub: Callable[..., Any],
    *args: Any,
    tolerance: Tolerance = EXACT,
    build: Callable[[], tuple] | None = None,
    observe: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> None:
    """Fail, naming the stub and showing both sides, where the student's call and the
    reference's differ (see `call_differences`, which says what `observe` does)."""
    found = call_differences(
        stub, *args, tolerance=tolerance, build=build, observe=observe, **kwargs
    )
    args = args or (build() if build is not None else ())
    if found:
        function = inspect.unwrap(stub.fget if isinstance(stub, property) else stub)
        where = f"{function.__qualname__} ({_student_file(function)})"
        raise AssertionError(
            f"{where} differs from the reference on these inputs:\n  "
            + "\n  ".join(found)
            + f"\ninputs: {', '.join(describe(a) for a in args)}"
            + "".join(f", {k}={describe(v)}" for k, v in kwargs.items())
        )


def _student_file(function: Callable[..., Any]) -> str:
    name = function.__module__
    return f"{PACKAGE}/{Path(*name.split('.')[1:])}.py" if name.startswith(PACKAGE) else name


# --- the chapter's reference bodies in place, for trace tests ----------------------------------


def chapter_stubs(chapter: int) -> list[str]:
    """Chapter `chapter`'s stubs as its manifest lists them ("path:Class.method")."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib
    folder = next((ROOT / "chapters").glob(f"ch{chapter:02d}_*"))
    return list(tomllib.loads((folder / "chapter.toml").read_text("utf-8"))["stubs"])


@contextmanager
def use_reference_stubs(chapter: int, only: set[str] | None = None) -> Iterator[None]:
    """Within the block, chapter `chapter`'s stubs (or those of `only`, "path:Class.method")
    run the reference's bodies; the student's come back after it. Module functions are put back
    everywhere a student module imported them by name."""
    import importlib

    swaps: list[tuple[Any, str, Any]] = []
    for stub in chapter_stubs(chapter):
        if only is not None and stub not in only:
            continue
        path, _, qualname = stub.partition(":")
        dotted = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        module = importlib.import_module(f"{PACKAGE}.{dotted}")
        owner: Any = module
        *classes, name = qualname.split(".")
        for part in classes:
            owner = getattr(owner, part)
        reference = reference_function(owner, name)
        current = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        if isinstance(current, property):
            replacement: Any = property(reference, current.fset, current.fdel, current.__doc__)
        elif isinstance(current, staticmethod):
            replacement = staticmethod(reference)
        elif isinstance(current, classmethod):
            replacement = classmethod(reference)
        else:
            replacement = reference
        swaps.append((owner, name, current))
        setattr(owner, name, replacement)
        if not isinstance(owner, type):
            for other in list(sys.modules.values()):
                if getattr(other, "__name__", "").startswith(PACKAGE) and other is not owner:
                    if other.__dict__.get(name) is current:
                        swaps.append((other, name, current))
                        setattr(other, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in reversed(swaps):
            setattr(owner, name, original)


def first_difference(yours: list[str], reference: list[str]) -> str | None:
    """Where two traces of events part, in words; None when they are the same. Each event is
    a sentence ("step 7: admitted request 3 (prompt 12)")."""
    for i, (a, b) in enumerate(zip(yours, reference)):
        if a != b:
            before = f" after {reference[i - 1]!r}" if i else ""
            return f"event {i + 1}{before}: yours {a!r}; the reference's {b!r}"
    if len(yours) != len(reference):
        shorter, longer = (yours, reference) if len(yours) < len(reference) else (reference, yours)
        who = "yours" if shorter is yours else "the reference's"
        return f"{who} ends after {len(shorter)} events; the other's next: {longer[len(shorter)]!r}"
    return None
