"""Problem 31: map a checkpoint tensor name onto our (merged) parameter name and shard."""

from __future__ import annotations


def map_weight_name(
    name: str, name_map: dict[str, tuple[str, int | None]]
) -> tuple[str, int | None]:
    """Checkpoint tensor name -> (our parameter name, shard of a merged matrix or None)."""
    for fragment, (ours, shard) in name_map.items():
        if fragment in name:
            return name.replace(fragment, ours), shard
    return name, None
