"""Problem 22: Llama 3's rescaling of the RoPE frequencies."""

from __future__ import annotations

import math
from typing import Any

import torch


def llama3_inv_freq(head_dim: int, base: float, scaling: dict[str, Any]) -> torch.Tensor:
    """The head_dim/2 RoPE speeds base**(-2i/head_dim), with slow ones divided by `factor`,
    fast ones kept and the band between interpolated smoothly. float32."""
    raise NotImplementedError("scale the slow frequencies, keep the fast, interpolate between")
