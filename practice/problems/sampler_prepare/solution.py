from __future__ import annotations

import torch

from minisgl.core import Req
from minisgl.engine.sample import Sampler, SamplingArgs


def prepare(self: Sampler, reqs: list[Req]) -> SamplingArgs:
    """Gather the sampling parameters of a batch's requests into per-row tensors on
    self.device (see SamplingArgs for the shapes and dtypes)."""
    params = [req.sampling_params for req in reqs]
    greedy = [p.is_greedy for p in params]

    def column(values: list[float | int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).view(-1, 1).to(self.device)

    return SamplingArgs(
        all_greedy=all(greedy),
        greedy=torch.tensor(greedy).to(self.device),
        temperature=column([1.0 if g else p.temperature for g, p in zip(greedy, params)],
                           torch.float32),
        top_k=column([self.vocab_size if p.top_k == -1 else p.top_k for p in params],
                     torch.int64),
        top_p=column([p.top_p for p in params], torch.float32),
    )
