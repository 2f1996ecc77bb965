"""Attention backends: the metadata each needs per batch and the attention it computes."""

from .base import BaseAttnBackend, BaseAttnMetadata
from .torch_backend import TorchAttnBackend
