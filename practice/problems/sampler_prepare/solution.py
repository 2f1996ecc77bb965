from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.engine.sample import BatchSamplingArgs, Sampler, step_seed
from minisgl.utils import make_device_tensor


def prepare(self: Sampler, batch: Batch) -> BatchSamplingArgs:
    """Gather the sampling parameters of a batch's requests into per-row tensors on
    self.device (see BatchSamplingArgs for the shapes and dtypes)."""
    # reference body: engine/sample.py:Sampler.prepare
