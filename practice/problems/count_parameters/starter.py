"""Problem 33: count the parameters of a Llama / Qwen2 / Qwen3 decoder from its config."""

from __future__ import annotations

from typing import Any


def count_parameters(hf: dict[str, Any]) -> int:
    """Parameters of the decoder described by a Hugging Face config.json dict."""
    raise NotImplementedError("sum embedding, layers, final norm and (untied) LM head")
