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
        params = [req.sampling_params for req in reqs]
        greedy = [p.is_greedy for p in params]

        def column(values: list[float | int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).view(-1, 1).to(self.device)

        return SamplingArgs(
            all_greedy=all(greedy),
            greedy=torch.tensor(greedy).to(self.device),
            temperature=column([1.0 if g else p.temperature for g, p in zip(greedy, params)],
                               torch.float32),
            top_k=column([self.vocab_size if p.top_k == -1 else p.top_k for p in params],
                         torch.int64),
            top_p=column([p.top_p for p in params], torch.float32),
        )

    def sample(self, logits: torch.Tensor, args: SamplingArgs) -> torch.Tensor:
        """logits: [batch, vocab] -> next token ids [batch] (int64, on the device)."""
        greedy_tokens = logits.argmax(dim=-1)
        if args.all_greedy:
            return greedy_tokens
        probs = torch.softmax(logits.float() / args.temperature, dim=-1)
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[-1], device=logits.device)
        # top-k first: keep ranks < k, renormalized. Then top-p on what is left (as
        # transformers and vLLM do): keep a token if the tokens ranked before it hold less
        # than top_p of the mass, so the top-1 token always stays.
        sorted_probs = sorted_probs.masked_fill(rank >= args.top_k, 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= args.top_p, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=self.generator)
        sampled = sorted_ids.gather(-1, choice).squeeze(-1)
        return torch.where(args.greedy, greedy_tokens, sampled)
