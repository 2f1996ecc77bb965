"""Python runs started warm: forked from a server that has imported torch, pytest and
hypothesis once, rather than a fresh interpreter importing them again for every run.

Those imports take 2 to 4 s a run on a 2-core machine, which is most of a stub's test run and of
a practice problem's; `steps.py check` makes about 80 runs and `judge.py check` 182. The server
is multiprocessing's "forkserver": started by a tool on its first run, single-threaded, never
touching CUDA or Triton (TRITON_INTERPRET must still be chosen by each run), and gone when the
tool ends.

Only the commands that make many runs ask for warm ones (`steps.py check`, `capture`, `mutate`,
`grade`, `judge.py check`: `prefer_warm_runs`): a student's `test` makes one or two, in
parallel, and starting the server first would cost what it saves.

A warm run is what `python ARGS` would be (`-m module`, `-c code` or a script path): its own
session and process group, its own working directory, environment (PYTHONPATH placed on the
import path as the interpreter places it, torch's threads from OMP_NUM_THREADS), stdin from
/dev/null, stdout and stderr into files, its exit status that of the code (a signal's death a
negative status). MINISGL_COLD_RUNS=1, or a platform without fork, starts every run fresh.
"""

from __future__ import annotations

import atexit
import builtins
import functools
import importlib
import json
import multiprocessing
import multiprocessing.connection
import os
import runpy
import subprocess
import sys
import threading
import traceback
from multiprocessing.process import BaseProcess
from pathlib import Path

# None of them may import triton: Triton's interpreter (TRITON_INTERPRET=1, which the tests set
# on a CPU) must be chosen before triton is imported, or interpreted kernels that call other
# @triton.jit functions fail (transformers' Auto* classes import it, so they stay out).
PRELOAD = ["torch", "numpy", "pytest", "hypothesis", "transformers"]
# Variables those libraries may read once, when they load (another CPU's arithmetic path,
# outputs.another_cpu; thread pools; the model hub's settings). A run that sets one of them
# otherwise than the tool's environment starts cold. OMP_NUM_THREADS is the exception that
# the child applies itself.
READ_AT_LOAD = (
    "ATEN_",
    "MKL_",
    "DNNL_",
    "OMP_",
    "KMP_",
    "TORCH_",
    "PYTORCH_",
    "HF_",
    "TRANSFORMERS_",
)
COLD_ENV = "MINISGL_COLD_RUNS"
WANTED = threading.Event()  # set by prefer_warm_runs: this tool's runs start warm
# multiprocessing reads a warm run's exit status once, from a pipe, and whoever reads second
# finds the pipe's end and reports 255. Process.start() reads the status of every ended run
# of this tool (multiprocessing.process._cleanup), so a run started in one thread while another
# thread read its own run's status could turn a run that passed into 255: `judge.py check` saw
# it once, a solution with 8 tests passed. Starting a run and reading a status take this lock.
STATUS_LOCK = threading.Lock()


def prefer_warm_runs() -> None:
    """From now on, this tool's Python runs start warm (where warm_runs_available)."""
    WANTED.set()


def warm_runs_available(env: dict[str, str] | None = None) -> bool:
    """Runs (with environment `env`, by default the tool's) start warm once the tool asked for it
    (prefer_warm_runs), unless MINISGL_COLD_RUNS is set, the platform cannot fork, or `env`
    changes a variable of READ_AT_LOAD."""
    cold = os.environ.get(COLD_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    forks = "forkserver" in multiprocessing.get_all_start_methods()
    changed = loaded_otherwise(dict(os.environ) if env is None else env)
    return WANTED.is_set() and not cold and forks and not changed


def loaded_otherwise(env: dict[str, str]) -> list[str]:
    """The variables of READ_AT_LOAD that `env` sets otherwise than this tool's environment."""
    names = {name for name in (*env, *os.environ) if name.startswith(READ_AT_LOAD)}
    return sorted(
        name for name in names - {"OMP_NUM_THREADS"} if env.get(name) != os.environ.get(name)
    )


@functools.cache
def base_path() -> list[str]:
    """The import path a fresh interpreter has without PYTHONPATH, its first entry (the
    script's folder, or the working directory) aside: the standard library, site-packages and
    what .pth files add (the editable install's solutions/)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import json, sys; print(json.dumps(sys.path[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


@functools.cache
def context() -> multiprocessing.context.BaseContext:
    """The forkserver, importing PRELOAD when it starts. (multiprocessing also imports the
    tool's script in each child, as `__mp_main__`: steps.py and judge.py are guarded mains
    that import no minisgl, which tests/test_warm_runs.py checks, in about 0.07 s.)"""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start(args: list[str], cwd: Path, env: dict[str, str], out: Path, err: Path) -> BaseProcess:
    """Start `python *args` warm (the server starts on the first call); its stdout and stderr
    go to the files `out` and `err`. The returned process's pid leads its own process group."""
    process = context().Process(
        target=run_as_interpreter,
        args=(args, str(cwd), env, str(out), str(err), base_path()),
        daemon=False,
    )
    with STATUS_LOCK:
        process.start()
    return process


def exit_status(process: BaseProcess, timeout: float | None) -> int | None:
    """A warm run's exit status once it ends, waiting at most `timeout` s (None: running)."""
    multiprocessing.connection.wait([process.sentinel], timeout)
    with STATUS_LOCK:
        return process.exitcode


def run_as_interpreter(
    args: list[str], cwd: str, env: dict[str, str], out: str, err: str, base: list[str]
) -> None:
    """In the forked child: become `python *args` in a session of its own, and exit with its
    status (never returning into multiprocessing, whose exit would not run atexit's hooks)."""
    os.setsid()
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    if env.get("OMP_NUM_THREADS", "").isdigit():  # the server's OpenMP read its own value
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    first = os.path.dirname(os.path.abspath(args[0])) if args[0] not in ("-m", "-c") else cwd
    entries = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [first, *entries, *base]
    importlib.invalidate_caches()
    status = interpret(args)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the code: nothing left to write
            pass
    os._exit(status)


def interpret(args: list[str]) -> int:
    """Run `python *args` in this process, as the interpreter would; its exit status."""
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            code = compile(args[1], "<string>", "exec")
            exec(code, {"__name__": "__main__", "__builtins__": builtins})
        else:
            sys.argv = list(args)
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    return 0
