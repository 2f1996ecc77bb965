import struct


def pack_ids(ids: list[int]) -> bytes:
    """Each id as a 4-byte little-endian signed int, in order; ValueError outside int32."""
    try:
        return struct.pack(f"<{len(ids)}i", *ids)
    except struct.error as error:
        raise ValueError(f"a token id is outside int32: {error}") from error


def unpack_ids(data: bytes) -> list[int]:
    """The ids packed by pack_ids; ValueError if len(data) is not a multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"{len(data)} bytes is not a whole number of int32 ids")
    return list(struct.unpack(f"<{len(data) // 4}i", data))
