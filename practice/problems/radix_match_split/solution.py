from __future__ import annotations


class Node:
    """A radix-tree node (given: do not change). The root has an empty key."""

    def __init__(self, key: list[int], parent: Node | None = None) -> None:
        self.key = list(key)  # the tokens on the edge from the parent
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}  # first page of a child's key -> child


def _split(node: Node, at: int, page_size: int) -> Node:
    """Cut node's edge after `at` tokens; return the new upper node (node stays below it)."""
    upper = Node(node.key[:at], node.parent)
    node.parent.children[tuple(node.key[:page_size])] = upper
    node.key, node.parent = node.key[at:], upper
    upper.children[tuple(node.key[:page_size])] = node
    return upper


def match_prefix(root: Node, ids: list[int], page_size: int) -> tuple[Node, int]:
    """Walk `ids` down from the root; return the deepest node reached and the tokens matched
    (a multiple of page_size). If the match ends inside an edge, split that edge there."""
    node, matched = root, 0
    while matched < len(ids):
        rest = ids[matched:]
        child = node.children.get(tuple(rest[:page_size]))
        if child is None:
            break
        common = 0
        while common < min(len(child.key), len(rest)) and child.key[common] == rest[common]:
            common += 1
        common -= common % page_size
        if common == 0:
            break
        if common < len(child.key):
            child = _split(child, common, page_size)
        node, matched = child, matched + common
    return node, matched
