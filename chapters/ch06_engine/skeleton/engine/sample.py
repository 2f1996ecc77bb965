"""Turn each request's logits into its next token: greedy, or temperature + top-k + top-p.

Every request in a batch has its own parameters, so the sampler works on per-row tensors.
A seeded generator makes random sampling repeatable for the same seed and batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.core import Req


@dataclass
class SamplingArgs:
    """Per-row sampling parameters of one batch, as tensors on the device."""

    all_greedy: bool
    greedy: torch.Tensor  # [batch] bool
    temperature: torch.Tensor  # [batch, 1] float32; 1.0 for greedy rows (never used)
    top_k: torch.Tensor  # [batch, 1] int64; vocab size where top-k is off
    top_p: torch.Tensor  # [batch, 1] float32


class Sampler:
    def __init__(self, device: torch.device, vocab_size: int, seed: int) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def prepare(self, reqs: list[Req]) -> SamplingArgs:
        """Per-row sampling tensors for these requests (temperature, top-k, top-p, greedy)."""
        raise NotImplementedError("ch06: Per-row sampling tensors for these requests (temperature, top-k, top-p, greedy).")

    def sample(self, logits: torch.Tensor, args: SamplingArgs) -> torch.Tensor:
        """logits: [batch, vocab] -> next token ids [batch] (int64, on the device)."""
        raise NotImplementedError("ch06: logits: [batch, vocab] -> next token ids [batch] (int64, on the device).")
