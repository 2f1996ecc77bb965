"""The tokenizer worker: text to token ids on the way in, token ids to text on the way out."""

from .tokenize import TokenizeManager
from .detokenize import IncrementalDetokenizer, StopMatcher
from .server import run_tokenizer_worker
