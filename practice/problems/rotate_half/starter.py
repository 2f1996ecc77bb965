"""Problem 21: rotate_half for rotary position embedding."""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension, split in halves."""
    raise NotImplementedError("swap the halves of the last dimension, negating the second")
