"""Problem 23: RMSNorm.forward and RMSNorm.forward_residual of the layered engine."""

from __future__ import annotations

import torch

from minisgl.layers.norm import RMSNorm


def forward(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in float32, cast back to
    x's dtype, then multiplied by the weight."""
    raise NotImplementedError("normalize in float32, cast back, then scale by the weight")


def forward_residual(
    norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add the residual stream first, then normalize: returns (normed, new residual)."""
    raise NotImplementedError("add, then normalize; return both")
