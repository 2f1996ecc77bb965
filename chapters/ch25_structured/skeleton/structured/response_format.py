"""OpenAI's `response_format` on /v1/completions and /v1/chat/completions:

- `{"type": "text"}` (the default): no constraint;
- `{"type": "json_object"}`: any JSON object;
- `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}`: an
  object that validates against the schema (always followed exactly, strict or not: the mask
  leaves the model no other choice).

A response_format the API does not define, or a schema the grammar cannot follow, is an
InvalidRequestError: the server answers 400 and the request never reaches the scheduler.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from minisgl.core import SamplingParams
from minisgl.server.protocol import SamplingFields
from minisgl.structured.params import StructuredParams
from minisgl.utils import InvalidRequestError

ANY_OBJECT: dict[str, Any] = {"type": "object"}  # what "json_object" asks for


class JsonSchemaFormat(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")  # {}: any JSON
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def apply_response_format(body: SamplingFields, params: SamplingParams) -> SamplingParams:
    """The parameters a request's `response_format` asks for: `params` unchanged without one
    or for "text", else StructuredParams with the same fields and a JSON Schema.

    The request's field is in `body.model_extra` (a dict, as the client sent it). Read it with
    `ResponseFormat.model_validate`; a ValidationError becomes an InvalidRequestError whose
    message names where (e.g. "response_format.type") and what is wrong. "json_object" asks
    for ANY_OBJECT; "json_schema" without its `json_schema` member is an InvalidRequestError
    too. StructuredParams then checks the schema itself.
    """
    raise NotImplementedError("ch25: The parameters a request's `response_format` asks for: `params` unchanged without one")
