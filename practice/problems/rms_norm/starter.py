"""Problem 1: RMSNorm, as the tiny engine uses it."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x**2) + eps) * weight, the mean taken over the last dimension."""
    raise NotImplementedError("normalize each vector to unit root mean square, then scale")
