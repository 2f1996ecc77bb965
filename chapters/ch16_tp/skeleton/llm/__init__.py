"""The offline interface: generate text for a list of prompts in one call."""

from .llm import LLM
from .tp import TPScheduler  # registers itself in SCHEDULER_TYPES
