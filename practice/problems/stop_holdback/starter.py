class StopMatcher:
    """Cuts streamed text at the first stop string, holding back possible prefixes."""

    def __init__(self, stop: list[str]) -> None:
        """Given: the non-empty stop strings, and nothing held back yet."""
        self.stop = [s for s in stop if s]
        self.pending = ""  # received, not yet emitted

    def push(self, piece: str) -> tuple[str, bool]:
        """Take new text; return (text safe to show, whether a stop string matched)."""
        raise NotImplementedError("find the earliest stop string, or hold back a prefix")

    def flush(self) -> str:
        """The request ended without a stop: return what is held back."""
        raise NotImplementedError("return the held-back text")
