"""Which weights this process holds, and the layers that hold them.

Here one process holds the whole model: `ModelLayout` builds chapter 2's layers with every head
and every weight, and the decoder of `models/llama.py` asks it for each layer that holds weights.
A model can also be split over several processes (tensor parallelism, chapter 16): each process
then installs a layout of its own with `use_layout` before it builds the model, whose layers hold
that process's slice, and whose `agree` makes every process use the same number.
"""

from __future__ import annotations

from torch import nn

from minisgl.layers import Linear, LMHead, VocabEmbedding
from minisgl.models.config import ModelConfig


class ModelLayout:
    """The whole model in this process."""

    processes = 1  # how many processes share the model

    def heads(self, config: ModelConfig) -> tuple[int, int]:
        """(query heads, KV heads) this process computes and caches."""
        return config.num_heads, config.num_kv_heads

    def attention_projections(self, config: ModelConfig) -> tuple[nn.Module, nn.Module]:
        """The merged q/k/v projection and the output projection of one attention layer."""
        q_size = config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        qkv_proj = Linear(config.hidden_size, [q_size, kv_size, kv_size], config.qkv_bias)
        return qkv_proj, Linear(q_size, [config.hidden_size], config.o_bias)

    def mlp_projections(self, config: ModelConfig) -> tuple[nn.Module, nn.Module]:
        """The merged gate/up projection and the down projection of one gated MLP."""
        size = config.intermediate_size
        return Linear(config.hidden_size, [size, size]), Linear(size, [config.hidden_size])

    def embedding(self, config: ModelConfig) -> nn.Module:
        return VocabEmbedding(config.vocab_size, config.hidden_size)

    def lm_head(self, config: ModelConfig, tied_to: nn.Module | None) -> nn.Module:
        return LMHead(config.vocab_size, config.hidden_size, tied_to)

    def agree(self, value: int) -> int:
        """The value every process of the model can use (the smallest): here, `value`."""
        return value


_layout = ModelLayout()


def current_layout() -> ModelLayout:
    """The layout the models this process builds follow."""
    return _layout


def use_layout(layout: ModelLayout) -> None:
    """Build this process's models with `layout` from now on."""
    global _layout
    _layout = layout
