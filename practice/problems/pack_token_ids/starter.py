import struct


def pack_ids(ids: list[int]) -> bytes:
    """Each id as a 4-byte little-endian signed int, in order; ValueError outside int32."""
    raise NotImplementedError("pack the ids as little-endian int32")


def unpack_ids(data: bytes) -> list[int]:
    """The ids packed by pack_ids; ValueError if len(data) is not a multiple of 4."""
    raise NotImplementedError("unpack little-endian int32 ids")
