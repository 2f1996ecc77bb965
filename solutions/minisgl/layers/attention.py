"""The attention layer: q/k norm (Qwen3), RoPE, then the paged attention backend."""

from __future__ import annotations

import torch
from torch import nn

from minisgl.core import get_global_ctx
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding


class AttentionLayer(nn.Module):
    """Turn the merged qkv projection of a batch's tokens into attention outputs.

    The layer itself holds no KV cache: it hands q, k, v to the context's attention backend,
    which stores k and v into the KV pool at the batch's `out_loc` and attends over each
    request's whole cached sequence.
    """

    def __init__(
        self,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding,
        qk_norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rotary = rotary
        # Qwen3 normalizes each head of q and k before RoPE; one weight vector per head_dim.
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv: [tokens, (heads + 2 * kv_heads) * head_dim] -> [tokens, heads * head_dim]."""
        ctx = get_global_ctx()
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(ctx.batch.positions, q, k)
        out = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
        return out.reshape(-1, q_size)
