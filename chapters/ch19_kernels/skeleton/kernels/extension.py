"""The kernel path of chapter 19, chosen once per engine: an engine extension (a row of
features.ENGINE_EXTENSIONS) builds the KV pool from `KernelKVCache` and fuses the model's small
layers, a row of features.TABLE_MANAGERS gives the scheduler `KernelTableManager`, and a row of
features.PAGE_GATHERS gives the FlashInfer backend its page gather kernel.

This module imports no triton itself, so loading the extension never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from minisgl.engine import Engine, EngineExtension
from minisgl.env import ENV
from minisgl.utils import ConfigError

if TYPE_CHECKING:
    from minisgl.scheduler.table import TableManager


def uses_kernels(device: torch.device) -> bool:
    """The kernel path applies on this device: on CUDA unless MINISGL_KERNELS=torch, anywhere
    with MINISGL_KERNELS=triton (read through minisgl.env, like every switch)."""
    choice = ENV.KERNELS
    return choice == "triton" or (choice != "torch" and device.type == "cuda")


def use_kernel_parts(engine: Engine) -> None:
    """Build the KV pool with its kernel version (ConfigError for MINISGL_KERNELS=triton on a
    CPU without Triton's interpreter, where the kernels cannot run)."""
    if uses_kernels(engine.device) and engine.device.type == "cpu" and not ENV.TRITON_INTERPRET:
        raise ConfigError(
            "MINISGL_KERNELS=triton on a CPU runs the kernels only in Triton's interpreter: "
            "set TRITON_INTERPRET=1 before starting (slow; what the tests use), or unset it"
        )
    if uses_kernels(engine.device):
        from minisgl.kernels.kv_store import KernelKVCache

        engine.kv_pool_type = KernelKVCache


def kernel_table_manager(engine: Engine) -> type[TableManager] | None:
    """The scheduler's table manager with the step's index work in kernels, where the engine
    takes the kernel path (None elsewhere: the scheduler keeps chapter 7's)."""
    if not uses_kernels(engine.device):
        return None
    from minisgl.kernels.step_inputs import KernelTableManager

    return KernelTableManager


def kernel_page_gather(device: torch.device) -> Callable[..., torch.Tensor] | None:
    """The FlashInfer backend's page gather in one kernel launch, where the kernel path
    applies on `device` (None elsewhere: the backend keeps chapter 17's)."""
    if not uses_kernels(device):
        return None
    from minisgl.kernels.step_inputs import gather_page_indices

    return gather_page_indices


def use_kernel_layers(engine: Engine) -> None:
    """Fuse the model's small layers and store its output projections column-major, for 16-bit
    models (float32 keeps chapter 2's arithmetic)."""
    if not uses_kernels(engine.device):
        return
    if engine.dtype in (torch.float16, torch.bfloat16):
        from minisgl.kernels.fused_layers import fuse_layers, store_column_major

        fuse_layers(engine.model)
        store_column_major(engine.model)


TRITON_KERNELS = EngineExtension(configure=use_kernel_parts, finish=use_kernel_layers)
