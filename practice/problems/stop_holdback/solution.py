class StopMatcher:
    """Cuts streamed text at the first stop string, holding back possible prefixes."""

    def __init__(self, stop: list[str]) -> None:
        """Given: the non-empty stop strings, and nothing held back yet."""
        # reference body: tokenizer/detokenize.py:StopMatcher.__init__

    def push(self, piece: str) -> tuple[str, bool]:
        """Take new text; return (text safe to show, whether a stop string matched)."""
        # reference body: tokenizer/detokenize.py:StopMatcher.push

    def flush(self) -> str:
        """The request ended without a stop: return what is held back."""
        # reference body: tokenizer/detokenize.py:StopMatcher.flush
