import torch

from minisgl.engine.sample import BatchSamplingArgs, Sampler


def sample(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """logits [batch, vocab] -> next token ids [batch] (int64, on the logits' device).

    Greedy rows: argmax. Other rows: temperature, then top-k (renormalized), then top-p over
    the sorted probabilities, then one draw with self.generator (or, for a row in
    args.row_seeds, with a generator of its own seeded with that row's seed).
    """
    greedy_tokens = logits.argmax(dim=-1)
    if args.all_greedy:
        return greedy_tokens
    probs = torch.softmax(logits.float() / args.temperature, dim=-1)
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    # top-k first, renormalized; then top-p on what is left (the top token always stays)
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
