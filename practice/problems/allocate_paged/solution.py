from __future__ import annotations

import torch

from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager
from minisgl.utils import div_ceil


def allocate_paged(self: CacheManager, reqs: list[Req]) -> None:
    """Give every request the pages its next forward writes into.

    A request owns pages [0, ceil(cached_len / page)) already; positions up to device_len
    need pages up to ceil(device_len / page). Take the missing pages with self._allocate
    and write their slots into the request's row of self.page_table.
    """
    rows, cols, spans = [], [], []
    for req in reqs:
        first_page = div_ceil(req.cached_len, self.page_size)
        last_page = div_ceil(req.device_len, self.page_size)
        if last_page > first_page:
            start, end = first_page * self.page_size, last_page * self.page_size
            rows.append(torch.full((end - start,), req.table_idx, dtype=torch.int64))
            cols.append(torch.arange(start, end, dtype=torch.int64))
            spans.append(last_page - first_page)
    if not spans:
        return
    pages = self._allocate(sum(spans))
    slots = (pages[:, None] + torch.arange(self.page_size, device=self.device)).flatten()
    row_index = torch.cat(rows).to(self.device)
    col_index = torch.cat(cols).to(self.device)
    self.page_table[row_index, col_index] = slots.to(self.page_table.dtype)
