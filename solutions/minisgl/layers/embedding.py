"""Token embedding and the LM head, which may share one matrix ("tied" embeddings)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    """Look up one row of a [vocab_size, hidden_size] matrix per token id."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embedding row of each token id: [...] -> [..., hidden_size]."""
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """Project hidden states to vocabulary logits.

    With tied embeddings (SmolLM2, Qwen3-0.6B) the head reuses the embedding matrix, so the
    checkpoint has no `lm_head.weight` and this module owns no parameter of its own.
    """

    def __init__(
        self, vocab_size: int, hidden_size: int, tied_to: VocabEmbedding | None = None
    ) -> None:
        super().__init__()
        self.tied_to = tied_to
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab_size], using the embedding matrix when tied."""
        weight = self.tied_to.weight if self.tied_to is not None else self.weight
        return F.linear(hidden, weight)
