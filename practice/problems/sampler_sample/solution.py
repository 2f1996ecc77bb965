import torch

from minisgl.engine.sample import BatchSamplingArgs, Sampler


def sample(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """logits [batch, vocab] -> next token ids [batch] (int64, on the logits' device).

    Greedy rows: argmax. Other rows: temperature, then top-k (renormalized), then top-p over
    the sorted probabilities, then one draw with self.generator (or, for a row in
    args.row_seeds, with a generator of its own seeded with that row's seed).
    """
    # reference body: engine/sample.py:Sampler.sample
