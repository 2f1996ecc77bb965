"""Tests of problem 43 (token_slots)."""

from submission import token_slots


def check(pages, page_size, num_tokens, expected):
    got = token_slots(list(pages), page_size, num_tokens)
    assert list(got) == expected, (
        f"token_slots({pages}, {page_size}, {num_tokens}):\nexpected {expected}\ngot      {got}"
    )


def test_example_three_pages_of_four():
    check([3, 0, 7], 4, 10, [12, 13, 14, 15, 0, 1, 2, 3, 28, 29])


def test_page_size_one_is_the_pages_themselves():
    check([5, 2, 9, 0], 1, 4, [5, 2, 9, 0])


def test_a_partly_filled_last_page():
    check([1, 2], 16, 17, list(range(16, 32)) + [32])


def test_exactly_full_pages():
    check([2, 1], 3, 6, [6, 7, 8, 3, 4, 5])


def test_no_tokens():
    check([4], 8, 0, [])


def test_too_few_pages_raise():
    for pages, page_size, num_tokens in (([3, 0], 4, 9), ([], 4, 1), ([1], 1, 2)):
        try:
            got = token_slots(pages, page_size, num_tokens)
        except ValueError:
            continue
        except Exception as error:  # noqa: BLE001
            raise AssertionError(
                f"token_slots({pages}, {page_size}, {num_tokens}): expected "
                f"ValueError, got {type(error).__name__}: {error}"
            ) from None
        raise AssertionError(
            f"token_slots({pages}, {page_size}, {num_tokens}): expected ValueError, got {got}"
        )
