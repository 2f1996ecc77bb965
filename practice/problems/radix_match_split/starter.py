from __future__ import annotations


class Node:
    """A radix-tree node (given: do not change). The root has an empty key."""

    def __init__(self, key: list[int], parent: Node | None = None) -> None:
        self.key = list(key)  # the tokens on the edge from the parent
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}  # first page of a child's key -> child


def match_prefix(root: Node, ids: list[int], page_size: int) -> tuple[Node, int]:
    """Walk `ids` down from the root; return the deepest node reached and the tokens matched
    (a multiple of page_size). If the match ends inside an edge, split that edge there."""
    raise NotImplementedError("walk the children by first page, match whole pages, split")
