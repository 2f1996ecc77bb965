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
        params = [req.sampling_params for req in batch.reqs]
        greedy = [p.is_greedy for p in params]
        # The four columns as rows of one float32 host tensor, copied to the device at once
        # (a copy costs the host about as much as it costs to fill): top-k values are
        # integers below 2**24, which float32 holds exactly.
        columns = make_device_tensor(
            [
                greedy,
                [1.0 if g else p.temperature for g, p in zip(greedy, params)],
                [self.vocab_size if p.top_k == -1 else p.top_k for p in params],
                [p.top_p for p in params],
            ],
            torch.float32,
            self.device,
        )
        return BatchSamplingArgs(
            all_greedy=all(greedy),
            greedy=columns[0].bool(),
            temperature=columns[1].view(-1, 1),
            top_k=columns[2].long().view(-1, 1),
            top_p=columns[3].view(-1, 1),
            row_seeds={
                row: step_seed(req.sampling_params.seed, req.device_len)
                for row, req in enumerate(batch.reqs)
                if req.sampling_params.seed is not None and not greedy[row]
            },
        )

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: [batch, vocab] -> next token ids [batch] (int64, on the device).

        A greedy row takes the argmax (the first maximum). A random row draws from
        softmax(logits / temperature) cut by top-k first, then by top-p over what top-k kept,
        renormalized: a token stays if the tokens ranked before it hold less than top_p of
        that mass, so the top token always stays. Equal probabilities rank by token id. A
        row of `args.row_seeds` draws with a generator of its seed, the others with the
        sampler's own generator.
        """
        # The argmax, by the max reduction: on a CPU several times faster than argmax itself,
        # with the same rule for ties (the first maximum).
        greedy_tokens = logits.max(dim=-1).indices
        if args.all_greedy:
            return greedy_tokens
        probs = torch.softmax(logits.float() / args.temperature, dim=-1)
        # Stable: equal probabilities rank by token id, so a row's ranking, and which of
        # several tied tokens top-k and top-p keep, depends on its own values alone.
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True, stable=True)
        rank = torch.arange(logits.shape[-1], device=logits.device)
        # top-k first: keep ranks < k, renormalized. Then top-p on what is left (as
        # transformers and vLLM do): keep a token if the tokens ranked before it hold less
        # than top_p of the mass, so the top-1 token always stays.
        sorted_probs = sorted_probs.masked_fill(rank >= args.top_k, 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= args.top_p, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=self.generator)
        for row, seed in args.row_seeds.items():  # a seeded request draws on its own
            own = torch.Generator(device=logits.device).manual_seed(seed)
            choice[row] = torch.multinomial(sorted_probs[row], 1, generator=own)
        sampled = sorted_ids.gather(-1, choice).squeeze(-1)
        return torch.where(args.greedy, greedy_tokens, sampled)
