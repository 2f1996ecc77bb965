"""Tests of problem 91: Radix match and split."""

from submission import Node, match_prefix


def build(spec, page_size):
    """spec: list of (key, children_spec) under the root. Returns (root, {tuple(key): node})."""
    root = Node([])
    nodes = {}

    def add(parent, items):
        for key, children in items:
            node = Node(key, parent)
            parent.children[tuple(key[:page_size])] = node
            nodes[tuple(key)] = node
            add(node, children)

    add(root, spec)
    return root, nodes


def shape(node, page_size, path="root"):
    """The tree as nested (key, [children...]) sorted, checking parents and child keys."""
    kids = []
    for first, child in node.children.items():
        where = f"{path} -> {child.key}"
        assert child.parent is node, f"{where}: its parent pointer is not the node above it"
        assert first == tuple(child.key[:page_size]), (
            f"{where}: registered under {first}, "
            f"but its first page is {tuple(child.key[:page_size])}"
        )
        kids.append(shape(child, page_size, where))
    return (node.key, sorted(kids))


def tree(spec):
    return ([], sorted((key, tree(children)[1]) for key, children in spec))


def check(spec, ids, page_size, expected_matched, expected_key, expected_spec):
    root, _ = build(spec, page_size)
    node, matched = match_prefix(root, list(ids), page_size)
    call = f"match_prefix(tree {spec}, ids={ids}, page_size={page_size})"
    assert matched == expected_matched, (
        f"{call}: expected {expected_matched} tokens matched, got {matched}"
    )
    assert node.key == expected_key, (
        f"{call}: expected to end at the node with key {expected_key}, got {node.key}"
    )
    got = shape(root, page_size)
    want = tree(expected_spec)
    assert got == want, f"{call}: the tree afterwards\nexpected {want}\ngot      {got}"
    return root, node


def test_example_split_inside_an_edge():
    check([([1, 2, 3, 4], [])], [1, 2, 9], 1, 2, [1, 2], [([1, 2], [([3, 4], [])])])


def test_example_a_whole_edge_then_a_child():
    check(
        [([1, 2], [([3, 4], []), ([5, 6], [])])],
        [1, 2, 5, 6, 7],
        1,
        4,
        [5, 6],
        [([1, 2], [([3, 4], []), ([5, 6], [])])],
    )


def test_nothing_matches():
    root, node = check([([1, 2], [])], [7, 1, 2], 1, 0, [], [([1, 2], [])])
    assert node is root, "nothing matched: the root must be returned"


def test_empty_ids():
    check([([1, 2], [])], [], 1, 0, [], [([1, 2], [])])


def test_ids_end_inside_an_edge():
    check([([1, 2, 3, 4], [])], [1, 2], 1, 2, [1, 2], [([1, 2], [([3, 4], [])])])


def test_ids_equal_to_an_edge_split_nothing():
    check([([1, 2, 3], [([4], [])])], [1, 2, 3], 1, 3, [1, 2, 3], [([1, 2, 3], [([4], [])])])


def test_pages_round_the_match_down():
    check([([1, 2, 3, 4, 5, 6], [])], [1, 2, 3, 9], 2, 2, [1, 2], [([1, 2], [([3, 4, 5, 6], [])])])


def test_a_partial_first_page_matches_nothing():
    check([([1, 2, 3, 4], [])], [1, 3, 3, 4], 2, 0, [], [([1, 2, 3, 4], [])])
    check([([1, 2, 3, 4], [])], [1], 2, 0, [], [([1, 2, 3, 4], [])])


def test_a_partial_last_page_is_not_matched():
    check(
        [([1, 2, 3, 4], [([5, 6], [])])],
        [1, 2, 3, 4, 5],
        2,
        4,
        [1, 2, 3, 4],
        [([1, 2, 3, 4], [([5, 6], [])])],
    )


def test_deep_walk_then_split():
    spec = [([1, 2], [([3, 4, 5, 6], [([7, 8], [])]), ([9, 9], [])])]
    check(
        spec,
        [1, 2, 3, 4, 5, 6, 7, 0],
        1,
        7,
        [7],
        [([1, 2], [([3, 4, 5, 6], [([7], [([8], [])])]), ([9, 9], [])])],
    )


def test_the_existing_node_keeps_the_lower_part():
    root, nodes = build([([1, 2, 3, 4], [([5], [])])], 1)
    lower = nodes[(1, 2, 3, 4)]
    node, matched = match_prefix(root, [1, 2, 8], 1)
    assert lower.key == [3, 4] and lower.parent is node, (
        "after the split the existing node must keep the lower part [3, 4] and hang below the "
        f"new node; it has key {lower.key}"
    )
    assert node is not lower and node.parent is root, "the new upper node must hang from the root"
    assert list(lower.children.values())[0].key == [5], "the existing node keeps its children"


def test_sibling_with_the_same_first_page_after_a_split_is_unambiguous():
    root, _ = build([([1, 2, 3, 4], [])], 2)
    match_prefix(root, [1, 2, 5, 6], 2)
    assert list(root.children) == [(1, 2)], f"the root's children are keyed {list(root.children)}"
    (upper,) = root.children.values()
    assert list(upper.children) == [(3, 4)], (
        f"the new node's children are keyed {list(upper.children)}"
    )
