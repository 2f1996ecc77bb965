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
        n = min(len(key), len(ids))
        mismatch = (key[:n] != ids[:n]).nonzero()
        common = int(mismatch[0]) if len(mismatch) else n
        return common - common % self.page_size

    def _walk(self, ids: torch.Tensor) -> tuple[RadixTreeNode, int]:
        """Follow ids down the tree, splitting the last edge where the match ends inside it.

        Returns the deepest node reached and the number of tokens matched (a page multiple).
        At each node, pick the child by `_child_key` of the rest of ids, measure the common
        prefix with `_match_len`, `_split` the child if the match ends inside its edge, and
        touch every node passed (`last_access`) so LRU eviction spares recently used paths.
        """
        node, matched = self.root, 0
        while matched < len(ids):
            child = node.children.get(self._child_key(ids[matched:]))
            if child is None:
                break
            common = self._match_len(child.key, ids[matched:])
            if common == 0:
                break
            if common < len(child.key):
                child = self._split(child, common)
            node, matched = child, matched + common
            node.last_access = next(_clock)
        return node, matched

    def _split(self, node: RadixTreeNode, at: int) -> RadixTreeNode:
        """Cut node's edge after `at` tokens; return the new upper node (node stays below).

        The upper node takes the first `at` tokens and slots, the parent's child entry, and
        node's ref_count and last_access (every request locking node also locks the path
        above it); node keeps the rest and becomes the upper node's only child. Sizes do not
        change: the same tokens are cached, in two nodes instead of one.
        """
        assert node.parent is not None and 0 < at < len(node.key) and at % self.page_size == 0
        upper = RadixTreeNode(
            key=node.key[:at],
            value=node.value[:at],
            parent=node.parent,
            ref_count=node.ref_count,
            last_access=node.last_access,
        )
        node.parent.children[self._child_key(node.key)] = upper
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        upper.children[self._child_key(node.key)] = node
        return upper

    def _path_values(self, node: RadixTreeNode) -> torch.Tensor:
        parts = []
        while node.parent is not None:
            parts.append(node.value)
            node = node.parent
        return torch.cat(parts[::-1]) if parts else self.root.value

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """Walk the tree along input_ids; return the matched handle and the slots of its path."""
        node, matched = self._walk(input_ids.cpu())
        return MatchResult(RadixCacheHandle(matched, node), self._path_values(node))

    # ----- locking ------------------------------------------------------------------------

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """Add (or remove) one reference on every node from the handle's node up to the root.

        A node's tokens move from evictable to protected when its count leaves 0, and back
        when it returns to 0: keep `_evictable_size` and `_protected_size` in step. The root
        is never counted.
        """
        assert isinstance(handle, RadixCacheHandle)
        node: RadixTreeNode | None = handle.node
        while node is not None and node is not self.root:
            if unlock:
                assert node.ref_count > 0, "unlocking a node that is not locked"
                node.ref_count -= 1
                if node.ref_count == 0:  # no request holds it any more: it may be evicted
                    self._evictable_size += len(node.key)
                    self._protected_size -= len(node.key)
            else:
                if node.ref_count == 0:
                    self._evictable_size -= len(node.key)
                    self._protected_size += len(node.key)
                node.ref_count += 1
            node = node.parent

    # ----- insertion ----------------------------------------------------------------------

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> tuple[int, BaseCacheHandle]:
        """Insert the page-aligned prefix; return how much was already cached and a handle.

        Only whole pages are cached: cut input_ids to a page multiple, `_walk` it, and hang the
        unmatched rest below the node reached as one new (unlocked, evictable) leaf with its
        slots. The caller frees its own slots of the part that was already cached.
        """
        aligned = len(input_ids) - len(input_ids) % self.page_size
        ids = input_ids[:aligned].cpu()
        node, matched = self._walk(ids)
        if matched < aligned:
            leaf = RadixTreeNode(
                key=ids[matched:].clone(), value=indices[matched:aligned].clone(), parent=node
            )
            node.children[self._child_key(leaf.key)] = leaf
            self._evictable_size += len(leaf.key)
            node = leaf
        return matched, RadixCacheHandle(aligned, node)

    # ----- eviction -----------------------------------------------------------------------

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Evict LRU unlocked leaves until num_tokens are freed; return their slots.

        Only a leaf with ref_count 0 may go, least recently used first (a heap on
        last_access); removing a leaf may turn its parent into an evictable leaf, which then
        joins the heap. Raise RuntimeError if fewer than num_tokens are evictable.
        """
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
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(leaf.key)]
            freed.append(leaf.value)
            evicted += len(leaf.key)
            self._evictable_size -= len(leaf.key)
            if parent is not self.root and parent.is_leaf() and parent.ref_count == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        return torch.cat(freed)

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
