"""Problem 22: Llama 3's rescaling of the RoPE frequencies."""

from __future__ import annotations

import math
from typing import Any

import torch


def llama3_inv_freq(head_dim: int, base: float, scaling: dict[str, Any]) -> torch.Tensor:
    """The head_dim/2 RoPE speeds base**(-2i/head_dim), with slow ones divided by `factor`,
    fast ones kept and the band between interpolated smoothly. float32."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    result = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    in_band = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(in_band, interpolated, result)
