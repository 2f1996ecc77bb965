"""Turn each request's logits into its next token: greedy, or temperature + top-k + top-p.

Every request in a batch has its own parameters, so the sampler works on per-row tensors,
built on the host and copied to the device once per batch. Random rows draw from the
engine's generator (seeded by EngineConfig.seed), except rows of requests with their own
seed: those draw from a generator of their own, so their draws do not depend on the batch
(their logits may, in the last bits: SamplingParams says what a seed promises).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.core import Batch
from minisgl.utils import make_device_tensor


@dataclass
class BatchSamplingArgs:
    """Per-row sampling parameters of one batch, as tensors on the device."""

    all_greedy: bool
    greedy: torch.Tensor  # [batch] bool
    temperature: torch.Tensor  # [batch, 1] float32; 1.0 for greedy rows (never used)
    top_k: torch.Tensor  # [batch, 1] int64; vocab size where top-k is off
    top_p: torch.Tensor  # [batch, 1] float32
    # row -> seed of this step, for the random rows of requests that brought their own seed
    row_seeds: dict[int, int] = field(default_factory=dict)


def step_seed(seed: int, position: int) -> int:
    """The seed of one sampling step of a seeded request: a function of the request's seed
    and the position it samples, so a replay of the same request draws the same numbers."""
    return (seed * 1_000_003 + position) % 2**63


class Sampler:
    def __init__(self, device: torch.device, vocab_size: int, seed: int) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        """Per-row sampling tensors of a batch (temperature, top-k, top-p, greedy, seeds).

        Call it before the batch's ledgers advance: a request samples position device_len.
        """
        raise NotImplementedError("ch06: Per-row sampling tensors of a batch (temperature, top-k, top-p, greedy, seeds).")

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: [batch, vocab] -> next token ids [batch] (int64, on the device).

        A greedy row takes the argmax (the first maximum). A random row draws from
        softmax(logits / temperature) cut by top-k first, then by top-p over what top-k kept,
        renormalized: a token stays if the tokens ranked before it hold less than top_p of
        that mass, so the top token always stays. Equal probabilities rank by token id. A
        row of `args.row_seeds` draws with a generator of its seed, the others with the
        sampler's own generator.
        """
        raise NotImplementedError("ch06: logits: [batch, vocab] -> next token ids [batch] (int64, on the device).")
