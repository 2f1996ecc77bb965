"""Tensor parallelism: which rank this process is, how weights are split, and the collectives.

Every sharded layer asks `get_tp_info()` for its slice (the rules are in `shard.py`); the two
collectives are the only places where ranks exchange activations. Until `set_tp_info` is called
(by `group.init_tp_group`, when a rank process starts) the engine is one rank, and both
collectives return their input. Joining and leaving the ranks' group (`group.py`) is not
re-exported here: it builds on the models and the scheduler, which import this package.
"""

from .comm import all_gather, all_reduce, min_over_ranks
from .info import DistributedInfo, get_tp_info, set_tp_info
from .shard import HeadShard, head_shard, split_range, vocab_block

__all__ = [
    "HeadShard",
    "DistributedInfo",
    "all_gather",
    "all_reduce",
    "get_tp_info",
    "head_shard",
    "min_over_ranks",
    "set_tp_info",
    "split_range",
    "vocab_block",
]
