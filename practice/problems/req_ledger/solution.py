"""Problem 11: the derived members of the request ledger (minisgl.core.Req)."""

from __future__ import annotations

from minisgl.core import Req


def extend_len(req: Req) -> int:
    """Tokens the next forward computes: the whole uncached prompt, or 1 when decoding."""
    return req.device_len - req.cached_len


def remain_len(req: Req) -> int:
    """Tokens still to generate before max_tokens is reached."""
    return req.max_device_len - req.device_len


def can_decode(req: Req) -> bool:
    """Whether the request may generate another token."""
    return remain_len(req) > 0


def complete_one(req: Req) -> None:
    """Record a finished forward: its K/V are cached and one more token was sampled."""
    req.cached_len = req.device_len
    req.device_len += 1
