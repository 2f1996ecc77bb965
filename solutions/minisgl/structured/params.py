"""The sampling parameters of a request whose output must follow a JSON Schema or a regex.

A subclass of SamplingParams, so that every layer that carries parameters (the scheduler, the
messages between processes, the LLM API) carries a constraint without knowing about it. It is
checked where it is made: a schema xgrammar cannot follow is an InvalidRequestError (the
server's 400), never an error in the scheduler.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minisgl.core import SamplingParams
from minisgl.utils import InvalidRequestError

if TYPE_CHECKING:
    import xgrammar


@dataclass
class StructuredParams(SamplingParams):
    """SamplingParams plus exactly one constraint: a JSON Schema (as JSON text, or a dict that
    is stored as its JSON text) or a regular expression the whole output must match.

    A constrained request ends when its grammar does: the grammar allows end-of-sequence only
    where the output is complete, and nothing else once it is, so ignore_eos cannot be set.
    """

    json_schema: str | None = None
    regex: str | None = None

    def __post_init__(self) -> None:
        """Check the constraint: exactly one of json_schema and regex, no ignore_eos, and a
        grammar xgrammar can build (else InvalidRequestError naming the field and the reason).

        A dict schema is stored as its JSON text (messages carry text). The base class's
        checks run first. The grammar is built once here to check it (`grammar()`), and
        dropped: the engine compiles it against its vocabulary.
        """
        super().__post_init__()
        if isinstance(self.json_schema, dict):
            self.json_schema = json.dumps(self.json_schema)
        if (self.json_schema is None) == (self.regex is None):
            raise InvalidRequestError("give exactly one of json_schema and regex")
        if self.ignore_eos:
            raise InvalidRequestError(
                "ignore_eos cannot be set with a constraint: the request ends with its grammar"
            )
        if self.json_schema is not None:
            try:
                json.loads(self.json_schema)
            except json.JSONDecodeError as error:
                raise InvalidRequestError(f"json_schema is not valid JSON: {error}") from error
        try:
            self.grammar()
        except RuntimeError as error:
            field = "json_schema" if self.json_schema is not None else "regex"
            raise InvalidRequestError(f"{field} cannot be followed: {_reason(error)}") from error

    def grammar(self) -> xgrammar.Grammar:
        """The constraint as an xgrammar Grammar (raises RuntimeError if it has none)."""
        import xgrammar  # takes seconds to load, and most processes never see a constraint

        if self.json_schema is not None:
            # One compact layout: a model cannot spend its tokens on whitespace.
            return xgrammar.Grammar.from_json_schema(self.json_schema, any_whitespace=False)
        return xgrammar.Grammar.from_regex(self.regex)


def _reason(error: RuntimeError) -> str:
    """xgrammar's message without its C++ location ("[12:00:00] /project/cpp/x.cc:12: ")."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(error).strip())
