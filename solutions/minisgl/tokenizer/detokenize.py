"""Token ids to text, one token at a time, and stop strings.

A token is not a character: byte-level BPE splits "é" or an emoji over several tokens, and
decoding a prefix of them gives U+FFFD, the replacement character. So the detokenizer decodes
a small window of recent tokens and emits only text that ends on a whole character; what is
held back comes out with a later token, or at the end. The pieces concatenate to exactly the
decode of all tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """The text of one request's generated tokens, emitted piece by piece as they arrive.

    Two offsets into `ids` define the window: text of ids[prefix_offset:read_offset] has been
    emitted already; it is decoded again only as context, because many tokenizers decode a
    token differently at the start of a sequence (a leading space, say).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def step(self, token: int) -> str:
        """Add one token; return the new text that is safe to show (maybe "").

        Decode the window with and without the new tokens; if the text grew and does not end
        with U+FFFD, return the growth and slide the window; else return "" and wait.
        """
        self.ids.append(token)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix_text) and not text.endswith(REPLACEMENT_CHAR):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix_text) :]
        return ""  # an incomplete character: wait for the next token

    def flush(self) -> str:
        """Return the text still held back, at the end of the request (a broken tail too)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix_text) :]


class StopMatcher:
    """Cuts a request's text at the first stop string; the stop string itself is not shown.

    Text that might be the start of a stop string ("</" when the stop string is "</end>") is
    held back until the next piece settles it, so no client ever sees part of a stop string.
    """

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self.pending = ""  # received, not yet emitted

    def push(self, piece: str) -> tuple[str, bool]:
        """Take new text; return (text safe to emit, whether a stop string matched).

        On a match, emit only what precedes the earliest stop string. Otherwise hold back the
        longest tail of the pending text that is a proper prefix of some stop string.
        """
        self.pending += piece
        if not self.stop:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = max(
            (k for s in self.stop for k in range(1, len(s)) if self.pending.endswith(s[:k])),
            default=0,
        )
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out, False

    def flush(self) -> str:
        """At the end of the request, what was held back is not a stop string: emit it."""
        out, self.pending = self.pending, ""
        return out
