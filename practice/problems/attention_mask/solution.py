"""Problem 51: the attention mask of a padded batch (torch backend)."""

from __future__ import annotations


def attention_mask(ledgers: list[tuple[int, int]]) -> list[list[list[bool]]]:
    """mask[b][i][j]: may query row i of request b attend to key position j?
    ledgers: (cached_len, device_len) per request."""
    if not ledgers or any(not 0 <= cached < device for cached, device in ledgers):
        raise ValueError(f"invalid batch: {ledgers}")
    max_extend = max(device - cached for cached, device in ledgers)
    max_seq = max(device for _, device in ledgers)
    return [
        [[j <= cached + i for j in range(max_seq)] for i in range(max_extend)]
        for cached, _ in ledgers
    ]
