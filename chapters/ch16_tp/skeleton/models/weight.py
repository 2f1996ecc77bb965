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
    for fragment, (ours, shard) in name_map.items():
        if fragment in name:
            return name.replace(fragment, ours), shard
    return name, None


@torch.inference_mode()
def load_weights(model: nn.Module, model_dir: str | Path, progress: bool = True) -> None:
    """Copy every tensor of `model_dir/*.safetensors` into `model`.

    Fail on anything missing, unexpected or misshapen, naming the tensor."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors file in {model_dir}")
    name_map: dict[str, tuple[str, int | None]] = getattr(model, "WEIGHT_NAME_MAP", {})
    params = dict(model.named_parameters())
    expected = {(name, shard) for name in params for shard in _shards(model, name)}
    loaded: set[tuple[str, int | None]] = set()
    total = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            total += len(f.keys())
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    with tqdm(desc="Loading weights", total=total, unit="tensor", disable=not progress) as bar:
        for file in files:
            with safe_open(file, framework="pt") as f:
                for key in f.keys():
                    bar.update()
                    # A tied checkpoint may still store a copy of the embedding as lm_head.
                    if key.endswith(IGNORED_SUFFIXES) or (tied and key == "lm_head.weight"):
                        continue
                    name, shard = map_weight_name(key, name_map)
                    if name not in params:
                        raise ValueError(
                            f"checkpoint tensor {key!r} has no place in the model "
                            f"{type(model).__name__}"
                        )
                    _copy_into(model, name, shard, f.get_slice(key), key)
                    loaded.add((name, shard))
    missing = sorted(
        f"{name}[shard {shard}]" if shard is not None else name for name, shard in expected - loaded
    )
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks {len(missing)} tensors, e.g. {missing[:3]}")


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
