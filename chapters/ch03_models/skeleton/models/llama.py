"""The Llama-style decoder, which also serves Qwen2 and Qwen3.

    embed -> N x [RMSNorm -> attention -> +residual -> RMSNorm -> gated MLP -> +residual]
          -> RMSNorm -> LM head (last token of each request only)

Qwen2 adds a bias to the q/k/v projections and Qwen3 normalizes q and k per head; both are
switches in ModelConfig. Module names follow the Hugging Face checkpoints, except where two
projections are merged (qkv_proj, gate_up_proj): `WEIGHT_NAME_MAP` says how names map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist
from torch import nn

from minisgl.core import get_global_ctx
from minisgl.layers import (
    AttentionLayer,
    Linear,
    LMHead,
    RMSNorm,
    RotaryEmbedding,
    VocabEmbedding,
    silu_and_mul,
)
from minisgl.models.config import ModelConfig

if TYPE_CHECKING:
    from minisgl.distributed import TPInfo


def tensor_parallel() -> TPInfo | None:
    """This process's rank when the model is split over several processes, else None.

    Chapter 16 runs one process per rank, all in one torch.distributed group; each builds
    only its slice of the model (the sharded layers of `minisgl.models.parallel`).
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    from minisgl.distributed import get_tp_info

    return get_tp_info()


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        tp = tensor_parallel()
        if tp is None:
            num_heads, num_kv_heads = config.num_heads, config.num_kv_heads
            q_size = num_heads * config.head_dim
            kv_size = num_kv_heads * config.head_dim
            self.qkv_proj = Linear(config.hidden_size, [q_size, kv_size, kv_size], config.qkv_bias)
            self.o_proj = Linear(q_size, [config.hidden_size], config.o_bias)
        else:  # this rank's heads: their rows of q, k and v, their columns of o
            from minisgl.models.parallel import sharded_attention

            heads, self.qkv_proj, self.o_proj = sharded_attention(config, tp)
            num_heads, num_kv_heads = heads.num_heads, heads.num_kv_heads
        self.attn = AttentionLayer(
            layer_id,
            num_heads,
            num_kv_heads,
            config.head_dim,
            rotary,
            config.rms_norm_eps if config.qk_norm else None,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """qkv projection, attention over the KV cache, output projection."""
        raise NotImplementedError("ch03: qkv projection, attention over the KV cache, output projection.")


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        tp = tensor_parallel()
        if tp is None:
            size = config.intermediate_size
            self.gate_up_proj = Linear(config.hidden_size, [size, size])
            self.down_proj = Linear(size, [config.hidden_size])
        else:  # a block of the intermediate dimension: rows of gate and up, columns of down
            from minisgl.models.parallel import sharded_mlp

            self.gate_up_proj, self.down_proj = sharded_mlp(config, tp)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """down_proj(SiLU(gate) * up), with gate and up from one merged projection."""
        raise NotImplementedError("ch03: down_proj(SiLU(gate) * up), with gate and up from one merged projection.")


def create_mlp(config: ModelConfig, layer_id: int) -> nn.Module:
    """The layer's gated MLP: the MLP factory of the dense models (a mixture-of-experts model
    passes its own to LlamaForCausalLM)."""
    return LlamaMLP(config)


MlpFactory = Callable[[ModelConfig, int], nn.Module]  # (config, layer_id) -> the layer's MLP


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        rotary: RotaryEmbedding,
        mlp_factory: MlpFactory = create_mlp,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_id, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp_factory(config, layer_id)

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns this layer's output and the residual stream, not yet added together.

        Keeping them apart lets the next layer's norm do the addition (`forward_residual`).
        """
        raise NotImplementedError("ch03: Returns this layer's output and the residual stream, not yet added together.")


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, mlp_factory: MlpFactory = create_mlp) -> None:
        super().__init__()
        tp = tensor_parallel()
        if tp is None:
            self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        else:  # a block of the vocabulary
            from minisgl.layers.parallel import VocabParallelEmbedding

            self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.max_position_embeddings, config.rope_scaling
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, rotary, mlp_factory) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embed, run every decoder layer passing the residual along, final norm."""
        raise NotImplementedError("ch03: Embed, run every decoder layer passing the residual along, final norm.")


class LlamaForCausalLM(nn.Module):
    """The whole model: reads the running batch from the context, returns next-token logits."""

    # Checkpoint name fragment -> (our name fragment, shard of the merged matrix or None).
    WEIGHT_NAME_MAP: dict[str, tuple[str, int | None]] = {
        ".q_proj.": (".qkv_proj.", 0),
        ".k_proj.": (".qkv_proj.", 1),
        ".v_proj.": (".qkv_proj.", 2),
        ".gate_proj.": (".gate_up_proj.", 0),
        ".up_proj.": (".gate_up_proj.", 1),
        ".q_norm.": (".attn.q_norm.", None),
        ".k_norm.": (".attn.k_norm.", None),
    }

    def __init__(self, config: ModelConfig, mlp_factory: MlpFactory = create_mlp) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, mlp_factory)
        tied_to = self.model.embed_tokens if config.tie_word_embeddings else None
        tp = tensor_parallel()
        if tp is None:
            self.lm_head = LMHead(config.vocab_size, config.hidden_size, tied_to)
        else:  # the logits of the same vocabulary block as the embedding
            from minisgl.layers.parallel import ParallelLMHead

            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp, tied_to)

    def forward(self) -> torch.Tensor:
        """Logits [batch size, vocab] for the last token of each request in the batch."""
        raise NotImplementedError("ch03: Logits [batch size, vocab] for the last token of each request in the batch.")
