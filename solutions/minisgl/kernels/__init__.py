"""Triton kernels for work that torch does in many tiny launches (chapter 19).

On CUDA the engine uses them in place of the torch code of chapters 2-4 and 17: the KV store,
the step's input gather and the sampled tokens' write-back (`KernelKVCache`,
`KernelTableManager`), FlashInfer's page gather (`gather_page_indices`), and for 16-bit models
the decoder's norms, RoPE and SiLU-and-mul (`fuse_layers`), with the output projections' weights
stored column-major (`store_column_major`, no kernel: a layout). The choice is
made once, per engine, by the extension this package registers; on the CPU the engine keeps the
torch code, which is also what the tests compare the kernels against.

MINISGL_KERNELS=torch   keep the torch code on CUDA too (an ablation: how much do they save?)
MINISGL_KERNELS=triton  use the kernels on a CPU too (under TRITON_INTERPRET=1: the tests)

Under TRITON_INTERPRET=1 (set before triton is imported) the kernels also run on CPU tensors,
one program at a time in numpy: slow, but exact, which is how the course tests them without
a GPU. This module imports no triton itself, so importing the engine never does.
"""

from __future__ import annotations

import torch

from minisgl.engine import Engine, EngineExtension, register_engine_extension
from minisgl.env import ENV
from minisgl.utils import ConfigError


def uses_kernels(engine: Engine) -> bool:
    """The kernel path applies to this engine: on CUDA unless MINISGL_KERNELS=torch, anywhere
    with MINISGL_KERNELS=triton (read through minisgl.env, like every switch)."""
    choice = ENV.KERNELS
    return choice == "triton" or (choice != "torch" and engine.device.type == "cuda")


def use_kernel_parts(engine: Engine) -> None:
    """Build the KV pool and the table manager with their kernel versions (ConfigError for
    MINISGL_KERNELS=triton on a CPU without Triton's interpreter, where they cannot run)."""
    if uses_kernels(engine) and engine.device.type == "cpu" and not ENV.TRITON_INTERPRET:
        raise ConfigError(
            "MINISGL_KERNELS=triton on a CPU runs the kernels only in Triton's interpreter: "
            "set TRITON_INTERPRET=1 before starting (slow; what the tests use), or unset it"
        )
    if uses_kernels(engine):
        from minisgl.kernels.kv_store import KernelKVCache
        from minisgl.kernels.step_inputs import KernelTableManager

        engine.kv_pool_type = KernelKVCache
        engine.table_manager_type = KernelTableManager


def use_kernel_layers(engine: Engine) -> None:
    """Fuse the model's small layers and store its output projections column-major, for 16-bit
    models (float32 keeps chapter 2's arithmetic), and let a FlashInfer backend gather its page
    lists with the kernel."""
    if not uses_kernels(engine):
        return
    if engine.dtype in (torch.float16, torch.bfloat16):
        from minisgl.kernels.fused_layers import fuse_layers, store_column_major

        fuse_layers(engine.model)
        store_column_major(engine.model)
    if hasattr(engine.attn_backend, "gather_pages"):
        from minisgl.kernels.step_inputs import gather_page_indices

        engine.attn_backend.gather_pages = gather_page_indices


register_engine_extension(
    EngineExtension(
        "triton kernels", order=10, configure=use_kernel_parts, finish=use_kernel_layers
    )
)
