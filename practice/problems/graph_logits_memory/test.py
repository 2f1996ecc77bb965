"""Tests of problem 183 (graph_pool_bytes), against a simulation of the pool: graphs are
captured largest first; each allocates its scratch (freed at the end of its capture, then
reusable) and its logits (kept); the pool grows only when no freed block is large enough."""

from submission import graph_pool_bytes


def simulate(sizes, vocab, logit_bytes, scratch_per_row):
    pool, free_blocks = 0, []
    for size in sorted(sizes, reverse=True):
        need = size * scratch_per_row
        fitting = [b for b in free_blocks if b >= need]
        if fitting:
            free_blocks.remove(min(fitting))
            block = min(fitting)
        else:
            pool += need
            block = need
        pool += size * vocab * logit_bytes  # kept: never freed
        free_blocks.append(block)
    return pool


def check(sizes, vocab, logit_bytes, scratch):
    got = graph_pool_bytes(list(sizes), vocab, logit_bytes, scratch)
    expected = simulate(sizes, vocab, logit_bytes, scratch)
    assert got == expected, (
        f"graph_pool_bytes({sizes}, {vocab}, {logit_bytes}, {scratch}): "
        f"expected {expected}, got {got}"
    )


def test_example_four_graphs():
    assert graph_pool_bytes([1, 2, 4, 8], 1000, 2, 100) == 30800


def test_a_single_graph():
    check([16], 50, 4, 7)


def test_the_h200_ladder():
    sizes = [1, 2, 4] + list(range(8, 257, 8))
    check(sizes, 151936, 2, 300_000)


def test_order_given_does_not_matter():
    check([8, 1, 4, 2, 16], 10, 2, 1000)
