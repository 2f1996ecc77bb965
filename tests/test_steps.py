"""Tests of tools/steps.py, the chapter builder and judge (docs/maintainers.md).

Most tests run on a small fake course written to a temporary git repository: three chapters
of a calculator package, with real subprocess runs that take a second each. Text-only checks
also run on the real chapters (skeletons of chapter 0, early files of chapter 3, sync).
"""

from __future__ import annotations

import ast
import csv
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import steps  # noqa: E402
from course.manifest import Course  # noqa: E402
from course.mutate import (  # noqa: E402
    MIN_PER_CHAPTER,
    REPORT,
    TARGET_KILL_RATE,
    load_mutations,
    sources_digest,
)
from course.snapshot import assemble_file, build_snapshot, skeleton_text  # noqa: E402
from course.source import functions, is_unwritten  # noqa: E402

CALC = '''"""A calculator."""

import math  # a comment that must survive


def add(a: int, b: int) -> int:
    """Return a + b."""
    # how: the plus operator
    return a + b


def mul(a: int, b: int) -> int:
    """Return a * b."""
    return a * b


def sub(a: int, b: int) -> int:
    """Return a - b."""
    return a - b


class Acc:
    """An accumulator."""

    def __init__(self) -> None:
        self.items: list[int] = []

    @property
    def total(self) -> int:
        """The sum of the items."""
        return math.fsum(self.items)

    def push(self, x: int) -> None:
        self.items.append(x)
'''
EXTRA_INIT = '"""Extras."""\n\nfrom .double import double\nfrom .triple import (\n    triple,\n)\n'
DOUBLE = 'def double(x: int) -> int:\n    """Return 2 * x."""\n    return 2 * x\n'
TEST_0 = """from minisgl.calc import Acc, add


def test_add():
    assert add(2, 3) == 5


def test_total():
    acc = Acc()
    acc.push(2)
    acc.push(3)
    assert acc.total == 5
"""
TEST_1 = """from minisgl.calc import mul
from minisgl.extra import double


def test_double():
    assert double(4) == 8


def test_mul():
    assert mul(2, 3) == 6
"""
TEST_2 = """from minisgl.calc import sub
from minisgl.extra import triple


def test_triple():
    assert triple(2) == 6


def test_sub():
    assert sub(3, 2) == 1
"""
FILES = {
    "solutions/minisgl/__init__.py": '"""Fake engine."""\n',
    "solutions/minisgl/calc.py": CALC,
    "solutions/minisgl/extra/__init__.py": EXTRA_INIT,
    "solutions/minisgl/extra/double.py": DOUBLE,
    "solutions/minisgl/extra/triple.py": "def triple(x: int) -> int:\n    return 3 * x\n",
    "examples/ch00_basics.py": "from minisgl.calc import add\nprint('2 + 3 =', add(2, 3))\n",
    "examples/ch01_extra.py": "from minisgl.extra import double\nprint('double 4 =', double(4))\n",
    "examples/ch02_triple.py": "from minisgl.extra import triple\nprint(triple(2))\n",
    "tests/test_ch00_basics.py": TEST_0,
    "tests/test_ch01_extra.py": TEST_1,
    "tests/test_ch02_triple.py": TEST_2,
}
MANIFESTS = {  # number: (slug, new, modified, stubs, early)
    0: (
        "basics",
        ["__init__.py", "calc.py"],
        [],
        ["calc.py:add", "calc.py:Acc.total"],
        ["calc.py:mul"],
    ),
    1: (
        "extra",
        ["extra/__init__.py", "extra/double.py"],
        ["calc.py"],
        ["extra/double.py:double", "calc.py:mul"],
        [],
    ),
    2: ("triple", ["extra/triple.py"], ["calc.py"], ["extra/triple.py:triple", "calc.py:sub"], []),
}


def torch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


@pytest.fixture
def course(tmp_path: Path) -> Path:
    """A committed fake course repository with three chapters and synced skeletons."""
    for path, text in FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    for k, (slug, new, modified, stubs, early) in MANIFESTS.items():
        folder = tmp_path / "chapters" / f"ch{k:02d}_{slug}"
        folder.mkdir(parents=True)
        (folder / "chapter.toml").write_text(
            f'number = {k}\nslug = "{slug}"\ntitle = "Chapter {k}"\nstage = 0\n'
            f'docs = "docs/chapters/ch{k:02d}_{slug}.md"\nmain = "examples/ch{k:02d}_{slug}.py"\n'
            f'tests = "tests/test_ch{k:02d}_{slug}.py"\nnew = {toml_list(new)}\n'
            f"modified = {toml_list(modified)}\nstubs = {toml_list(stubs)}\n"
            f"early = {toml_list(early)}\n"
        )
    (tmp_path / ".gitignore").write_text("work/\nbuild/\n")
    assert steps.main(["--root", str(tmp_path), "sync"]) == 0
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "course"], cwd=tmp_path, check=True)
    return tmp_path


def steps_command(root: Path, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "tools" / "steps.py"), "--root", str(root), *args]


def run(root: Path, *args: str) -> tuple[int, str]:
    """Run steps.py as a student would; return (exit code, plain output)."""
    proc = subprocess.run(steps_command(root, *args), capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def start_interruptible(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start steps.py as a student does in a terminal, where Ctrl-C reaches it: SIGINT gets its
    default disposition in the child, even when this test run inherited it ignored (a shell's
    background job ignores SIGINT, and a Python started so never raises KeyboardInterrupt)."""
    return subprocess.Popen(
        steps_command(root, *args),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def write_student_calc(root: Path, **bodies: str) -> None:
    """Write one-line bodies into work/minisgl/calc.py in place of the stubs (total: Acc.total)."""
    path = root / "work" / "minisgl" / "calc.py"
    lines = path.read_text().splitlines(keepends=True)
    found = functions(ast.parse("".join(lines)))
    for name, body in bodies.items():
        node = found["Acc.total" if name == "total" else name][0]
        assert "raise NotImplementedError" in lines[node.end_lineno - 1], f"{name} is no stub"
        indent = lines[node.end_lineno - 1][: node.body[-1].col_offset]
        lines[node.end_lineno - 1] = f"{indent}{body}\n"
    path.write_text("".join(lines))


# --- stubs, skeletons and snapshots ---------------------------------------------------------


def test_skeleton_of_chapter_0_replaces_only_bodies_and_names_chapter_and_task():
    course = Course.load(ROOT)
    ref = course.reference("tiny_engine.py")
    skeleton = skeleton_text(course, "tiny_engine.py", 0)
    tree = ast.parse(skeleton)  # still valid Python
    ref_funcs, funcs = functions(ast.parse(ref)), functions(tree)
    for stub in course.chapters[0].stubs:
        symbol = stub.partition(":")[2]
        ours, theirs = funcs[symbol][0], ref_funcs[symbol][0]
        assert ast.dump(ours.args) == ast.dump(theirs.args), f"{symbol}: signature changed"
        assert ast.dump(ours.returns) == ast.dump(theirs.returns)
        dump = lambda nodes: [ast.dump(n) for n in nodes]  # noqa: E731
        assert dump(ours.decorator_list) == dump(theirs.decorator_list)
        assert ast.get_docstring(ours) == ast.get_docstring(theirs)
        assert is_unwritten(ours)
        task = ast.get_docstring(theirs).splitlines()[0]
        assert ours.body[-1].exc.args[0].value == f"ch00: {task}"
    # Every difference is a body turned into exactly one `raise NotImplementedError` line.
    matcher = difflib.SequenceMatcher(None, ref.splitlines(), skeleton.splitlines(), autojunk=False)
    for op, _, _, j1, j2 in matcher.get_opcodes():
        if op != "equal":
            assert op == "replace" and j2 - j1 == 1, skeleton.splitlines()[j1:j2]
            assert 'raise NotImplementedError("ch00: ' in skeleton.splitlines()[j1]


def test_later_symbols_are_stubbed_unless_early_and_properties_keep_their_decorator(course: Path):
    c = Course.load(course)
    snapshot0 = skeleton_text(c, "calc.py", 0)
    assert (
        '    @property\n    def total(self) -> int:\n        """The sum of the items."""\n'
        '        raise NotImplementedError("ch00: The sum of the items.")\n' in snapshot0
    )
    assert 'raise NotImplementedError("written in chapter 2: Return a - b.")' in snapshot0
    assert "    return a * b\n" in snapshot0  # mul: chapter 1's, brought in early by chapter 0
    assert "import math  # a comment that must survive\n" in snapshot0
    assert "# how: the plus operator" not in snapshot0  # part of the body
    assert 'NotImplementedError("ch01: Return a * b.")' in skeleton_text(c, "calc.py", 1)
    triple = skeleton_text(c, "extra/triple.py", 2)
    assert 'raise NotImplementedError("ch02: implement triple")' in triple  # no docstring


def test_init_imports_only_modules_present_in_the_snapshot(course: Path):
    c = Course.load(course)
    one = skeleton_text(c, "extra/__init__.py", 1)
    assert one == '"""Extras."""\n\nfrom .double import double\n'
    snap = build_snapshot(c, 2, "reference", course / "build" / "two")
    assert (snap.root / "minisgl" / "extra" / "__init__.py").read_text() == EXTRA_INIT


def test_real_chapter_3_brings_attention_and_kvcache_in_early():
    course = Course.load(ROOT)
    files = course.files(3)
    assert {"attention/torch_backend.py", "kvcache/mha_pool.py"} <= files
    assert "kvcache/naive_cache.py" not in files
    init = assemble_file(course, "kvcache/__init__.py", 3, "reference")[0]
    assert "naive_cache" not in init and "from .mha_pool import MHAKVCache" in init
    backend = assemble_file(course, "attention/torch_backend.py", 3, "reference")[0]
    assert backend == course.reference("attention/torch_backend.py")  # early: reference bodies


def test_real_skeletons_are_in_sync():
    assert steps.main(["sync", "--check"]) == 0


def test_sync_check_names_a_stale_skeleton(course: Path):
    stale = course / "chapters" / "ch00_basics" / "skeleton" / "calc.py"
    stale.write_text(stale.read_text() + "# edited\n")
    code, out = run(course, "sync", "--check")
    assert code == 1 and "chapters/ch00_basics/skeleton/calc.py" in out
    assert run(course, "sync")[0] == 0 and run(course, "sync", "--check")[0] == 0


def test_manifest_naming_a_missing_symbol_is_rejected(course: Path):
    toml = course / "chapters" / "ch00_basics" / "chapter.toml"
    toml.write_text(toml.read_text().replace("calc.py:add", "calc.py:addition"))
    code, out = run(course, "tree", "0")
    assert code == 2 and "calc.py:addition is defined 0 times" in out


def test_tree_marks_files_and_prints_the_counts_line(course: Path):
    code, out = run(course, "tree", "1")
    assert code == 0
    assert re.search(r"calc\.py\s+\(modified\)", out) and re.search(r"double\.py\s+\(new\)", out)
    assert "Files so far: 4 (2 new, 1 modified, 0 brought in early)" in out
    code, out = run(ROOT, "tree", "3")
    assert code == 0 and re.search(r"torch_backend\.py\s+\(early\)", out)
    assert re.search(r"Files so far: \d+ \(\d+ new, \d+ modified, [1-9]\d* brought in early\)", out)


# --- start: never lose student code ---------------------------------------------------------


def test_start_copies_the_skeleton_and_says_what_to_write_and_where_to_read(course: Path):
    code, out = run(course, "start", "0")
    assert code == 0
    skeleton = skeleton_text(Course.load(course), "calc.py", 0)
    assert (course / "work/minisgl/calc.py").read_text() == skeleton
    assert "Acc.total" in out and "The sum of the items." in out
    assert "docs/chapters/ch00_basics.md" in out
    assert "in progress" in run(course, "list")[1]


def test_start_refuses_to_overwrite_a_changed_file_and_force_keeps_a_backup(course: Path):
    run(course, "start", "0")
    calc = course / "work/minisgl/calc.py"
    calc.write_text(calc.read_text() + "\nMY_CODE = 1\n")
    code, out = run(course, "start", "0")
    assert code == 1 and "refused" in out and "MY_CODE = 1" in calc.read_text()
    code, out = run(course, "start", "0", "--force")
    assert code == 0 and "MY_CODE" not in calc.read_text()
    backups = list(calc.parent.glob("calc.py.bak-*"))
    assert len(backups) == 1 and "MY_CODE = 1" in backups[0].read_text()


def test_start_merges_a_modified_file_keeping_the_students_code(course: Path):
    run(course, "start", "0")
    write_student_calc(course, add="return b + a  # mine", total="return sum(self.items)  # mine")
    calc = course / "work/minisgl/calc.py"
    calc.write_text(calc.read_text() + "\n\ndef my_helper() -> int:\n    return 7\n")
    code, out = run(course, "start", "1")
    assert code == 0 and "merged" in out
    text = calc.read_text()
    assert "return b + a  # mine" in text and "return sum(self.items)  # mine" in text
    assert "def my_helper() -> int:" in text
    assert 'raise NotImplementedError("ch01: Return a * b.")' in text  # mul: early until now
    # Starting again after writing mul keeps it.
    stub = 'raise NotImplementedError("ch01: Return a * b.")'
    calc.write_text(text.replace(stub, "return a * b  # mine"))
    code, out = run(course, "start", "1")
    assert code == 0 and "return a * b  # mine" in calc.read_text() and "kept your mul" in out


# --- test: verdicts ---------------------------------------------------------------------------


def test_correct_student_code_passes_and_is_recorded(course: Path):
    run(course, "start", "0")
    shutil.copy(course / "solutions/minisgl/calc.py", course / "work/minisgl/calc.py")
    code, out = run(course, "test", "0", "--verbose")
    assert code == 0, out
    assert "2 tests passed" in out and "chapter 0 PASSED" in out
    assert "steps.py start 1" in out, "after a pass, the report says what comes next"
    assert re.search(r"minisgl/calc\.py\W+student", out)
    assert re.search(r"minisgl/__init__\.py\W+student", out)
    assert re.search(r"0\W+ch00_basics\W+Chapter 0\W+passed", run(course, "list")[1])


def test_an_unwritten_stub_fails_naming_the_test_and_the_stub(course: Path):
    run(course, "start", "0")
    write_student_calc(course, add="return a + b")  # Acc.total left as the stub
    code, out = run(course, "test", "0")
    assert code == 1
    assert "✗ test_total" in out and "test_add" not in out and "1 passed" in out
    assert "NotImplementedError: ch00: The sum of the items." in out
    assert "This test exercises: Acc.total (not written yet)" in out
    assert "Hint: Acc.total in work/minisgl/calc.py" in out
    assert "steps.py test 0 -k test_total" in out, "the rerun line re-runs on work/"
    assert len(out.splitlines()) <= 40, out


def test_an_exception_in_the_students_code_names_its_file_line_and_stub(course: Path):
    run(course, "start", "0")
    write_student_calc(course, add="return a + b", total="return sum(self.itemz)")
    code, out = run(course, "test", "0")
    assert code == 1 and "AttributeError" in out, out
    assert "raised in Acc.total (work/minisgl/calc.py:" in out, "the student's file and line"
    assert "Hint: Acc.total in work/minisgl/calc.py" in out


def test_earlier_chapters_fall_back_to_the_reference_but_strict_rejects_it(course: Path):
    run(course, "start", "0")
    calc = course / "work/minisgl/calc.py"
    calc.write_text(calc.read_text() + "# chapter 0 skipped\n")
    assert run(course, "start", "1")[0] == 0  # merged: add and total are still the stubs
    write_student_calc(course, mul="return a * b")
    double = course / "work/minisgl/extra/double.py"
    double.write_text(
        double.read_text().replace(
            'raise NotImplementedError("ch01: Return 2 * x.")', "return x + x"
        )
    )
    code, out = run(course, "test", "1", "--verbose")
    assert code == 0, out
    assert re.search(r"Acc\.total\W+calc\.py\W+not written yet", out)
    code, out = run(course, "test", "1", "--strict")
    assert code == 1 and "--strict: 2 symbols of chapters < 1 are not yours yet" in out


def test_all_runs_the_earlier_chapters_across_a_gap_in_the_plan(course: Path):
    """A chapter not written yet leaves a gap in the numbers (docs/maintainers.md)."""
    chapter = course / "chapters/ch02_triple"
    manifest = chapter / "chapter.toml"
    manifest.write_text(manifest.read_text().replace("number = 2", "number = 3"))
    shutil.rmtree(chapter / "skeleton")
    chapter.rename(course / "chapters/ch03_triple")
    assert steps.main(["--root", str(course), "sync"]) == 0
    shutil.copytree(course / "solutions/minisgl", course / "work/minisgl")
    code, out = run(course, "test", "3", "--all")
    assert code == 0, out
    assert "Running chapter 3 tests and chapters 1, 0 on your tree" in out


# --- test: the GPU verdict ---------------------------------------------------------------------

GPU_TEST_0 = """import pytest
from minisgl.calc import add


def test_add_large_numbers():
    assert add(2**40, 1) == 2**40 + 1


@pytest.mark.skip(reason="needs two GPUs")
def test_add_on_two_gpus():
    pass
"""


def with_gpu_tests(course: Path, *tests: str) -> None:
    """Give chapter 0 a GPU test file and name `tests` in its manifest's gpu_tests."""
    (course / "tests/test_gpu_calc.py").write_text(GPU_TEST_0)
    manifest = course / "chapters/ch00_basics/chapter.toml"
    kept = [line for line in manifest.read_text().splitlines() if "gpu_tests" not in line]
    manifest.write_text("\n".join(kept + [f"gpu_tests = {toml_list(list(tests))}"]) + "\n")


def test_a_gpu_test_that_does_not_exist_is_a_manifest_error(course: Path):
    with_gpu_tests(course, "tests/test_gpu_calc.py::test_add_large_numbers[x]")
    assert Course.load(course).inconsistencies() == []
    with_gpu_tests(course, "tests/test_gpu_calc.py::test_nothing", "tests/test_gpu_none.py")
    code, out = run(course, "check", "0")
    assert code == 2, out
    out = " ".join(out.split())
    assert "test_nothing: no such test in tests/test_gpu_calc.py" in out
    assert "gpu_tests: tests/test_gpu_none.py is not a test file under tests/" in out


def test_a_chapter_whose_module_is_missing_is_refused_by_name_and_skipped_by_later_ones(
    course: Path,
):
    """Where a platform lacks a module a chapter `needs` (Triton on macOS), that chapter's
    verdict names it; a later chapter, and `--all`, still run without it."""
    manifest = course / "chapters/ch00_basics/chapter.toml"
    manifest.write_text(manifest.read_text() + 'needs = ["triton", "no_such_module_here"]\n')
    run(course, "start", "0")
    shutil.copy(course / "solutions/minisgl/calc.py", course / "work/minisgl/calc.py")
    code, out = run(course, "test", "0")
    out = " ".join(out.split())
    assert code == 1 and "chapter 0 FAILED: chapter 0 needs no_such_module_here" in out, out
    assert "triton," not in out, "only the missing module is named"
    assert "pip install no_such_module_here" in out, out
    code, out = run(course, "test", "1", "--all")
    out = " ".join(out.split())
    assert "skipped: chapter 0 needs no_such_module_here" in out, out
    assert "chapter 1 tests on your tree" in out, "chapter 1 runs without chapter 0's tests"
    code, out = run(course, "check", "0")
    assert code == 1 and "chapter 0 needs no_such_module_here" in " ".join(out.split()), out


@pytest.mark.skipif(torch_has_cuda(), reason="this machine has CUDA: the GPU tests would run")
def test_without_cuda_the_gpu_tests_are_skipped_in_one_line_that_says_why(course: Path):
    with_gpu_tests(course, "tests/test_gpu_calc.py")
    run(course, "start", "0")
    shutil.copy(course / "solutions/minisgl/calc.py", course / "work/minisgl/calc.py")
    code, out = run(course, "test", "0")
    out = " ".join(out.split())
    assert code == 0 and "chapter 0 PASSED: 2 tests and the main pass" in out, out
    assert (
        "GPU tests skipped (no CUDA device in this environment): tests/test_gpu_calc.py; on a "
        "machine with CUDA and FlashInfer, .venv/bin/python tools/steps.py test 0 runs them too"
    ) in out
    code, out = run(course, "test", "0", "--no-gpu")
    assert code == 0 and "GPU tests skipped (--no-gpu)" in out, out


def test_with_cuda_the_gpu_tests_judge_the_students_tree(
    course: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """torch.cuda.is_available() faked: the judge runs the GPU tests after the CPU tests, in
    the same sandbox, lists the skipped ones with their reason, and a failing one fails the
    chapter by name."""
    from course import gpu

    monkeypatch.setattr(gpu, "probe_devices", lambda tree, cwd: gpu.Devices("Fake H200", True))
    with_gpu_tests(course, "tests/test_gpu_calc.py")
    run(course, "start", "0")
    calc = course / "work/minisgl/calc.py"
    shutil.copy(course / "solutions/minisgl/calc.py", calc)

    def judge() -> tuple[int, str]:
        code = steps.main(["--root", str(course), "test", "0"])
        return code, " ".join(capsys.readouterr().out.split())

    code, out = judge()
    assert code == 0, out
    assert "Running chapter 0's GPU tests on your tree (Fake H200, FlashInfer)" in out
    assert "skipped test_add_on_two_gpus: needs two GPUs" in out
    assert "chapter 0 PASSED: 2 tests, the main and 1 GPU tests pass" in out

    calc.write_text(calc.read_text().replace("return a + b", "return (a + b) % 2**32"))
    code, out = judge()
    assert code == 1 and "2 tests passed" in out, "the CPU tests miss this mistake"
    assert "✗ test_add_large_numbers" in out and "assert 1 == ((2 ** 40) + 1)" in out
    assert "chapter 0 FAILED: the GPU tests fail: test_add_large_numbers" in out
    assert "in progress" in run(course, "list")[1], "a GPU failure is a failed chapter"

    calc.write_text(calc.read_text().replace("return (a + b) % 2**32", "return a - b"))
    code, out = judge()
    assert code == 1, "the GPU tests run also when the CPU tests fail, and say so"
    assert "chapter 0 FAILED: 1 failing tests; the GPU tests fail: test_add_large_numbers" in out


def test_the_sandbox_keeps_the_callers_import_path_after_the_tree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from course.runner import TOOLS, sandbox_env

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", "", "/opt/solutions"]))
    path = sandbox_env(tmp_path)["PYTHONPATH"].split(os.pathsep)
    assert path == [str(tmp_path), str(TOOLS), "/tmp/site", "/opt/solutions"]


def test_mutate_writes_one_mistake_into_a_tree_that_test_work_judges(course: Path, tmp_path: Path):
    (course / "chapters/ch00_basics/mutations.toml").write_text(MUTATIONS_0.format(equivalent=""))
    tree = tmp_path / "skips"
    code, out = run(course, "mutate", "0", "--write", str(tree), "--only", "skips the first")
    assert code == 0 and "math.fsum(self.items[1:])" in (tree / "calc.py").read_text(), out
    code, out = run(course, "test", "0", "--work", str(tree))
    assert code == 1 and "✗ test_total" in out and "chapter 0 FAILED" in out, out
    assert "not started" in run(course, "list")[1], "another tree's verdict is not the student's"
    code, out = run(course, "mutate", "0", "--write", str(tmp_path / "ref"))
    assert code == 0 and run(course, "test", "0", "--work", str(tmp_path / "ref"))[0] == 0, out
    code, out = run(course, "mutate", "0", "--write", str(tree), "--only", "item")
    assert code == 2 and "matches 2 mistakes of chapter 0 (need 1)" in out, out
    code, out = run(course, "mutate", "0", "--only", "skips the first")
    assert code == 0 and "chapter 0: 1/1 mutants killed" in out, out
    assert not (course / REPORT).exists(), "a partial run leaves the report alone"


def broken_student(course: Path, line: str) -> None:
    run(course, "start", "0")
    shutil.copy(course / "solutions/minisgl/calc.py", course / "work/minisgl/calc.py")
    calc = course / "work/minisgl/calc.py"
    calc.write_text(
        calc.read_text().replace(
            "import math  # a comment that must survive\n", f"import math\nimport os\n{line}\n"
        )
    )


def test_a_hanging_tree_times_out_and_fails(course: Path):
    broken_student(course, "while True:\n    pass")
    code, out = run(course, "test", "0", "--main-timeout", "3", "--test-timeout", "3")
    assert code == 1 and "did not finish" in out and "FAILED" in out
    assert "loop forever" in out


def test_a_tree_that_crashes_on_import_fails(course: Path):
    broken_student(course, "raise RuntimeError('boom at import')")
    code, out = run(course, "test", "0")
    assert code == 1 and "boom at import" in out and "FAILED" in out


def test_a_tree_that_prints_garbage_and_exits_zero_fails(course: Path):
    broken_student(course, "print('===== 2 passed in 0.01s =====', flush=True)\nos._exit(0)")
    code, out = run(course, "test", "0")
    assert code == 1 and "no test ran" in out and "PASSED" not in out


def test_a_tree_that_does_not_parse_fails(course: Path):
    broken_student(course, "def oops(:")
    code, out = run(course, "test", "0")
    assert code == 1 and "work/minisgl/calc.py line" in out


def test_an_edited_test_file_fails(course: Path):
    run(course, "start", "0")
    test_file = course / "tests/test_ch00_basics.py"
    test_file.write_text("def test_add():\n    pass\n\n\ndef test_total():\n    pass\n")
    code, out = run(course, "test", "0")
    assert code == 1 and "tests/test_ch00_basics.py" in out and "committed version" in out


# --- check: the maintainer's proof ----------------------------------------------------------


def test_capture_writes_the_output_and_check_compares_it(course: Path):
    code, out = run(course, "check", "0")
    assert code == 1 and "docs/_outputs/ch00_basics.txt is missing" in out
    assert run(course, "capture", "0")[0] == 0
    assert (course / "docs/_outputs/ch00_basics.txt").read_text() == "2 + 3 = 5\n"
    code, out = run(course, "check", "0")
    assert code == 0, out
    assert "2/2 pass" in out and "2/2 fail" in out
    main = course / "examples/ch00_basics.py"
    main.write_text(main.read_text() + "print('took 1.25 s, 300 tokens/s')\n")
    assert run(course, "capture", "0")[0] == 0
    main.write_text(main.read_text().replace("1.25 s, 300", "9.5 s, 12"))
    assert run(course, "check", "0")[0] == 0, "timings are volatile: they may differ"
    main.write_text(main.read_text().replace("2, 3", "2, 4"))
    code, out = run(course, "check", "0")
    assert code == 1 and "ch00_basics.txt changed" in out and "+2 + 3 = 6" in out


def test_check_names_a_test_that_passes_on_the_stubs(course: Path):
    test_file = course / "tests/test_ch00_basics.py"
    test_file.write_text(test_file.read_text() + "\n\ndef test_vacuous():\n    assert True\n")
    code, out = run(course, "check", "0")
    assert code == 1 and "tests that pass on the stubs: test_vacuous" in out


def test_check_fails_a_reference_test_slower_than_the_students_limit(course: Path):
    test_file = course / "tests/test_ch00_basics.py"
    slow = "\n\ndef test_slow():\n    import time\n\n    time.sleep(3)\n    assert add(1, 1) == 2\n"
    test_file.write_text(test_file.read_text() + slow)
    code, out = run(course, "check", "0", "--test-timeout", "1")
    assert code == 1 and "the reference fails" in out, out
    assert "test_slow" in out and "did not finish" in out, out


def test_check_fails_a_reference_test_over_a_third_of_its_limit_and_lists_the_slowest(
    course: Path,
):
    test_file = course / "tests/test_ch00_basics.py"
    slow = "\n\ndef test_slow():\n    import time\n\n    time.sleep(2)\n    assert add(1, 1) == 2\n"
    test_file.write_text(test_file.read_text() + slow)
    run(course, "capture", "0")
    code, out = run(course, "check", "0", "--test-timeout", "4")
    assert code == 1 and "the reference fails" not in out, out  # it passes, within its limit
    flat = " ".join(out.split())  # the console wraps long lines
    assert re.search(r"test_slow: 2\.\d s of 4 s \(5\d%\) is over 33% of its limit", flat), out
    slowest = out.split("The slowest reference runs")[1]
    assert slowest.splitlines()[1].strip().startswith("tests/test_ch00_basics.py::test_slow"), out
    code, out = run(course, "check", "0", "--test-timeout", "8")
    assert code == 0, out  # 2 s of 8 s leaves room


def test_check_reports_a_missing_main(course: Path):
    (course / "examples/ch02_triple.py").unlink()
    code, out = run(course, "check", "2")
    assert code == 1 and "missing examples/ch02_triple.py" in out


# --- the student's loop: hangs, Ctrl-C ------------------------------------------------------


def test_a_stub_that_loops_forever_is_named_and_the_run_stops_there(course: Path):
    run(course, "start", "0")
    write_student_calc(course, add="while True:\n        pass", total="return sum(self.items)")
    started = time.monotonic()
    code, out = run(course, "test", "0", "--test-timeout", "2")
    assert code == 1 and time.monotonic() - started < 30
    assert "✗ test_add (stopped: does your code loop forever?)" in out, out
    assert "raised in add (work/minisgl/calc.py:" in out, "the report names the student's file"
    assert "test_total" not in out.split("First failure")[0], "the run stops at the first hang"


def processes_under(folder: Path) -> list[str]:
    """Command lines of live processes that mention `folder` (a course under tmp_path)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(folder) in cmdline and proc.name != str(os.getpid()):
            found.append(cmdline)
    return found


def test_ctrl_c_ends_every_process_and_keeps_the_students_files(course: Path):
    run(course, "start", "0")
    write_student_calc(course, add="while True:\n        pass", total="return sum(self.items)")
    before = (course / "work/minisgl/calc.py").read_text()
    judge = start_interruptible(course, "test", "0")
    deadline = time.monotonic() + 30
    while not any("-m pytest" in p for p in processes_under(course)):  # the tests are running
        assert time.monotonic() < deadline, "the judge never started pytest"
        time.sleep(0.2)
    judge.send_signal(signal.SIGINT)
    out, _ = judge.communicate(timeout=30)
    assert judge.returncode == 130 and "Stopped (Ctrl-C)" in out and "Traceback" not in out
    time.sleep(0.5)
    assert processes_under(course) == [], "a process of the judge outlived it"
    assert (course / "work/minisgl/calc.py").read_text() == before


# --- batch grading ----------------------------------------------------------------------------


def test_grade_gives_each_student_chapter_and_test_a_row(course: Path, tmp_path: Path):
    submissions = tmp_path / "submissions"
    for student in ("ada", "bob", "cy"):
        (submissions / student / "work").mkdir(parents=True)
    shutil.copytree(course / "solutions/minisgl", submissions / "ada/work/minisgl")
    shutil.copytree(course / "chapters/ch00_basics/skeleton", submissions / "bob/work/minisgl")
    shutil.copytree(course / "solutions/minisgl", submissions / "cy/work/minisgl")
    cy = submissions / "cy/work/minisgl/calc.py"
    cy.write_text(cy.read_text().replace("return a + b", "return a - b"))
    (submissions / "cy/work/.progress.json").write_text('{"0": {"status": "passed"}}')
    (submissions / "cy/work/tests").mkdir()  # a submission's own tests are never used
    (submissions / "cy/work/tests/test_ch00_basics.py").write_text("def test_add():\n    pass\n")
    csv_file = tmp_path / "grades.csv"
    code, out = run(
        course,
        "grade",
        "--submissions",
        str(submissions),
        "--csv",
        str(csv_file),
        "--chapters",
        "0",
    )
    assert code == 0, out
    rows = {(r["student"], r["test"]): r["outcome"] for r in csv.DictReader(csv_file.open())}
    assert rows[("ada", "test_add")] == rows[("ada", "test_total")] == "passed"
    assert rows[("bob", "test_add")] == rows[("bob", "test_total")] == "failed"
    assert rows[("cy", "test_add")] == "failed" and rows[("cy", "test_total")] == "passed"
    assert re.search(r"ada\W+2/2", out) and re.search(r"bob\W+0/2", out)
    assert re.search(r"cy\W+1/2", out)


def test_watch_reruns_the_tests_when_a_file_is_saved_and_ctrl_c_exits(course: Path):
    run(course, "start", "0")
    watcher = start_interruptible(course, "watch", "0", env={**os.environ, "COLUMNS": "120"})
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(watcher.stdout), daemon=True).start()

    def wait_for(text: str, count: int, seconds: float) -> float:
        start = time.monotonic()
        while "".join(lines).count(text) < count:
            assert time.monotonic() - start < seconds, f"no {text!r} #{count} in: {lines}"
            time.sleep(0.05)
        return time.monotonic() - start

    try:
        wait_for("chapter 0 FAILED", 1, 60)
        write_student_calc(course, add="return a + b", total="return sum(self.items)")
        rerun_started = wait_for("Running chapter 0 tests", 2, 10)
        assert rerun_started < 2.0, f"watch took {rerun_started:.1f} s to notice the save"
        wait_for("chapter 0 PASSED", 1, 60)
    finally:
        watcher.send_signal(signal.SIGINT)
        watcher.wait(timeout=30)
    assert watcher.returncode == 0


# --- the course library as a package -----------------------------------------------------


def test_the_guide_lists_every_module_of_the_course_library():
    guide = (ROOT / "docs/maintainers.md").read_text()
    table = guide.split("### The course library", 1)[1].split("\n#", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)\.py`", table, flags=re.MULTILINE))
    listed |= set(re.findall(r"^\| `\w+\.py`, `(\w+)\.py`", table, flags=re.MULTILINE))
    modules = {p.stem for p in (ROOT / "tools/course").glob("*.py")} - {"__init__"}
    assert modules - listed == set(), "docs/maintainers.md's course-library table lacks these"
    assert listed - modules == set(), "docs/maintainers.md lists modules that do not exist"


def test_course_paths_root_is_this_repository():
    from course.paths import ROOT as COURSE_ROOT

    assert COURSE_ROOT == ROOT


def test_the_installed_course_package_is_importable_and_does_not_leak_engine_modules(
    tmp_path: Path,
):
    """`import course` works from the project's interpreter with no sys.path edit, and the
    install adds a plain path entry: a minisgl tree first on PYTHONPATH that lacks a module
    must not get the reference's (an import hook of a two-root editable install does that)."""
    (tmp_path / "minisgl").mkdir()
    (tmp_path / "minisgl/__init__.py").write_text("")
    code = (
        "import course.paths, importlib.util, minisgl\n"
        "print(minisgl.__file__)\n"
        "print(importlib.util.find_spec('minisgl.core'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, (
        f"`import course` fails: reinstall (pip install -e .)\n{done.stderr}"
    )
    init, core = done.stdout.splitlines()
    assert Path(init) == tmp_path / "minisgl/__init__.py"
    assert core == "None", f"minisgl.core came from outside the tree first on the path: {core}"


# --- mutate: how strong the tests are -------------------------------------------------------

MUTATIONS_0 = """
[[mutation]]
stub = "calc.py:add"
find = "return a + b"
replace = "return a - b"
mistake = "subtracts"

[[mutation]]
stub = "calc.py:add"
find = "return a + b"
replace = "return a * b"
mistake = "multiplies"

[[mutation]]
stub = "calc.py:add"
find = "return a + b"
replace = "return b + a"
mistake = "swaps the operands"{equivalent}

[[mutation]]
stub = "calc.py:Acc.total"
find = "math.fsum(self.items)"
replace = "len(self.items)"
mistake = "counts the items"

[[mutation]]
stub = "calc.py:Acc.total"
find = "math.fsum(self.items)"
replace = "math.fsum(self.items[1:])"
mistake = "skips the first item"
"""


def test_mutate_lists_survivors_and_writes_the_report_the_page_shows(course: Path):
    catalogue = course / "chapters" / "ch00_basics" / "mutations.toml"
    catalogue.write_text(MUTATIONS_0.format(equivalent=""))
    code, out = run(course, "mutate", "0")
    assert code == 1, "1 of 5 survives: 80% is under the target"
    assert "chapter 0: 4/5 mutants killed" in out
    assert "survived ch0 calc.py:add: swaps the operands" in out
    entry = json.loads((course / REPORT).read_text())["0"]
    assert (entry["killed"], entry["total"]) == (4, 5) and entry["chapter"] == "ch00_basics"
    assert entry["survivors"] == ["calc.py:add: swaps the operands"]
    assert entry["command"] == ".venv/bin/python tools/steps.py mutate 0 --report"

    catalogue.write_text(MUTATIONS_0.format(equivalent='\nequivalent = "addition commutes"'))
    code, out = run(course, "mutate", "0")
    assert code == 0 and "chapter 0: 4/4 mutants killed" in out, out
    entry = json.loads((course / REPORT).read_text())["0"]
    assert entry["survivors"] == []
    assert entry["equivalent"] == ["calc.py:add: swaps the operands: addition commutes"]

    catalogue.write_text(catalogue.read_text().replace('find = "return a + b"', 'find = "a+b"', 1))
    code, out = run(course, "mutate", "0", "--sample", "1")
    assert code == 1 and "'a+b' occurs 0 times in its body" in " ".join(out.split()), out


def test_the_mutation_report_covers_every_chapter_without_unexplained_survivors():
    """The maintainers' page draws docs/_reports/mutations.json: each chapter has a catalogue of
    at least 5 mistakes, an entry made with that catalogue and that test file (their hashes),
    its own tests kill >= 95% of the mutants, and no survivor is left unexplained
    (`steps.py mutate K` refreshes an entry)."""
    course = Course.load(ROOT)
    report = json.loads((ROOT / REPORT).read_text())
    for k, m in sorted(course.chapters.items()):
        catalogue = load_mutations(course, k)
        assert len(catalogue) >= MIN_PER_CHAPTER, f"{m.name}: {len(catalogue)} mutations"
        entry = report.get(str(k), {})
        rerun = f"run tools/steps.py mutate {k}"
        assert entry.get("chapter") == m.name, f"{m.name} has no report entry: {rerun}"
        fresh = all(entry.get(key) == sha for key, sha in sources_digest(course, k).items())
        assert fresh, f"{m.name}: the catalogue or the tests changed since the report: {rerun}"
        assert entry["killed"] >= TARGET_KILL_RATE * entry["total"], f"{m.name}: {entry}"
        assert entry["survivors"] == [], f"{m.name}: kill or explain (`equivalent`) each survivor"
