"""Verification: which drafts the model agrees with, and the rollback of those it rejects.

A verify step computes, in one forward, the K/V of a request's last token and its k drafts,
and the model's greedy choice after each of them. Draft i is accepted if it equals the choice
after draft i - 1 (the first, the choice after the last token), and only while every draft
before it was accepted: the K/V behind an accepted draft is the K/V plain decoding would
have computed. The model's own choice after the last accepted draft comes for free, so a step
yields 1 to k + 1 tokens, each one exactly the token plain greedy decoding gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.utils import div_ceil

if TYPE_CHECKING:
    from minisgl.core import Req
    from minisgl.scheduler.cache import CacheManager


def accepted_length(drafts: list[int], choices: list[int]) -> int:
    """How many leading drafts equal the model's greedy choices at their positions.

    choices[i] is the model's token after the last token and drafts[:i]; the count stops at
    the first draft that differs. 0 <= result <= len(drafts).
    """
    accepted = 0
    for draft, choice in zip(drafts, choices):
        if draft != choice:
            break
        accepted += 1
    return accepted


def roll_back(cache_manager: CacheManager, req: Req, seq_len: int) -> None:
    """Shrink a verified request's ledger to its `seq_len` kept tokens; free the pages beyond.

    Before: the ledger covers the last token and every draft (the verify step computed
    [cached_len, device_len)), and pages are allocated up to device_len. After: device_len =
    seq_len and cached_len = seq_len - 1, as after a plain decode step (the K/V of every kept
    token but the newest is valid; the newest one's is computed by the next step). The request
    keeps the pages up to ceil(cached_len / page); the pages from there up to
    ceil(old device_len / page) go back to the free list (`free`: inside a lazy_free_region,
    at its end). A kept page may hold rejected K/V past cached_len: those slots are written
    again before anything reads them.
    """
    page = cache_manager.page_size
    allocated_end = div_ceil(req.device_len, page) * page
    req.device_len = seq_len
    req.cached_len = seq_len - 1
    kept_end = div_ceil(req.cached_len, page) * page
    if allocated_end > kept_end:
        # A copy: the row's entries may be rewritten while the slots wait in a lazy free.
        cache_manager.free(cache_manager.page_table[req.table_idx, kept_end:allocated_end].clone())
