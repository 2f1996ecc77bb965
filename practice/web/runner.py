"""Run a practice problem's tests without pytest: the judge of the browser (Pyodide).

Pyodide has the standard library but no pytest, so this module runs `test.py` itself: it
makes the student's code importable as `submission`, loads the tests as a fresh module, and
calls every `test_*` function (one call per parameter set) in the order they are written.
The tests use three things from pytest, so a small stand-in module called `pytest` provides
them: `pytest.mark.parametrize`, `pytest.raises` and `pytest.approx`.

The site's Web Worker and the CI check under node (practice/web/check.mjs) both load this
file into Pyodide and call `run_json`; the result is JSON:

    {"error": "", "tests": [{"name": ..., "passed": ..., "message": ...}], "output": "..."}

`error` is set when the tests could not run at all (a syntax error, a failing import).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
import traceback
import types
from typing import Any, Callable, Iterator

SAMPLE_PREFIX = "test_example"  # the samples, as tools/course/problems.py names them
SUBMISSION = "submission"  # the module name the tests import the student's code from
SUBMISSION_FILE = "submission.py"  # the file name errors point at
TESTS = "test_submission"  # the tests' module name (as judge.py names the file)


# --- the stand-in for pytest ---------------------------------------------------------------


class _Mark:
    """`pytest.mark`: only `parametrize` is supported."""

    @staticmethod
    def parametrize(
        argnames: str,
        argvalues: list[Any],
        ids: list[str] | Callable[[Any], str | None] | None = None,
    ) -> Callable[[Callable], Callable]:
        names = [name.strip() for name in argnames.split(",")]

        def mark(test: Callable) -> Callable:
            cases = []
            for index, values in enumerate(argvalues):
                args = dict(zip(names, values if len(names) > 1 else (values,)))
                cases.append((_case_id(args, index, ids), args))
            # As in pytest, stacked decorators combine and the one farthest from the function
            # varies fastest; the ids read from the nearest one out.
            inner = getattr(test, "_parametrize", [("", {})])
            test._parametrize = [
                (f"{inner_id}-{case_id}" if inner_id else case_id, {**inner_args, **args})
                for inner_id, inner_args in inner
                for case_id, args in cases
            ]
            return test

        return mark


class _ExceptionInfo:
    """What `with pytest.raises(...) as info` binds: after the block, `info.value` is the
    exception raised and `info.type` its class."""

    value: BaseException | None = None
    type: type[BaseException] | None = None


@contextlib.contextmanager
def _raises(
    expected: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None
) -> Iterator[_ExceptionInfo]:
    """`pytest.raises`: the block must raise `expected` (whose message matches `match`)."""
    info = _ExceptionInfo()
    try:
        yield info
    except expected as error:
        if match is not None and not re.search(match, str(error)):
            raise AssertionError(
                f"{type(error).__name__}({str(error)!r}) does not match {match!r}"
            ) from None
        info.value, info.type = error, type(error)
        return
    names = getattr(expected, "__name__", None) or " or ".join(e.__name__ for e in expected)
    raise AssertionError(f"DID NOT RAISE {names}")


class _Approx:
    """`pytest.approx`: equal to a number (or each number of a list or tuple) within
    pytest's default tolerance, a relative 1e-6 or an absolute 1e-12."""

    def __init__(self, expected: Any, rel: float = 1e-6, abs: float = 1e-12) -> None:  # noqa: A002
        self.expected, self.rel, self.abs = expected, rel, abs

    def _close(self, got: Any, want: Any) -> bool:
        return isinstance(got, (int, float)) and math.isclose(
            got, want, rel_tol=self.rel, abs_tol=self.abs
        )

    def __eq__(self, got: object) -> bool:
        if isinstance(self.expected, (list, tuple)):
            return (
                isinstance(got, (list, tuple))
                and len(got) == len(self.expected)
                and all(self._close(g, w) for g, w in zip(got, self.expected))
            )
        return self._close(got, self.expected)

    def __repr__(self) -> str:
        return f"approx({self.expected!r})"


def _pytest_module() -> types.ModuleType:
    module = types.ModuleType("pytest", "The parts of pytest that practice tests use.")
    module.mark = _Mark()
    module.raises = _raises
    module.approx = _Approx
    return module


# --- running -------------------------------------------------------------------------------


def _line_in_submission(error: BaseException) -> str:
    """` (raised at submission.py:LINE)` for the deepest frame in the student's code."""
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(error.__traceback__)
        if frame.filename == SUBMISSION_FILE
    ]
    return f" (raised at {SUBMISSION_FILE}:{lines[-1]})" if lines else ""


def _describe(error: BaseException) -> str:
    """An assertion's own message, or `TypeName: message` for anything else."""
    if isinstance(error, AssertionError) and str(error):
        return str(error) + _line_in_submission(error)
    if isinstance(error, AssertionError):
        frame = traceback.extract_tb(error.__traceback__)[-1]
        return f"assertion failed: {frame.line} (line {frame.lineno})"
    return f"{type(error).__name__}: {error}" + _line_in_submission(error)


def _load_module(name: str, source: str, filename: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # before exec: dataclasses look their module up here
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _case_id(
    args: dict[str, Any], index: int, ids: list[str] | Callable[[Any], str | None] | None
) -> str:
    """pytest's name for a parameter set: its `ids` entry, else the values if they are short
    scalars, else the argument names with the set's index."""
    if isinstance(ids, (list, tuple)):
        return str(ids[index])
    parts = []
    for name, value in args.items():
        named = ids(value) if callable(ids) else None
        simple = isinstance(value, (int, float, str, bool, type(None))) and len(str(value)) <= 40
        parts.append(
            str(named) if named is not None else str(value) if simple else f"{name}{index}"
        )
    return "-".join(parts)


def _test_calls(module: types.ModuleType) -> list[tuple[str, Callable[[], Any]]]:
    """(name, call) for every test of the module, parameter sets expanded, in source order."""
    calls = []
    for name, test in list(vars(module).items()):
        if not name.startswith("test_") or not callable(test):
            continue
        cases = getattr(test, "_parametrize", None)
        if cases is None:
            calls.append((name, test))
            continue
        for case_id, args in cases:
            calls.append((f"{name}[{case_id}]", lambda test=test, args=args: test(**args)))
    return calls


def run(submission: str, tests: str, samples_only: bool = False) -> dict[str, Any]:
    """Run the tests (`test.py`'s source) on the student's code (`submission`'s source)."""
    result: dict[str, Any] = {"error": "", "tests": [], "output": ""}
    output = io.StringIO()
    saved = {name: sys.modules.get(name) for name in ("pytest", SUBMISSION, TESTS)}
    sys.modules["pytest"] = _pytest_module()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            result["error"], calls = _collect(submission, tests)
            for name, call in calls:
                if samples_only and not name.startswith(SAMPLE_PREFIX):
                    continue
                try:
                    call()
                except (Exception, SystemExit) as error:  # a failing test (SystemExit too)
                    result["tests"].append(
                        {"name": name, "passed": False, "message": _describe(error)}
                    )
                else:
                    result["tests"].append({"name": name, "passed": True, "message": ""})
    finally:  # leave the interpreter as it was: the next run starts afresh
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    result["output"] = output.getvalue()
    return result


def _collect(submission: str, tests: str) -> tuple[str, list[tuple[str, Callable[[], Any]]]]:
    """Import the student's code, then the tests: ("", the test calls) or (why not, [])."""
    try:
        _load_module(SUBMISSION, submission, SUBMISSION_FILE)
    except SyntaxError as error:
        return f"{SUBMISSION_FILE}:{error.lineno}: SyntaxError: {error.msg}", []
    except (Exception, SystemExit) as error:  # any error at import is theirs
        return f"{SUBMISSION_FILE} failed to import: {_describe(error)}", []
    try:
        module = _load_module(TESTS, tests, f"{TESTS}.py")
    except (Exception, SystemExit) as error:  # e.g. a name they lack
        return f"the tests could not import your code: {_describe(error)}", []
    return "", _test_calls(module)


def run_json(submission: str, tests: str, samples_only: bool = False) -> str:
    """`run`, as JSON text (what crosses from Python to JavaScript)."""
    return json.dumps(run(submission, tests, samples_only))
