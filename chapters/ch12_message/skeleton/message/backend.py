"""Messages to the scheduler (the "backend"): requests to run, to abort, to report, to stop."""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.core import SamplingParams


@dataclass
class UserMsg:
    """A tokenized request, ready to be queued by the scheduler."""

    uid: int  # chosen by the API server, unique for the server's lifetime
    input_ids: list[int]
    sampling_params: SamplingParams


@dataclass
class AbortBackendMsg:
    """Stop a request now and free its pages (a client left, or a stop string matched)."""

    uid: int


@dataclass
class StatusRequestMsg:
    """Ask the scheduler for a StatusMsg (the API server's /metrics)."""

    request_id: int


@dataclass
class ExitMsg:
    """Shut the receiving process down cleanly."""
