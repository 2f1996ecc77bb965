"""Small helpers shared by every part of the engine, and the engine's error types."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def div_ceil(a: int, b: int) -> int:
    """Ceiling division for non-negative integers: how many pages of size b hold a tokens."""
    return -(-a // b)


@cache  # one per model directory and process: loading one takes about a quarter of a second
def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer, shared by everything in this process that asks for the same
    directory (the engine only reads it). transformers is imported here, not at the top:
    importing its AutoTokenizer costs about two seconds of CPU (it brings its modeling stack),
    which a process that never loads a tokenizer (a worker, a test of a stub that fails first)
    should not pay."""
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


def check_setting(
    name: str,
    value: object,
    kind: type,
    at_least: float | None = None,
    at_most: float | None = None,
    above: float | None = None,
    optional: bool = False,
) -> None:
    """Raise ConfigError, naming the setting, unless `value` is a `kind` within the bounds
    (`at_least`/`at_most` inclusive, `above` exclusive), or None where `optional`.

    A bool is not an int (True would pass for 1), a float setting takes an int, and a string
    is never a number: a setting of the wrong type is refused here, not by a TypeError deep
    inside a step."""
    if value is None and optional:
        return
    accepted = (int, float) if kind is float else (kind,)
    if not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool)):
        what = f"{kind.__name__} or None" if optional else kind.__name__
        raise ConfigError(f"{name} must be of type {what}, got {value!r} ({type(value).__name__})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return  # a bool setting has no bounds
    if at_least is not None and value < at_least:
        raise ConfigError(f"{name} must be >= {at_least}, got {value!r}")
    if at_most is not None and value > at_most:
        raise ConfigError(f"{name} must be <= {at_most}, got {value!r}")
    if above is not None and value <= above:
        raise ConfigError(f"{name} must be > {above}, got {value!r}")


class InvalidRequestError(MinisglError, ValueError):
    """A request that can never be served (empty prompt, bad parameters, too long)."""


class RequestTooLongError(InvalidRequestError):
    """A request can never fit in the KV cache or the page table."""


class PeerDiedError(RuntimeError):
    """A collective failed because another process of the group is gone: gloo raises a bare
    RuntimeError ("Connection closed by peer") when a rank exits mid-collective. The rank that
    raises this is not the one that failed; the launcher names the one that did."""


@contextmanager
def needs_peers() -> Iterator[None]:
    """Run a collective: a RuntimeError from it becomes a PeerDiedError (the original chained),
    so that a rank can tell "another rank died" from its own failure."""
    try:
        yield
    except RuntimeError as error:
        raise PeerDiedError(f"a collective failed, another rank is gone: {error}") from error


@contextmanager
def exit_on_error() -> Iterator[None]:
    """Run an entry point's body; turn a MinisglError into one clear line and exit status 1."""
    try:
        yield
    except MinisglError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
