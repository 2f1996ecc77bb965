"""Triton kernels for work that torch does in many tiny launches (chapter 19).

On CUDA the engine calls them in place of the torch code of chapter 4 (the KV store, the step's
input gather, the sampled tokens' write-back); on the CPU it keeps that torch code, which is
also what the tests compare the kernels against.

MINISGL_KERNELS=torch   keep the torch code on CUDA too (an ablation: how much do they save?);
                        read through minisgl.env, like every switch

Under TRITON_INTERPRET=1 (set before triton is imported) the kernels also run on CPU tensors,
one program at a time in numpy: slow, but exact, which is how the course tests them without
a GPU.
"""

from __future__ import annotations

from minisgl.env import ENV

from .kv_store import store_kv
from .step_inputs import prepare_inputs, write_next_tokens


def kernels_enabled() -> bool:
    """False when MINISGL_KERNELS=torch asks for the torch code even on CUDA."""
    return not ENV.TORCH_KERNELS


__all__ = ["kernels_enabled", "prepare_inputs", "store_kv", "write_next_tokens"]
