"""The drafter: guess a request's next tokens from its own sequence (prompt lookup).

A request that quotes, copies or edits text it has seen, which chat, code editing and
summaries do all the time, often goes on the way its own sequence already went. So we look up
the last n tokens earlier in the sequence and propose the tokens that followed them there: no
second model, no training, a few tensor comparisons on the CPU.
"""

from __future__ import annotations

import torch


def propose_drafts(tokens: torch.Tensor, k: int, max_n: int, min_n: int) -> list[int]:
    """Exactly k draft tokens for the sequence `tokens` (1-D, on the CPU).

    Try n = max_n down to min_n (never more than len(tokens) - 1): find the most recent earlier
    occurrence of the last n tokens (one that starts before the suffix itself does) and
    propose the up to k tokens that followed it. The first n that matches wins. A proposal
    shorter than k (the match was followed by the sequence's end), or no match at all, is
    padded by repeating the sequence's last token: every request then verifies exactly k
    drafts, and a padded draft is simply rejected when it is wrong. Only tokens of the
    sequence are read.
    """
    if k == 0:
        return []
    length = len(tokens)
    proposal: list[int] = []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        # Windows starting at 0 .. length-n-1: every occurrence but the suffix itself.
        windows = tokens[: length - 1].unfold(0, n, 1)
        starts = (windows == suffix).all(dim=1).nonzero().flatten()
        if len(starts) > 0:
            follow = int(starts[-1]) + n  # the most recent match is followed from here
            proposal = tokens[follow : follow + k].tolist()
            break
    # A short proposal ran into the sequence's end: its last token is the sequence's too.
    return proposal + [int(tokens[-1])] * (k - len(proposal))
