"""The Llama-style decoder, which also serves Qwen2 and Qwen3.

    embed -> N x [RMSNorm -> attention -> +residual -> RMSNorm -> gated MLP -> +residual]
          -> RMSNorm -> LM head (last token of each request only)

Qwen2 adds a bias to the q/k/v projections and Qwen3 normalizes q and k per head; both are
switches in ModelConfig. Module names follow the Hugging Face checkpoints, except where two
projections are merged (qkv_proj, gate_up_proj): `WEIGHT_NAME_MAP` says how names map.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from minisgl.core import get_global_ctx
from minisgl.layers import AttentionLayer, RMSNorm, RotaryEmbedding, silu_and_mul
from minisgl.models.config import ModelConfig
from minisgl.models.layout import current_layout


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        # The layout says which heads and weights this process holds: all of them, unless the
        # model is split over several processes (chapter 16).
        layout = current_layout()
        num_heads, num_kv_heads = layout.heads(config)
        self.qkv_proj, self.o_proj = layout.attention_projections(config)
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
        return self.o_proj(self.attn(self.qkv_proj(hidden)))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj, self.down_proj = current_layout().mlp_projections(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """down_proj(SiLU(gate) * up), with gate and up from one merged projection."""
        return self.down_proj(silu_and_mul(self.gate_up_proj(hidden)))


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
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.forward_residual(hidden, residual)
        hidden = self.self_attn(hidden)
        hidden, residual = self.post_attention_layernorm.forward_residual(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, mlp_factory: MlpFactory = create_mlp) -> None:
        super().__init__()
        self.embed_tokens = current_layout().embedding(config)
        rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.max_position_embeddings, config.rope_scaling
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, rotary, mlp_factory) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embed, run every decoder layer passing the residual along, final norm."""
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        assert residual is not None, "a model has at least one layer"
        return self.norm.forward_residual(hidden, residual)[0]


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
        self.lm_head = current_layout().lm_head(config, tied_to)

    def forward(self) -> torch.Tensor:
        """Logits [batch size, vocab] for the last token of each request in the batch."""
        batch = get_global_ctx().batch
        hidden = self.model(batch.input_ids)
        # Only the last token of each request is sampled; skip the LM head for the others.
        return self.lm_head(hidden[batch.attn_metadata.last_indices])
