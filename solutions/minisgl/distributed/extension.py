"""Tensor parallelism as an engine extension: an engine built in one of several rank processes
joins their tensor parallelism before it builds its model, so that the model holds the rank's
slice and the engine caches only the rank's KV heads.

Rank 0 of an offline `LLM` joins before it builds its engine (`init_tp_group`); the server's
scheduler ranks and the `LLM`'s other ranks join here, in the engine of chapter 14's
`run_scheduler`, whose process is already in the ranks' gloo group.
"""

from __future__ import annotations

import torch.distributed as dist

from minisgl.engine import Engine, EngineExtension

from .group import join_tensor_parallel
from .info import get_tp_info


def join_before_building(engine: Engine) -> None:
    """Join the tensor parallelism of this process's group, if the engine is one of several
    ranks and the process has not joined yet."""
    if engine.config.tp_size == 1 or get_tp_info().size > 1:
        return  # one rank; or joined already
    if not dist.is_initialized() or dist.get_world_size() != engine.config.tp_size:
        return  # not started as a rank: the engine's own check says what to do
    join_tensor_parallel(engine.device)


TENSOR_PARALLEL = EngineExtension(configure=join_before_building)
