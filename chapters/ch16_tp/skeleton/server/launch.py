"""Launch a server: the scheduler and tokenizer processes, then the API server (or the shell).

    python -m minisgl --model models/SmolLM2-135M-Instruct --port 30000

Processes talk over IPC sockets in a fresh temporary directory. Every child watches its
parent: if the launcher dies, even by SIGKILL, the children exit instead of lingering. On
SIGINT or SIGTERM the launcher stops the API server, tells each child to exit, waits for it
(killing it if it does not), and removes the socket directory. With `--tp N` there are N
scheduler processes, one per tensor-parallel rank, and if one of them dies the server stops.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

from minisgl.message import ExitMsg, PushQueue, ipc_address
from minisgl.scheduler.io import run_scheduler
from minisgl.server.args import ServerArgs
from minisgl.tokenizer import run_tokenizer_worker
from minisgl.utils import MinisglError

STARTUP_TIMEOUT_S = 300.0  # loading a large model on a slow disk takes a while
EXIT_TIMEOUT_S = 5.0
PARENT_POLL_S = 0.5
GRACEFUL_SHUTDOWN_S = 2.0  # open streams get this long before uvicorn closes them


@dataclass(frozen=True)
class Addresses:
    """Where each process's PULL socket lives: one directory per server."""

    directory: str

    @property
    def api(self) -> str:
        return ipc_address(self.directory, "api")

    @property
    def tokenizer(self) -> str:
        return ipc_address(self.directory, "tokenizer")

    @property
    def scheduler(self) -> str:
        return ipc_address(self.directory, "scheduler")

    @property
    def dist_init(self) -> str:
        """The rendezvous file of the scheduler ranks' gloo group."""
        return f"file://{self.directory}/dist_init"


def child_main(target: Callable[..., None], args: tuple, parent_pid: int) -> None:
    """A child's entry: exit when the parent is gone, leave Ctrl-C to the launcher (which
    stops children with an ExitMsg, never mid-step), then run `target(*args)`."""

    def watch_parent() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    target(*args)


def scheduler_name(rank: int, tp_size: int) -> str:
    """'scheduler', or 'scheduler rank 1' when there are several (tensor parallel)."""
    return "scheduler" if tp_size == 1 else f"scheduler rank {rank}"


def start_backend(args: ServerArgs, addresses: Addresses) -> list[mp.Process]:
    """Start the scheduler and tokenizer processes; return once the model is loaded."""
    # Fork: the children start with torch, transformers and minisgl already imported, in
    # a fraction of a second. Safe because this process has run no torch op, opened no ZMQ
    # socket and used no tokenizer yet (the API server's sockets are made after this).
    context = mp.get_context("fork")
    ready, loaded = context.Pipe(duplex=False)  # each scheduler rank sends on `loaded`
    config = args.scheduler_config()
    # One scheduler process per tensor-parallel rank; rank 0 alone opens the sockets.
    jobs: dict[str, tuple[Callable[..., None], tuple]] = {
        scheduler_name(rank, args.tp_size): (
            run_scheduler,
            (
                config,
                addresses.scheduler,
                addresses.tokenizer,
                addresses.dist_init,
                rank,
                args.tp_size,
                loaded,
            ),
        )
        for rank in range(args.tp_size)
    }
    jobs["tokenizer"] = (
        run_tokenizer_worker,
        (args.model_path, addresses.tokenizer, addresses.scheduler, addresses.api),
    )
    processes = []
    for name, (target, target_args) in jobs.items():
        process = context.Process(
            target=child_main, name=name, daemon=True, args=(target, target_args, os.getpid())
        )
        process.start()
        processes.append(process)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    waiting = args.tp_size  # ranks whose model is not loaded yet
    while True:
        dead = [p.name for p in processes if not p.is_alive()]
        if dead:
            raise MinisglError(
                f"the {dead[0]} process exited during start-up (its error is printed above)"
            )
        if time.monotonic() > deadline:
            raise MinisglError(f"the model did not load within {STARTUP_TIMEOUT_S:.0f} s")
        if ready.poll(0.2):
            ready.recv()
            waiting -= 1
        if waiting == 0:
            ready.close()
            return processes


def stop_backend(processes: list[mp.Process], addresses: Addresses) -> None:
    """Ask every child to exit, wait for it, and kill the ones that do not."""
    for address in (addresses.tokenizer, addresses.scheduler):
        sender = PushQueue(address)
        sender.put(ExitMsg())
        sender.close()
    for process in processes:
        process.join(EXIT_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()


def run_api_server(args: ServerArgs, addresses: Addresses) -> None:
    """Serve HTTP until SIGINT or SIGTERM (uvicorn handles both, then returns)."""
    import uvicorn

    from minisgl.server.api_server import create_app
    from minisgl.server.frontend import FrontendManager

    app = create_app(args, FrontendManager(addresses.tokenizer, addresses.api))
    print(f"minisgl: serving {args.model_name} on http://{args.host}:{args.port}", flush=True)
    uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    ).run()


def stop_if_one_dies(
    processes: list[mp.Process], stopping: threading.Event, failure: list[str]
) -> None:
    """(Tensor parallel) A rank's death leaves the others unable to step: if any child dies
    before `stopping` is set, record which one in `failure` and stop the server (SIGTERM)."""
    from minisgl.distributed.group import first_death

    while not stopping.wait(PARENT_POLL_S):
        exits = {f"the {p.name} process": p.exitcode for p in processes}
        dead = first_death({name: code for name, code in exits.items() if code is not None})
        if dead is not None:
            failure.append(dead)
            os.kill(os.getpid(), signal.SIGTERM)
            return


def exit_cleanly(signum: int, frame: object) -> None:
    """SIGTERM asks for a clean stop: unwind (running the cleanup) and exit with status 0."""
    raise SystemExit(0)


def launch_server(args: ServerArgs) -> None:
    """Start every process, serve (HTTP or shell) until stopped, then clean everything up."""
    # Until uvicorn installs its own handlers, SIGTERM must still run the cleanup below.
    signal.signal(signal.SIGTERM, exit_cleanly)
    directory = tempfile.mkdtemp(prefix="minisgl-")
    addresses = Addresses(directory)
    processes: list[mp.Process] = []
    stopping = threading.Event()
    failure: list[str] = []  # which child died, if one did (tensor parallel)
    try:
        processes = start_backend(args, addresses)
        if args.tp_size > 1:
            watch = (processes, stopping, failure)
            threading.Thread(target=stop_if_one_dies, args=watch, daemon=True).start()
        if args.shell:
            from minisgl.server.shell import run_shell

            run_shell(args, addresses)
        else:
            run_api_server(args, addresses)
    except KeyboardInterrupt:
        print(file=sys.stderr)
    finally:
        stopping.set()
        stop_backend(processes, addresses)
        shutil.rmtree(directory, ignore_errors=True)
        if failure:
            raise MinisglError(f"{failure[0]}; the server stopped")
