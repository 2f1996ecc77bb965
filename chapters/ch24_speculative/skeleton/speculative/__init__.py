"""Speculative decoding by prompt lookup: draft tokens from the request's own text, verified
in one forward (chapter 24)."""

from .ngram import propose_drafts
from .verify import accepted_length, roll_back
from .policy import SpeculativeDecoder
