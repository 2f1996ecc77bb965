"""Load a checkpoint's safetensors files into a model, one tensor at a time.

Streaming matters: reading the whole state dict first would need the model's size again in
memory. `safe_open` maps the file and hands us one tensor at a time, which we copy into place.
A tensor is handed over unread (`get_slice`): a tensor-parallel layer (chapter 16) reads only
its rank's rows or columns of it, everyone else reads it whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from minisgl.utils import ModelNotFoundError

# Buffers some checkpoints carry that we recompute instead of loading.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def map_weight_name(
    name: str, name_map: dict[str, tuple[str, int | None]]
) -> tuple[str, int | None]:
    """Checkpoint tensor name -> (our parameter name, shard of a merged matrix or None)."""
    raise NotImplementedError("ch03: Checkpoint tensor name -> (our parameter name, shard of a merged matrix or None).")


@torch.inference_mode()
def load_weights(model: nn.Module, model_dir: str | Path, progress: bool = True) -> None:
    """Copy every tensor of `model_dir/*.safetensors` into `model`.

    Fail on anything missing, unexpected or misshapen, naming the tensor."""
    raise NotImplementedError("ch03: Copy every tensor of `model_dir/*.safetensors` into `model`.")


def _shards(model: nn.Module, param_name: str) -> list[int | None]:
    module = model.get_submodule(param_name.rpartition(".")[0])
    sizes = getattr(module, "output_sizes", [None])
    return list(range(len(sizes))) if len(sizes) > 1 else [None]


def _copy_into(model: nn.Module, name: str, shard: int | None, checkpoint: Any, key: str) -> None:
    """Copy a checkpoint tensor (a safetensors slice, not read yet, or a tensor) into place."""
    module_name, _, param_name = name.rpartition(".")
    module = model.get_submodule(module_name)
    try:
        if hasattr(module, "load_slice"):  # a tensor-parallel layer reads its part only
            module.load_slice(param_name, shard, checkpoint)
            return
        tensor = checkpoint[:]
        if shard is not None:
            module.load_shard(param_name, shard, tensor)
        else:
            param = getattr(module, param_name)
            if param.shape != tensor.shape:
                raise ValueError(
                    f"shape mismatch: expected {tuple(param.shape)}, "
                    f"checkpoint has {tuple(tensor.shape)}"
                )
            param.data.copy_(tensor)
    except ValueError as error:
        raise ValueError(f"checkpoint tensor {key!r}: {error}") from None
