"""Rotary position embedding (RoPE), including Llama-3's frequency scaling.

Each pair of dimensions (i, i + d/2) of a query or key is rotated by the angle
position * inv_freq[i]. A dot product of a rotated query and a rotated key then depends only on
the distance between their positions. We use Hugging Face's "rotate half" pairing, because the
checkpoints' q/k projection weights were trained with it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from minisgl.utils import UnsupportedModelError


def default_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """inv_freq[i] = base^(-2i/d): fast rotation in the first pairs, slow in the last."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (base**exponents)


def llama3_inv_freq(head_dim: int, base: float, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3's long-context rescaling of the default frequencies.

    Wavelengths longer than the original context / low_freq_factor are slowed down by
    `factor`; wavelengths shorter than original context / high_freq_factor are kept; the band
    in between is interpolated smoothly between the two.
    """
    inv_freq = default_inv_freq(head_dim, base)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(is_medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension, split in halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotate queries and keys by their positions, from a precomputed cos/sin table."""

    def __init__(
        self, head_dim: int, base: float, max_position: int, scaling: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        rope_type = (scaling or {}).get("rope_type", "default")
        if rope_type == "default":
            inv_freq = default_inv_freq(head_dim, base)
        elif rope_type == "llama3":
            inv_freq = llama3_inv_freq(head_dim, base, scaling or {})
        else:
            raise UnsupportedModelError(
                f"RoPE type {rope_type!r} is not supported (supported: default, llama3)"
            )
        freqs = torch.outer(torch.arange(max_position).float(), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)  # [max_position, head_dim]
        # Not parameters: computed here, never loaded; buffers follow the module's device.
        self.register_buffer("cos_cache", angles.cos(), persistent=False)
        self.register_buffer("sin_cache", angles.sin(), persistent=False)
        self._positions: torch.Tensor | None = None  # the last positions looked up, and
        self._cos = self._sin = angles[:0]  # their cos and sin

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]; returns both rotated."""
        # Every layer of a forward rotates by the same positions: look them up once.
        if positions is not self._positions:
            self._positions = positions
            self._cos = self.cos_cache[positions].unsqueeze(1).to(q.dtype)  # [tokens, 1, dim]
            self._sin = self.sin_cache[positions].unsqueeze(1).to(q.dtype)
        cos, sin = self._cos, self._sin
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
