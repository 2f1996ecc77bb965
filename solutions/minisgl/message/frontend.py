"""Messages to the API server (the "frontend"): text pieces of each request, and statuses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReplyMsg:
    """New text of one request since its previous ReplyMsg.

    `text` pieces concatenate to the request's whole output. The last reply of a request has
    `finish_reason` set ("stop", "length" or "abort") and carries the token counts for
    `usage`; `error` is set instead when the request was refused (bad input, too long).
    """

    uid: int
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class StatusMsg:
    """What the scheduler is doing, for /metrics (the answer to a StatusRequestMsg)."""

    request_id: int
    running: int
    waiting: int
    used_pages: int
    free_pages: int
    cached_pages: int
    generated_tokens: int
    integrity_ok: bool | None  # the last idle integrity check; None before the first
