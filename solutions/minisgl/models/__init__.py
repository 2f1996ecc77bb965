"""Model definitions, their configuration, the architecture registry and weight loading."""

from .config import ModelConfig, MoeConfig
from .registry import MODEL_REGISTRY, create_model
from .weight import load_weights
