from __future__ import annotations

from minisgl.core import Req
from minisgl.scheduler.prefill import PrefillAdder
from minisgl.scheduler.utils import PendingReq


def try_add_one(self: PrefillAdder, pending_req: PendingReq) -> Req | None:
    """Admit `pending_req` (or its next chunk) into the batch, or return None if it must wait."""
    if self.token_budget <= 0:
        return None
    if (chunk := pending_req.chunked_req) is not None:  # it holds its row, pages and handle
        need = self.worst_case_tokens(pending_req, chunk.cached_len)
        if self.reserved_size + need > self.cache_manager.available_size:
            return None
        self.reserved_size += need
        return self._add_one_req(pending_req, chunk.cache_handle, chunk.table_idx, chunk.cached_len)
    if self.table_manager.available_size == 0:
        return None
    match = self.cache_manager.match_req(pending_req.input_ids)
    self.cache_manager.lock(match.handle)  # protect the match from our own eviction
    need = self.worst_case_tokens(pending_req, match.handle.cached_len)
    if self.reserved_size + need > self.cache_manager.available_size:
        self.cache_manager.unlock(match.handle)
        return None
    table_idx = self.table_manager.allocate()
    self.cache_manager.map_prefix(table_idx, match)
    self.reserved_size += need
    return self._add_one_req(pending_req, match.handle, table_idx, match.handle.cached_len)
