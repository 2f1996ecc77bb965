"""Messages to the tokenizer worker: text to tokenize (from the API server) and tokens to
detokenize (from the scheduler)."""

from __future__ import annotations

from dataclasses import dataclass, field

from minisgl.core import SamplingParams


@dataclass
class TokenizeMsg:
    """A request as the API server received it: a plain prompt, or chat messages.

    Exactly one of `prompt` and `messages` is set. Chat messages are {"role", "content"} dicts
    that the tokenizer's chat template turns into one prompt.
    """

    uid: int
    sampling_params: SamplingParams
    prompt: str | list[int] | None = None
    messages: list[dict[str, str]] | None = None
    stop: list[str] = field(default_factory=list)  # stop strings, matched on the text


@dataclass
class DetokenizeMsg:
    """One generated token of one request, as the scheduler reports it.

    `finish_reason` is None while the request runs, then "stop" (EOS), "length" (max_tokens)
    or "abort". A request the scheduler refused gets one DetokenizeMsg with `error` set.
    """

    uid: int
    token: int | None
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class BatchMsg:
    """Several messages in one send: one socket operation per scheduler step, not per token."""

    data: list
