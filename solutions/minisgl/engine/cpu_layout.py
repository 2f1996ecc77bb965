"""On a CPU, every projection's weight stored column-major: what chapter 21's profile changed.

The profile of a CPU decode step (`python -m benchmark cpu-step`) puts most of it in `aten::mm`: at
a decode batch x has a few dozen rows, and each product reads a whole weight matrix once. MKL,
which runs those products, is faster at this shape when W^T is the contiguous matrix, the
layout chapter 19 gives two projections on a GPU (`store_column_major`). So on a CPU the engine
stores all four of a layer's projections that way, once, when it is built: the same [out, in]
matrices with the same values, and `F.linear` called as before. What changes is the order of
MKL's sums, by a rounding: logits move in the last bits, and the greedy tokens match
transformers' as before (tests/test_cpu_layout.py).

The LM head keeps its layout: it shares its weight with the embedding, whose lookups read rows.

MINISGL_CPU_LAYOUT=row  keep the weights row-major (the ablation: `--variants row-major` of
                        python -m benchmark offline)
"""

from __future__ import annotations

from minisgl.engine.engine import Engine, EngineExtension
from minisgl.env import ENV

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def store_weights_column_major(engine: Engine) -> None:
    """On a CPU (unless MINISGL_CPU_LAYOUT=row), store every projection column-major."""
    if engine.device.type != "cpu" or ENV.CPU_LAYOUT == "row":
        return
    from minisgl.kernels.fused_layers import store_column_major

    store_column_major(engine.model, PROJECTIONS)


CPU_WEIGHT_LAYOUT = EngineExtension(finish=store_weights_column_major)
