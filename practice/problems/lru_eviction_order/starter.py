import heapq


def eviction_order(
    nodes: dict[str, tuple[str | None, int, int, int]], num_tokens: int
) -> list[str]:
    """Names of the nodes evicted, in order, to free at least num_tokens tokens.

    nodes[name] = (parent name or None for a child of the root, tokens, last_access, ref_count).
    Raises ValueError if fewer than num_tokens tokens are evictable.
    """
    raise NotImplementedError("evict unlocked leaves, least recently used first")
