"""Which model class implements which architecture name of config.json."""

from __future__ import annotations

import torch
from torch import nn

from minisgl.models.config import ModelConfig
from minisgl.models.llama import LlamaForCausalLM
from minisgl.utils import UnsupportedModelError

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}  # models/qwen3_moe.py adds Qwen3MoeForCausalLM (chapter 20)


def create_model(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Build the model with uninitialised weights directly on `device` in `dtype`."""
    raise NotImplementedError("ch03: Build the model with uninitialised weights directly on `device` in `dtype`.")
