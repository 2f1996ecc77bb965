"""Problem 11: the derived members of the request ledger (minisgl.core.Req)."""

from __future__ import annotations

from minisgl.core import Req


def extend_len(req: Req) -> int:
    """Tokens the next forward computes: the whole uncached prompt, or 1 when decoding."""
    raise NotImplementedError("tokens the next forward computes")


def remain_len(req: Req) -> int:
    """Tokens still to generate before max_tokens is reached."""
    raise NotImplementedError("tokens still to generate")


def can_decode(req: Req) -> bool:
    """Whether the request may generate another token."""
    raise NotImplementedError("may the request generate another token?")


def complete_one(req: Req) -> None:
    """Record a finished forward: its K/V are cached and one more token was sampled."""
    raise NotImplementedError("move the ledger on by one forward")
