"""Structured output: requests whose tokens must follow a grammar (a JSON Schema or a regex).

`StructuredParams` says what a request must follow; the engine's `GrammarSampler` masks each
step's logits to the tokens the grammar allows, and the server maps OpenAI's `response_format`
onto it. The grammar work is xgrammar's (SGLang's default grammar backend).
"""

from .params import StructuredParams
