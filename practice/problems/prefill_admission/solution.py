from __future__ import annotations

from minisgl.core import Req
from minisgl.scheduler.prefill import PrefillAdder
from minisgl.scheduler.utils import PendingReq


def try_add(self: PrefillAdder, pending: PendingReq) -> Req | None:
    """Admit `pending` (or its next chunk) into the batch, or return None if it must wait."""
    if self.token_budget <= 0:
        return None
    if pending.table_idx is None:  # first admission: match the prefix cache, take a row
        if self.table_manager.available_size == 0:
            return None
        match = self.cache_manager.match_req(pending.input_ids)
        self.cache_manager.lock(match.handle)  # protect the match from our own eviction
        need = self.worst_case_tokens(pending, match.handle.cached_len)
        if self.reserved_tokens + need > self.cache_manager.available_size:
            self.cache_manager.unlock(match.handle)
            return None
        pending.table_idx = self.table_manager.allocate()
        pending.cache_handle = match.handle
        pending.cached_len = match.handle.cached_len
        self.cache_manager.page_table[pending.table_idx, : pending.cached_len] = \
            match.indices.to(self.cache_manager.page_table.dtype)
    else:  # a later chunk: the request already holds its row, pages and handle
        need = self.worst_case_tokens(pending, pending.cached_len)
        if self.reserved_tokens + need > self.cache_manager.available_size:
            return None
    self.reserved_tokens += need
    return self._make_req(pending)
