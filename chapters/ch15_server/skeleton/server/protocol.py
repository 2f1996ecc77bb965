"""The request bodies of the OpenAI API that minisgl serves, as pydantic models.

Types are checked by pydantic (a string for max_tokens is a 400); ranges are checked by
SamplingParams itself, so the server and the offline LLM refuse the same requests.
"""

from __future__ import annotations

from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from minisgl import features
from minisgl.core import SamplingParams

DEFAULT_MAX_TOKENS = 128


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions.

    The OpenAI API has more fields than these: the others are kept (in `model_extra`) for the
    functions of features.SAMPLING_EXTENSIONS, which a later chapter may add.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default: sampling, not greedy
    top_p: float = 1.0
    top_k: int = -1  # an extension (as in vLLM and SGLang): -1 means off
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # an extension: run to max_tokens even after EOS
    seed: int | None = None
    n: Literal[1] = 1  # one choice per request
    stream: bool = False
    stream_options: StreamOptions | None = None

    def sampling_params(self) -> SamplingParams:
        """The engine's SamplingParams; InvalidRequestError names a field out of range."""
        raise NotImplementedError("ch15: The engine's SamplingParams; InvalidRequestError names a field out of range.")

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


# A function that reads more of a request's fields (a row of features.SAMPLING_EXTENSIONS):
# it gets the request and the parameters made so far, and returns the parameters to use (or
# raises InvalidRequestError, a 400).
SamplingExtension = Callable[[SamplingFields, SamplingParams], SamplingParams]


def request_params(body: SamplingFields) -> SamplingParams:
    """The SamplingParams of a request: its sampling fields, then what each function of
    features.SAMPLING_EXTENSIONS reads from the others."""
    params = body.sampling_params()
    for part in features.SAMPLING_EXTENSIONS:
        extend: SamplingExtension = part.load()
        params = extend(body, params)
    return params


class CompletionRequest(SamplingFields):
    prompt: str | list[int] = Field(min_length=1)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # the newer name of max_tokens

    def sampling_params(self) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params()
