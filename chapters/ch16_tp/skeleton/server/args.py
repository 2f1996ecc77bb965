"""The server's settings, and the command line that sets them (`python -m minisgl --help`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from minisgl.scheduler import SchedulerConfig
from minisgl.utils import ConfigError, ModelNotFoundError

MAX_BODY_BYTES = 1 << 20  # a request body larger than 1 MiB is refused (413) before parsing
# Requests that run at once by default. On a GPU a decode step grows much more slowly than its
# batch (upstream's default is 256 too); on two CPU cores it grows with it.
GPU_RUNNING_REQ = 256
CPU_RUNNING_REQ = 32


@dataclass
class ServerArgs:
    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None  # when set, every endpoint but /health needs it
    shell: bool = False  # an interactive chat in the terminal instead of the HTTP server
    max_running_req: int | None = None  # None: GPU_RUNNING_REQ on a GPU, CPU_RUNNING_REQ else
    page_size: int = 1
    num_pages: int | None = None
    kv_cache_gib: float = 1.0
    max_seq_len: int | None = None
    cache_type: str = "radix"
    max_body_bytes: int = MAX_BODY_BYTES
    tp_size: int = 1  # tensor-parallel ranks: one scheduler process each (chapter 16)

    def __post_init__(self) -> None:
        if not (Path(self.model_path) / "config.json").is_file():
            raise ModelNotFoundError(f"no model at {self.model_path} (it has no config.json)")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.tp_size < 1:
            raise ConfigError(f"--tp must be >= 1, got {self.tp_size}")

    @property
    def model_name(self) -> str:
        """The name clients use in "model": the model directory's name."""
        return Path(self.model_path).resolve().name

    def scheduler_config(self) -> SchedulerConfig:
        if self.max_running_req is not None:
            max_running_req = self.max_running_req
        else:  # the scheduler processes are spawned, so asking CUDA here harms none of them
            max_running_req = GPU_RUNNING_REQ if torch.cuda.is_available() else CPU_RUNNING_REQ
        return SchedulerConfig(
            self.model_path,
            max_running_req=max_running_req,
            page_size=self.page_size,
            num_pages=self.num_pages,
            kv_cache_gib=self.kv_cache_gib,
            max_seq_len=self.max_seq_len,
            cache_type=self.cache_type,
            show_progress=False,
            tp_size=self.tp_size,
        )


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    """ServerArgs from the command line (sys.argv when argv is None)."""
    parser = argparse.ArgumentParser(
        prog="python -m minisgl", description="Serve a model with an OpenAI-compatible API."
    )
    parser.add_argument("--model", dest="model_path", required=True, help="model directory")
    parser.add_argument("--host", default=ServerArgs.host)
    parser.add_argument("--port", type=int, default=ServerArgs.port)
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--shell", action="store_true", help="chat in the terminal instead")
    parser.add_argument(
        "--max-running-req",
        type=int,
        default=None,
        help=f"requests that run at once (default: {GPU_RUNNING_REQ} on a GPU, "
        f"{CPU_RUNNING_REQ} on the CPU)",
    )
    parser.add_argument("--page-size", type=int, default=ServerArgs.page_size)
    parser.add_argument("--num-pages", type=int, default=None)
    parser.add_argument("--kv-cache-gib", type=float, default=ServerArgs.kv_cache_gib)
    parser.add_argument("--max-seq-len", type=int, default=None)
    parser.add_argument("--cache-type", choices=["radix", "naive"], default=ServerArgs.cache_type)
    parser.add_argument(
        "--tp", dest="tp_size", type=int, default=ServerArgs.tp_size, help="tensor-parallel ranks"
    )
    return ServerArgs(**vars(parser.parse_args(argv)))
