import torch

from minisgl.engine.sample import Sampler, SamplingArgs


def sample(self: Sampler, logits: torch.Tensor, args: SamplingArgs) -> torch.Tensor:
    """logits [batch, vocab] -> next token ids [batch] (int64, on the logits' device).

    Greedy rows: argmax. Other rows: temperature, then top-k (renormalized), then top-p over
    the sorted probabilities, then one draw with self.generator.
    """
    raise NotImplementedError("sample one token per row: greedy, or temperature + top-k + top-p")
