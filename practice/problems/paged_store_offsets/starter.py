def store_offsets(
    pages: list[int],
    page_size: int,
    token: int,
    layer: int,
    head: int,
    shape: tuple[int, int, int, int],
) -> tuple[int, int]:
    """Flat offsets of the K row and the V row that (token, head) is stored to in `layer`."""
    raise NotImplementedError("find the token's slot, then the flat offsets of its K and V rows")
