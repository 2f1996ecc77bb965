"""Problem 31: map a checkpoint tensor name onto our (merged) parameter name and shard."""

from __future__ import annotations


def map_weight_name(
    name: str, name_map: dict[str, tuple[str, int | None]]
) -> tuple[str, int | None]:
    """Checkpoint tensor name -> (our parameter name, shard of a merged matrix or None)."""
    # reference body: models/weight.py:map_weight_name
