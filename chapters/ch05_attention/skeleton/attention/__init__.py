"""Attention backends: the metadata each needs per batch and the attention it computes."""

from .base import (
    ATTENTION_BACKENDS,
    AttnSetup,
    BackendEntry,
    BaseAttnBackend,
    BaseAttnMetadata,
    resolve_backend,
)
from .torch_backend import TorchAttnBackend
