from __future__ import annotations

import torch

from minisgl.core import Req
from minisgl.scheduler.cache import CacheManager
from minisgl.utils import div_ceil, make_device_tensor


def allocate_paged(self: CacheManager, reqs: list[Req]) -> None:
    """Give every request the pages its next forward writes into.

    A request owns pages [0, ceil(cached_len / page)) already; positions up to device_len
    need pages up to ceil(device_len / page). Take the missing pages with self._allocate
    and write their slots into the request's row of self.page_table.
    """
    # reference body: scheduler/cache.py:CacheManager.allocate_paged
