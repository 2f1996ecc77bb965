"""Warm runs (tools/course/warm.py): a run forked from the server that imported torch behaves
as `python ARGS` would in a fresh interpreter: its directory, environment, import path, argv,
threads, output and exit status; a crash is a negative status, and a run past its limit is
killed with every process it started."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from course import warm
from course.outputs import another_cpu
from course.runner import run_process


@pytest.fixture(autouse=True)
def warm_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warm.COLD_ENV, raising=False)
    monkeypatch.setattr(warm, "WANTED", type(warm.WANTED)())
    warm.prefer_warm_runs()
    assert warm.warm_runs_available()


def env_with(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | extra


def test_a_warm_run_is_the_interpreter_its_arguments_ask_for(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "probe_pkg").mkdir(parents=True)
    (tree / "probe_pkg" / "__init__.py").write_text("WHERE = __file__\n")
    script = tmp_path / "script.py"
    script.write_text(
        "import json, os, sys, torch, probe_pkg\n"
        "print(json.dumps({'argv': sys.argv, 'cwd': os.getcwd(), 'path0': sys.path[:2],\n"
        "    'var': os.environ.get('PROBE_VAR'), 'threads': torch.get_num_threads(),\n"
        "    'pkg': probe_pkg.WHERE, 'main': __name__}))\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    env = env_with(PYTHONPATH=str(tree), PROBE_VAR="yes", OMP_NUM_THREADS="1")
    done = run_process([sys.executable, str(script), "a", "b"], tmp_path, env, 60)
    assert done.returncode == 3 and done.stderr.strip() == "to stderr", done.stderr
    seen = json.loads(done.stdout)
    assert seen["argv"] == [str(script), "a", "b"] and seen["main"] == "__main__"
    assert seen["cwd"] == str(tmp_path) and seen["var"] == "yes" and seen["threads"] == 1
    assert seen["path0"] == [str(tmp_path), str(tree)]
    assert seen["pkg"] == str(tree / "probe_pkg" / "__init__.py")
    module = run_process([sys.executable, "-m", "probe_pkg"], tmp_path, env, 60)
    assert module.returncode == 1 and "No module named probe_pkg.__main__" in module.stderr
    code = run_process(
        [sys.executable, "-c", "import sys; print(sys.argv)", "x"], tmp_path, env, 60
    )
    assert code.returncode == 0 and code.stdout.strip() == "['-c', 'x']"


def test_a_warm_run_that_crashes_has_the_signals_status(tmp_path: Path) -> None:
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    done = run_process([sys.executable, "-c", crash], tmp_path, env_with(), 60)
    assert done.returncode == -signal.SIGSEGV


def test_a_warm_run_past_its_limit_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    hang = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    done = run_process([sys.executable, "-c", hang], tmp_path, env_with(), 8)
    assert done.returncode is None and time.monotonic() - started < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while (
        Path(f"/proc/{child}").exists()
        and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]
    ):
        assert time.monotonic() < deadline, "the run's child outlived it"
        time.sleep(0.1)


def test_a_run_on_another_cpus_arithmetic_starts_cold() -> None:
    """torch may read ATEN_CPU_CAPABILITY (and MKL's, oneDNN's) when it loads: the server's
    torch would ignore the run's, so such a run is a fresh interpreter."""
    same = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="/elsewhere")
    assert warm.warm_runs_available(same)
    assert not warm.warm_runs_available(dict(same, ATEN_CPU_CAPABILITY="default"))
    assert warm.loaded_otherwise(another_cpu()) == sorted(another_cpu())


@pytest.mark.parametrize("tool", ["tools/steps.py", "practice/judge.py"])
def test_a_tool_imported_again_in_a_warm_run_loads_no_minisgl(tool: str) -> None:
    """multiprocessing imports the tool's script in each child (as __mp_main__) before the run
    starts: it must not load a minisgl, which would shadow the tree under test."""
    root = Path(__file__).resolve().parent.parent
    probe = (
        "import runpy, sys\n"
        f"runpy.run_path({str(root / tool)!r}, run_name='__mp_main__')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'minisgl'))\n"
    )
    env = env_with(PYTHONPATH=str(root / "tools"))
    done = run_process([sys.executable, "-c", probe], root, env, 60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_warm_run_finds_torch_loaded_and_triton_not(tmp_path: Path) -> None:
    """The server's imports are the run's (that is the point), but never triton's: a run must
    still choose Triton's interpreter before triton is first imported (tests/conftest.py)."""
    probe = "import sys; print('torch' in sys.modules, 'triton' in sys.modules)"
    done = run_process([sys.executable, "-c", probe], tmp_path, env_with(), 60)
    assert done.returncode == 0 and done.stdout.split() == ["True", "False"], done.stderr


def test_runs_started_and_awaited_from_several_threads_keep_their_exit_status(
    tmp_path: Path,
) -> None:
    """The tools start warm runs from a pool of threads. multiprocessing reads an ended run's
    status once, and Process.start() reads every ended run's: a start in one thread racing a
    wait in another made a passing run end with 255 (warm.STATUS_LOCK)."""
    env = env_with()

    def status(_: int) -> int | None:
        return run_process([sys.executable, "-c", "pass"], tmp_path, env, 60).returncode

    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(status, range(200)))
    assert statuses == [0] * 200, sorted(set(statuses))
