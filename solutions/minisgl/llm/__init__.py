"""The offline interface: generate text for a list of prompts in one call."""

from .llm import LLM
