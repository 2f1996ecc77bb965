"""Attention backends: the metadata each needs per batch and the attention it computes."""

from .base import (
    ATTENTION_BACKENDS,
    AttnSetup,
    BackendEntry,
    BaseAttnBackend,
    BaseAttnMetadata,
    register_backend,
    resolve_backend,
)
from .torch_backend import TorchAttnBackend
from .fi import FlashInferBackend  # registers itself in ATTENTION_BACKENDS
from .triton import TritonAttnBackend  # registers itself in ATTENTION_BACKENDS
