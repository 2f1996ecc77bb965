"""Problem 14: Context.forward_batch, the context manager around one forward."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import minisgl.core as core
from minisgl.core import Batch, Context


@contextmanager
def forward_batch(ctx: Context, batch: Batch) -> Iterator[Batch]:
    """Make `ctx` the active context and `batch` its current batch, for one forward."""
    if ctx._batch is not None or core._ACTIVE_CTX is not None:
        raise RuntimeError("forward_batch cannot be nested")
    ctx._batch, core._ACTIVE_CTX = batch, ctx
    try:
        yield batch
    finally:
        ctx._batch, core._ACTIVE_CTX = None, None
