def store_offsets(
    pages: list[int],
    page_size: int,
    token: int,
    layer: int,
    head: int,
    shape: tuple[int, int, int, int],
) -> tuple[int, int]:
    """Flat offsets of the K row and the V row that (token, head) is stored to in `layer`."""
    layers, slots, kv_heads, head_dim = shape
    page_index = token // page_size
    if not 0 <= page_index < len(pages):
        raise IndexError(f"token {token} is past the request's {len(pages)} pages")
    slot = pages[page_index] * page_size + token % page_size
    if not (0 <= layer < layers and 0 <= slot < slots and 0 <= head < kv_heads):
        raise IndexError(f"layer {layer}, slot {slot} or head {head} is out of range for {shape}")
    k_offset = ((layer * slots + slot) * kv_heads + head) * head_dim
    return k_offset, k_offset + layers * slots * kv_heads * head_dim
