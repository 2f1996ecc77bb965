"""Tests of problem 192: The flat index math of a paged KV store."""

import itertools

import pytest
from submission import store_offsets


def row_starts(shape):
    """(kv, layer, slot, head) -> offset of d = 0, by enumerating the buffer in row-major order."""
    layers, slots, kv_heads, head_dim = shape
    cells = itertools.product(
        range(2), range(layers), range(slots), range(kv_heads), range(head_dim)
    )
    return {cell[:4]: offset for offset, cell in enumerate(cells) if cell[4] == 0}


def check(pages, page_size, token, layer, head, shape, slot):
    starts = row_starts(shape)
    expected = (starts[(0, layer, slot, head)], starts[(1, layer, slot, head)])
    got = store_offsets(list(pages), page_size, token, layer, head, tuple(shape))
    assert tuple(got) == expected, (
        f"store_offsets({pages}, {page_size}, token={token}, layer={layer}, head={head}, "
        f"shape={shape}) (slot {slot}): expected {expected}, got {got}"
    )


def test_example():
    assert tuple(store_offsets([3, 0], 4, 5, 1, 1, (2, 16, 2, 8))) == (280, 792)


def test_page_size_one_uses_the_page_as_the_slot():
    check([7, 2, 5], 1, 2, 0, 0, (1, 8, 1, 4), slot=5)


def test_every_token_and_head_of_a_paged_request():
    shape = (3, 24, 2, 4)
    pages = [5, 1, 3]
    for token in range(12):
        for layer in range(3):
            for head in range(2):
                slot = pages[token // 4] * 4 + token % 4
                check(pages, 4, token, layer, head, shape, slot)


@pytest.mark.parametrize(
    "token, layer, head",
    [(8, 0, 0), (0, 2, 0), (0, 0, 2), (-5, 0, 0)],
    ids=["past the pages", "layer", "head", "negative token"],
)
def test_out_of_range_raises(token, layer, head):
    with pytest.raises(IndexError):
        store_offsets([1, 0], 4, token, layer, head, (2, 8, 2, 4))


def test_a_page_past_the_pool_raises():
    with pytest.raises(IndexError):
        store_offsets([9], 4, 0, 0, 0, (1, 8, 1, 4))
