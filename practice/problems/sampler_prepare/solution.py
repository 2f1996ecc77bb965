from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.engine.sample import BatchSamplingArgs, Sampler, step_seed
from minisgl.utils import make_device_tensor


def prepare(self: Sampler, batch: Batch) -> BatchSamplingArgs:
    """Gather the sampling parameters of a batch's requests into per-row tensors on
    self.device (see BatchSamplingArgs for the shapes and dtypes)."""
    params = [req.sampling_params for req in batch.reqs]
    greedy = [p.is_greedy for p in params]

    def column(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return make_device_tensor(values, dtype, self.device).view(-1, 1)

    return BatchSamplingArgs(
        all_greedy=all(greedy),
        greedy=make_device_tensor(greedy, torch.bool, self.device),
        temperature=column(
            [1.0 if g else p.temperature for g, p in zip(greedy, params)], torch.float32
        ),
        top_k=column([self.vocab_size if p.top_k == -1 else p.top_k for p in params], torch.int64),
        top_p=column([p.top_p for p in params], torch.float32),
        row_seeds={
            row: step_seed(req.sampling_params.seed, req.device_len)
            for row, req in enumerate(batch.reqs)
            if req.sampling_params.seed is not None and not greedy[row]
        },
    )
