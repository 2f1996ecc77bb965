"""Text to token ids: a completion prompt as it is, chat messages through the chat template."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.message import TokenizeMsg
from minisgl.utils import InvalidRequestError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TokenizeManager:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def tokenize(self, msg: TokenizeMsg) -> list[int]:
        """The prompt token ids of a request: chat messages go through the chat template.

        The template (shipped in the tokenizer's config) adds each role's markers and, with
        `add_generation_prompt`, the opening of the assistant's turn, so the model answers.
        """
        raise NotImplementedError("ch13: The prompt token ids of a request: chat messages go through the chat template.")
