from __future__ import annotations

import heapq

import torch

from minisgl.kvcache.radix_cache import RadixTreeNode, RadixPrefixCache


def evict(self: RadixPrefixCache, num_tokens: int) -> torch.Tensor:
    """Drop at least `num_tokens` unlocked cached tokens, least recently used leaves first;
    return the KV slots they occupied."""
    if num_tokens <= 0:
        return self.root.value
    if num_tokens > self._evictable_size:
        raise RuntimeError(
            f"cannot evict {num_tokens} tokens: only {self._evictable_size} are evictable"
        )
    leaves = [
        (n.last_access, id(n), n)
        for n in self._nodes()
        if n.is_leaf() and n.ref_count == 0 and n is not self.root
    ]
    heapq.heapify(leaves)
    freed: list[torch.Tensor] = []
    evicted = 0
    while evicted < num_tokens:
        _, _, leaf = heapq.heappop(leaves)
        parent: RadixTreeNode = leaf.parent
        del parent.children[self._child_key(leaf.key)]
        freed.append(leaf.value)
        evicted += len(leaf.key)
        self._evictable_size -= len(leaf.key)
        if parent is not self.root and parent.is_leaf() and parent.ref_count == 0:
            heapq.heappush(leaves, (parent.last_access, id(parent), parent))
    return torch.cat(freed)
