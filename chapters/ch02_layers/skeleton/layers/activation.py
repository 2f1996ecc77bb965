"""The gated activation of Llama-style MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, where the last dimension of `gate_up` is [gate | up] (merged projection)."""
    raise NotImplementedError("ch02: SiLU(gate) * up, where the last dimension of `gate_up` is [gate | up] (merged projection).")
