"""Launch a server: the scheduler and tokenizer processes, then the API server (or the shell).

    python -m minisgl --model models/SmolLM2-135M-Instruct --port 30000

The children are started by a `Launcher` (`minisgl/launcher.py`) and talk over IPC sockets in
its fresh temporary directory. If the launcher dies, even by SIGKILL, the children exit instead
of lingering. On SIGINT or SIGTERM the launcher stops the API server, tells each child to exit,
waits for it (killing it if it does not), and removes the socket directory. If a child dies,
say one of the `--tp N` scheduler ranks, the others are stopped and so is the server, with an
error that names the child, how it ended and the end of its stderr.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

from minisgl.launcher import Launcher
from minisgl.message import ExitMsg, ZmqPushQueue, ipc_address
from minisgl.scheduler.io import run_scheduler
from minisgl.server.args import ServerArgs
from minisgl.tokenizer import run_tokenizer_worker
from minisgl.utils import MinisglError

STARTUP_TIMEOUT_S = 300.0  # loading a large model on a slow disk takes a while
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


def scheduler_name(rank: int, tp_size: int) -> str:
    """'scheduler', or 'scheduler rank 1' when there are several (tensor parallel)."""
    return "scheduler" if tp_size == 1 else f"scheduler rank {rank}"


def start_backend(args: ServerArgs, launcher: Launcher, addresses: Addresses) -> None:
    """Start the scheduler and tokenizer processes; return once the model is loaded."""
    config = args.scheduler_config()
    # One scheduler process per tensor-parallel rank; rank 0 alone opens the sockets. Each
    # sends on `launcher.ready` once its model is loaded.
    for rank in range(args.tp_size):
        launcher.start(
            scheduler_name(rank, args.tp_size),
            run_scheduler,
            config,
            addresses.scheduler,
            addresses.tokenizer,
            addresses.dist_init,
            rank,
            args.tp_size,
            launcher.ready,
        )
    launcher.start(
        "tokenizer",
        run_tokenizer_worker,
        args.model_path,
        addresses.tokenizer,
        addresses.scheduler,
        addresses.api,
    )
    if not launcher.wait_ready(args.tp_size, STARTUP_TIMEOUT_S):
        raise MinisglError(f"the model did not load within {STARTUP_TIMEOUT_S:.0f} s")


def stop_backend(launcher: Launcher, addresses: Addresses) -> None:
    """Ask every child to exit, wait for it, kill the ones that do not, remove the sockets.
    After a death the launcher has stopped the children already: nobody would read."""
    launcher.begin_stop()
    if launcher.failure is None:
        for address in (addresses.tokenizer, addresses.scheduler):
            sender = ZmqPushQueue(address)
            sender.put(ExitMsg())
            sender.close()
    launcher.stop()


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


def exit_cleanly(signum: int, frame: object) -> None:
    """SIGTERM asks for a clean stop: unwind (running the cleanup) and exit with status 0."""
    raise SystemExit(0)


def stop_serving() -> None:
    """A child died: stop the API server or the shell as SIGTERM would (see exit_cleanly)."""
    os.kill(os.getpid(), signal.SIGTERM)


def launch_server(args: ServerArgs) -> None:
    """Start every process, serve (HTTP or shell) until stopped, then clean everything up;
    raise the launcher's ProcessDiedError if a child died."""
    # Until uvicorn installs its own handlers, SIGTERM must still run the cleanup below.
    signal.signal(signal.SIGTERM, exit_cleanly)
    launcher = Launcher(prefix="minisgl-")
    addresses = Addresses(launcher.directory)
    try:
        start_backend(args, launcher, addresses)
        launcher.when_one_dies(stop_serving)
        if args.shell:
            from minisgl.server.shell import run_shell

            run_shell(args, addresses)
        else:
            run_api_server(args, addresses)
    except KeyboardInterrupt:
        print(file=sys.stderr)
    finally:
        stop_backend(launcher, addresses)
        launcher.check()  # in `finally`: a death ends the shell by SystemExit (stop_serving)
