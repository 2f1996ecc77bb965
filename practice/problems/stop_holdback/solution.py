class StopMatcher:
    """Cuts streamed text at the first stop string, holding back possible prefixes."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self.pending = ""

    def push(self, piece: str) -> tuple[str, bool]:
        """Take new text; return (text safe to show, whether a stop string matched)."""
        self.pending += piece
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
        """The request ended without a stop: return what is held back."""
        out, self.pending = self.pending, ""
        return out
