from __future__ import annotations

import torch

from minisgl.core import Req
from minisgl.engine.sample import Sampler, SamplingArgs


def prepare(self: Sampler, reqs: list[Req]) -> SamplingArgs:
    """Gather the sampling parameters of a batch's requests into per-row tensors on
    self.device (see SamplingArgs for the shapes and dtypes)."""
    raise NotImplementedError("one row per request: greedy flags, temperature, top_k, top_p")
