"""The GPU verdict: a chapter's GPU tests (its manifest's `gpu_tests`) run on the student's tree.

A chapter's own tests run on the CPU, with test doubles for FlashInfer and CUDA graphs, so that
every student and CI can run them. Where the judged environment has CUDA, `steps.py test K` then
runs the chapter's GPU tests (tests/test_gpu_*.py) on the same snapshot, in the same sandbox,
with the same verdicts: the real kernels and graphs catch what a double may miss. They run even
when the CPU tests failed, so that a mistake shows on the GPU as well. Without CUDA the judge
says so in one line, naming the tests and how to run them. A test that needs more (FlashInfer,
two GPUs) skips itself, and the report gives its reason.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from course.checks import run_chapter_tests
from course.manifest import Course, Manifest
from course.report import console, print_cases, print_failure
from course.runner import TestCase, run_process, sandbox_env
from course.snapshot import Snapshot
from course.source import functions

# FlashInfer compiles its kernels in the first test that uses them (~90 s on an H200, unless
# FLASHINFER_WORKSPACE_BASE holds them from an earlier run).
GPU_TEST_TIMEOUT_S = 300
GPU_RUN_TIMEOUT_S = 1200
PROBE_TIMEOUT_S = 120  # importing torch and initialising CUDA
PROBE = (
    "import importlib.util, json, torch\n"
    "cuda = torch.cuda.is_available()\n"
    "print(json.dumps({'device': torch.cuda.get_device_name(0) if cuda else None,\n"
    "                  'flashinfer': importlib.util.find_spec('flashinfer') is not None}))\n"
)


@dataclass
class Devices:
    """What the judged environment has: a CUDA device (its name) and FlashInfer."""

    device: str | None
    flashinfer: bool
    why_not: str = ""  # why the probe itself failed, if it did


def probe_devices(tree: Path, cwd: Path) -> Devices:
    """Ask the judged environment (the sandbox's interpreter and import path) for CUDA and
    FlashInfer: what the judge's own process sees may differ."""
    done = run_process([sys.executable, "-c", PROBE], cwd, sandbox_env(tree), PROBE_TIMEOUT_S)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["timed out"])[-1]
        return Devices(None, False, f"torch could not be asked ({why})")
    found = json.loads(lines[-1])
    return Devices(found["device"], found["flashinfer"])


@dataclass
class GpuVerdict:
    ok: bool
    why: str = ""  # when not ok: the failing GPU tests, named
    passed: int = 0  # GPU tests that ran and passed


def judge_gpu(
    course: Course, k: int, chapters: list[Manifest], snap: Snapshot, rerun: str, skip: str = ""
) -> GpuVerdict:
    """Run the GPU tests of `chapters` on the snapshot and report them; without CUDA (or when
    `skip` gives a reason) say in one line that they did not run, why, and that `rerun` (the
    command that judged this tree) runs them on a machine with CUDA."""
    tests = [test for m in chapters for test in m.gpu_tests]
    if not tests:
        return GpuVerdict(True)
    names = ", ".join(tests)
    devices = Devices(None, False, skip) if skip else probe_devices(snap.root, course.root)
    if devices.device is None:
        why = devices.why_not or "no CUDA device in this environment"
        console.print(
            f"[yellow]GPU tests skipped[/] ({escape(why)}): {escape(names)}; "
            f"on a machine with CUDA and FlashInfer, {escape(rerun)} runs them too",
            soft_wrap=True,
        )
        return GpuVerdict(True)
    library = "FlashInfer" if devices.flashinfer else "no FlashInfer: its tests skip"
    console.print(
        f"Running chapter {k}'s GPU tests on your tree ({escape(devices.device)}, {library}) ..."
    )
    run = run_chapter_tests(
        course,
        tests,
        snap.root,
        test_timeout=GPU_TEST_TIMEOUT_S,
        label=f"chapter {k} GPU tests",
        run_timeout=GPU_RUN_TIMEOUT_S,
    )
    skipped = [case for case in run.tests if case.outcome == "skipped"]
    for case in skipped:
        console.print(f"  [yellow]skipped[/] {escape(case.name)}: {escape(case.message)}")
    if run.ok:
        console.print(
            f"[green]{len(run.passed)} GPU tests passed[/]"
            + (f", {len(skipped)} skipped" if skipped else "")
            + f" ({run.seconds:.0f} s)"
        )
        return GpuVerdict(True, passed=len(run.passed))
    console.print(
        f"[red]GPU: {escape(run.verdict)}[/] ({run.seconds:.0f} s); {len(run.passed)} passed"
    )
    print_cases(run)
    failed = run.failures
    if failed:
        case = failed[0]
        test_file = defining_file(course, tests, case)
        print_failure(course, k, snap, run, case, test_file, rerun, "First GPU failure")
    named = ", ".join(case.name for case in failed) or run.verdict
    return GpuVerdict(False, f"the GPU tests fail: {named}")


def defining_file(course: Course, tests: list[str], case: TestCase) -> Path:
    """The GPU test file that defines the failing test (the report looks there for the stubs
    the test names)."""
    files = list(dict.fromkeys(course.root / test.split("::")[0] for test in tests))
    function = case.name.split("[")[0]
    defines = lambda path: any(  # noqa: E731
        name.rsplit(".", 1)[-1] == function
        for name in functions(ast.parse(path.read_text("utf-8")))
    )
    return next((path for path in files if defines(path)), files[0])
