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
        if msg.messages is not None:
            if self.tokenizer.chat_template is None:
                raise InvalidRequestError(
                    "this model's tokenizer has no chat template: use /v1/completions"
                )
            ids = self.tokenizer.apply_chat_template(
                msg.messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            return list(ids)
        if isinstance(msg.prompt, list):
            return list(msg.prompt)
        if msg.prompt is None:
            raise InvalidRequestError("a request needs a prompt or messages")
        return self.tokenizer.encode(msg.prompt)
