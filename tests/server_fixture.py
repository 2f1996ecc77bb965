"""A live `python -m minisgl` server for the server tests: one per test module, on a free port.

The server runs as a real subprocess (its own session, so the test can signal it and check
that its children are gone afterwards); tests talk to it over HTTP on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 180.0
SHUTDOWN_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children_of(pid: int) -> list[int]:
    """Every live descendant of a process (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        kids = [child for child, parent in parents.items() if parent == current]
        found += kids
        frontier += kids
    return found


@dataclass
class LiveServer:
    process: subprocess.Popen
    base_url: str
    model: str
    api_key: str | None = None
    log: Path = field(default_factory=Path)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def openai(self):  # noqa: ANN201 - an openai.OpenAI client
        import openai

        return openai.OpenAI(
            base_url=f"{self.base_url}/v1",
            api_key=self.api_key or "none",
            timeout=120,
            max_retries=0,
        )

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=120)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the server and wait for it; returns its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(SHUTDOWN_TIMEOUT_S)


def start_server(
    model_dir: Path,
    log: Path,
    *extra: str,
    api_key: str | None = None,
    env: dict[str, str] | None = None,
    entry: tuple[str, ...] = ("-m", "minisgl"),
) -> LiveServer:
    """Launch `python -m minisgl` (or `python *entry`) and wait until /health answers. Pass
    TMPDIR in `env` to see where its socket directory goes."""
    port = free_port()
    cmd = [
        sys.executable,
        *entry,
        "--model",
        str(model_dir),
        "--port",
        str(port),
        *extra,
    ] + (["--api-key", api_key] if api_key else [])
    process = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, **(env or {})),
        start_new_session=True,
    )
    server = LiveServer(process, f"http://127.0.0.1:{port}", model_dir.name, api_key, log)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited during start-up:\n{log.read_text()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"the server did not start in {STARTUP_TIMEOUT_S} s:\n{log.read_text()}")
