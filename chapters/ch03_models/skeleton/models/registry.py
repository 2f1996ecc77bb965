"""Which model class implements which architecture name of config.json."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from minisgl import features
from minisgl.models.config import ModelConfig
from minisgl.utils import UnsupportedModelError

# Architecture name -> model class: the rows of features.MODELS.
MODEL_REGISTRY: Mapping[str, type[nn.Module]] = features.Registry(features.MODELS)


def create_model(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Build the model with uninitialised weights directly on `device` in `dtype`."""
    raise NotImplementedError("ch03: Build the model with uninitialised weights directly on `device` in `dtype`.")
