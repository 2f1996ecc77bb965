"""Qwen3-MoE (e.g. Qwen3-30B-A3B): Qwen3's decoder with a mixture of experts for MLPs.

The attention, norms and residual stream are Qwen3's, so the model is the Llama decoder of
`models/llama.py`, built with an MLP factory (`create_moe_mlp`) that puts a `SparseMoeBlock` in
the layers that `MoeConfig` names.
What is left here is the checkpoint: it stores every expert's projections apart
(`mlp.experts.{e}.gate_proj.weight`, `up_proj`, `down_proj`), which we stack per layer.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from minisgl.layers.moe import SparseMoeBlock
from minisgl.models.config import ModelConfig
from minisgl.models.llama import LlamaForCausalLM, create_mlp


def create_moe_mlp(config: ModelConfig, layer_id: int) -> nn.Module:
    """The experts for a sparse layer, the dense gated MLP for the others."""
    moe = config.moe
    if moe is None or layer_id not in moe.sparse_layers:
        return create_mlp(config, layer_id)
    return SparseMoeBlock(
        config.hidden_size, moe.num_experts, moe.top_k, moe.intermediate_size, moe.renormalize
    )


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        if config.moe is None:
            raise ValueError("a Qwen3-MoE config needs its expert settings (ModelConfig.moe)")
        # Qwen3's attention normalizes q and k per head, in the MoE models too.
        super().__init__(dataclasses.replace(config, qk_norm=True), create_moe_mlp)
        # Expert e's gate and up are shards 2e and 2e + 1 of the stacked gate_up_proj, its
        # down is shard e of down_proj. These names come first: the generic ".gate_proj."
        # entry would also match an expert's tensor.
        experts: dict[str, tuple[str, int | None]] = {}
        for e in range(config.moe.num_experts):
            experts[f".experts.{e}.gate_proj."] = (".experts.gate_up_proj.", 2 * e)
            experts[f".experts.{e}.up_proj."] = (".experts.gate_up_proj.", 2 * e + 1)
            experts[f".experts.{e}.down_proj."] = (".experts.down_proj.", e)
        self.WEIGHT_NAME_MAP = experts | LlamaForCausalLM.WEIGHT_NAME_MAP
