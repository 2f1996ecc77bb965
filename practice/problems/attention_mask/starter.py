"""Problem 51: the attention mask of a padded batch (torch backend)."""

from __future__ import annotations


def attention_mask(ledgers: list[tuple[int, int]]) -> list[list[list[bool]]]:
    """mask[b][i][j]: may query row i of request b attend to key position j?
    ledgers: (cached_len, device_len) per request."""
    raise NotImplementedError("one rule for every cell of [batch][max_extend][max_seq]")
