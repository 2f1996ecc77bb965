"""The radix prefix cache: a tree of token sequences whose K/V are still in the pool.

Each edge holds a run of tokens and the KV slots they were computed into. A new request walks
the tree from the root along its prompt; every token matched is a token it need not compute.
Nodes are shared by all requests with that prefix, so a request *locks* its path while it runs
(a reference count on every node up to the root) and only unlocked leaves may be evicted, least
recently used first.

With page_size > 1 the tree works in whole pages: keys are cut to a multiple of the page size,
and a node is only ever split on a page boundary, so every node's slots are whole pages that
can go back to the free list as pages.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch

from minisgl.kvcache.base import (
    BaseCacheHandle,
    BasePrefixCache,
    MatchResult,
    SizeInfo,
)

_clock = itertools.count()  # a logical clock for LRU order: no two accesses tie


@dataclass(eq=False)
class RadixTreeNode:
    key: torch.Tensor  # token ids on the edge from the parent (CPU, int32)
    value: torch.Tensor  # their KV slots (on the pool's device)
    parent: RadixTreeNode | None = None
    children: dict[tuple[int, ...], RadixTreeNode] = field(default_factory=dict)
    ref_count: int = 0  # running requests whose matched path goes through this node
    last_access: int = field(default_factory=lambda: next(_clock))

    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class RadixCacheHandle(BaseCacheHandle):
    node: RadixTreeNode = field(compare=False)


class RadixPrefixCache(BasePrefixCache):
    def __init__(self, device: torch.device, page_size: int = 1) -> None:
        self.device = device
        self.page_size = page_size
        empty = torch.empty(0, dtype=torch.int32)
        self.root = RadixTreeNode(key=empty, value=empty.to(device), ref_count=1)  # never evicted
        self._evictable_size = 0
        self._protected_size = 0

    # ----- lookup -------------------------------------------------------------------------

    def _child_key(self, ids: torch.Tensor) -> tuple[int, ...]:
        """Children are told apart by their first page of tokens."""
        return tuple(ids[: self.page_size].tolist())

    def _match_len(self, key: torch.Tensor, ids: torch.Tensor) -> int:
        """Length of the common prefix of key and ids, rounded down to whole pages."""
        raise NotImplementedError("ch09: Length of the common prefix of key and ids, rounded down to whole pages.")

    def _walk(self, ids: torch.Tensor) -> tuple[RadixTreeNode, int]:
        """Follow ids down the tree, splitting the last edge where the match ends inside it.

        Returns the deepest node reached and the number of tokens matched (a page multiple).
        At each node, pick the child by `_child_key` of the rest of ids, measure the common
        prefix with `_match_len`, `_split` the child if the match ends inside its edge, and
        touch every node passed (`last_access`) so LRU eviction spares recently used paths.
        """
        raise NotImplementedError("ch09: Follow ids down the tree, splitting the last edge where the match ends inside it.")

    def _split(self, node: RadixTreeNode, at: int) -> RadixTreeNode:
        """Cut node's edge after `at` tokens; return the new upper node (node stays below).

        The upper node takes the first `at` tokens and slots, the parent's child entry, and
        node's ref_count and last_access (every request locking node also locks the path
        above it); node keeps the rest and becomes the upper node's only child. Sizes do not
        change: the same tokens are cached, in two nodes instead of one.
        """
        raise NotImplementedError("ch09: Cut node's edge after `at` tokens; return the new upper node (node stays below).")

    def _path_values(self, node: RadixTreeNode) -> torch.Tensor:
        parts = []
        while node.parent is not None:
            parts.append(node.value)
            node = node.parent
        return torch.cat(parts[::-1]) if parts else self.root.value

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """Walk the tree along input_ids; return the matched handle and the slots of its path."""
        raise NotImplementedError("ch09: Walk the tree along input_ids; return the matched handle and the slots of its path.")

    # ----- locking ------------------------------------------------------------------------

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """Add (or remove) one reference on every node from the handle's node up to the root.

        A node's tokens move from evictable to protected when its count leaves 0, and back
        when it returns to 0: keep `_evictable_size` and `_protected_size` in step. The root
        is never counted.
        """
        raise NotImplementedError("ch09: Add (or remove) one reference on every node from the handle's node up to the root.")

    # ----- insertion ----------------------------------------------------------------------

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> tuple[int, BaseCacheHandle]:
        """Insert the page-aligned prefix; return how much was already cached and a handle.

        Only whole pages are cached: cut input_ids to a page multiple, `_walk` it, and hang the
        unmatched rest below the node reached as one new (unlocked, evictable) leaf with its
        slots. The caller frees its own slots of the part that was already cached.
        """
        raise NotImplementedError("ch09: Insert the page-aligned prefix; return how much was already cached and a handle.")

    # ----- eviction -----------------------------------------------------------------------

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Evict LRU unlocked leaves until num_tokens are freed; return their slots.

        Only a leaf with ref_count 0 may go, least recently used first (a heap on
        last_access); removing a leaf may turn its parent into an evictable leaf, which then
        joins the heap. Raise RuntimeError if fewer than num_tokens are evictable.
        """
        raise NotImplementedError("ch09: Evict LRU unlocked leaves until num_tokens are freed; return their slots.")

    # ----- accounting ---------------------------------------------------------------------

    def _nodes(self) -> list[RadixTreeNode]:
        stack, nodes = [self.root], []
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=self._evictable_size, protected_size=self._protected_size)

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._nodes():
            if node is self.root:
                continue
            if len(node.key) != len(node.value) or len(node.key) % self.page_size:
                raise RuntimeError(
                    f"radix node with {len(node.key)} tokens and "
                    f"{len(node.value)} slots (page_size {self.page_size})"
                )
            assert node.parent is not None
            if node.parent is not self.root and node.parent.ref_count < node.ref_count:
                raise RuntimeError("a node is locked more often than its parent")
            if node.ref_count:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        if (evictable, protected) != (self._evictable_size, self._protected_size):
            raise RuntimeError(
                f"radix size accounting is off: counted evictable={evictable}, "
                f"protected={protected}; recorded {self._evictable_size}, {self._protected_size}"
            )
