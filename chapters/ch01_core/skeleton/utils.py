"""Small helpers shared by every part of the engine, and the engine's error types."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def div_ceil(a: int, b: int) -> int:
    """Ceiling division for non-negative integers: how many pages of size b hold a tokens."""
    return -(-a // b)


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer. transformers is imported here, not at the top: importing its
    AutoTokenizer costs about two seconds of CPU (it brings its modeling stack), which a process
    that never loads a tokenizer (a worker, a test of a stub that fails first) should not pay."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def make_device_tensor(
    data: Sequence[int] | Sequence[float] | torch.Tensor, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Copy host data (a list, or a CPU tensor) to `device` without making the CPU wait.

    On a GPU a copy from ordinary (pageable) memory blocks the CPU until it is done, which
    would stall the overlap scheduler; a copy from pinned (page-locked) memory with
    non_blocking=True is only queued. CPUs have no pinned memory, and need no copy at all.
    """
    host = torch.as_tensor(data, dtype=dtype)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class MinisglError(Exception):
    """An error caused by the user's input (a path, a request, a setting), not by a bug.

    Entry points print these as one line instead of a traceback (see `exit_on_error`).
    """


class ModelNotFoundError(MinisglError, FileNotFoundError):
    """The model directory, its config.json or its weights are missing."""


class UnsupportedModelError(MinisglError, ValueError):
    """The checkpoint's architecture or one of its settings is not implemented."""


class ConfigError(MinisglError, ValueError):
    """A setting of the engine or scheduler is out of range."""


class InvalidRequestError(MinisglError, ValueError):
    """A request that can never be served (empty prompt, bad parameters, too long)."""


class RequestTooLongError(InvalidRequestError):
    """A request can never fit in the KV cache or the page table."""


@contextmanager
def exit_on_error() -> Iterator[None]:
    """Run an entry point's body; turn a MinisglError into one clear line and exit status 1."""
    try:
        yield
    except MinisglError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
