import heapq


def eviction_order(
    nodes: dict[str, tuple[str | None, int, int, int]], num_tokens: int
) -> list[str]:
    """Names of the nodes evicted, in order, to free at least num_tokens tokens.

    nodes[name] = (parent name or None for a child of the root, tokens, last_access, ref_count).
    Raises ValueError if fewer than num_tokens tokens are evictable.
    """
    if num_tokens <= 0:
        return []
    evictable = sum(tokens for _, tokens, _, ref in nodes.values() if ref == 0)
    if num_tokens > evictable:
        raise ValueError(f"cannot evict {num_tokens} tokens: only {evictable} are evictable")
    children = {name: 0 for name in nodes}
    for parent, _, _, _ in nodes.values():
        if parent is not None:
            children[parent] += 1
    heap = [
        (last, name)
        for name, (_, _, last, ref) in nodes.items()
        if ref == 0 and children[name] == 0
    ]
    heapq.heapify(heap)
    order: list[str] = []
    evicted = 0
    while evicted < num_tokens:
        _, name = heapq.heappop(heap)
        parent, tokens, _, _ = nodes[name]
        order.append(name)
        evicted += tokens
        if parent is not None:
            children[parent] -= 1
            _, _, last, ref = nodes[parent]
            if children[parent] == 0 and ref == 0:
                heapq.heappush(heap, (last, parent))
    return order
