"""The decoder's small layers as one Triton kernel each: RMSNorm, add-and-RMSNorm, q/k norm with
RoPE, and SiLU-and-mul.

Chapter 2's layers are written as torch expressions, and torch runs every operator of an
expression as its own kernel: an RMSNorm is seven (cast, square, mean, add, rsqrt, multiply,
cast back and scale), a rotation by RoPE about ten per tensor. On a GPU a decode step of a small
model is then some fifty short kernels per layer, each reading and writing the whole activation,
and the step costs what launching them costs. Each kernel here reads its inputs once and writes
its output once, with the arithmetic of chapter 2's layer in between, in float32 like theirs.

`fuse_layers(model)` turns the model's norms, attention layers and MLPs into their fused
versions in place. The fused classes add no state, only a faster forward, so a module becomes
one by changing its class: its parameters and buffers stay where they are. The engine does this
on CUDA for 16-bit models (the extension in `minisgl.kernels`); float32 keeps chapter 2's exact
torch arithmetic, which the parity tests with transformers compare. The same extension also
lays out the output projections' weights for cuBLAS (`store_column_major`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import nn

from minisgl.core import get_global_ctx
from minisgl.layers import AttentionLayer, Linear, RMSNorm
from minisgl.models.llama import LlamaMLP


@triton.jit
def rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    x_row_stride,
    residual_row_stride,
    size,
    eps,
    ADD_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One row: out = weight * normalize(x [+ residual]); with ADD_RESIDUAL, also write the sum.

    The arithmetic is float32, rounded to x's dtype where chapter 2's torch code rounds: the
    sum (it is the new residual stream), the normalized row, and the scaled result.
    """
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < size
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    if ADD_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_row_stride + cols, mask=inside, other=0.0)
        x = (x + residual.to(tl.float32)).to(dtype).to(tl.float32)  # rounded like torch's add
        tl.store(residual_out_ptr + row * size + cols, x, mask=inside)
    scale = tl.rsqrt(tl.sum(x * x, axis=0) / size + eps)
    weight = tl.load(weight_ptr + cols, mask=inside).to(tl.float32)
    normed = (x * scale).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * size + cols, weight * normed, mask=inside)


def rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight * normalize(x + residual), x + residual) over the last dimension, one launch.

    Without a residual the second element is None. Rows may be strided (x may be a view);
    the outputs are new contiguous tensors.
    """
    size = x.shape[-1]
    rows = x.reshape(-1, size)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else None
    res_rows = residual.reshape(-1, size) if residual is not None else rows
    rmsnorm_kernel[(rows.shape[0],)](
        rows,
        res_rows,
        weight,
        out,
        summed if summed is not None else out,
        rows.stride(0),
        res_rows.stride(0),
        size,
        eps,
        ADD_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(size),
    )
    shape = x.shape
    return out.view(shape), summed.view(shape) if summed is not None else None


@triton.jit
def _norm_rope_heads(
    src_ptr,
    dst_ptr,
    weight_ptr,
    cos,
    sin,
    num_heads,
    eps,
    head_dim,
    HAS_NORM: tl.constexpr,
    HEADS_BLOCK: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
):
    """Normalize (optional) and rotate the `num_heads` heads of one token, side by side at
    src_ptr, as one [heads, head_dim / 2] tile per half: dimensions i and i + head_dim/2 pair
    up. cos and sin are the token's [1, HALF_BLOCK] rows of the tables."""
    half = head_dim // 2
    heads = tl.arange(0, HEADS_BLOCK)[:, None]
    cols = tl.arange(0, HALF_BLOCK)[None, :]
    inside = (heads < num_heads) & (cols < half)
    offsets = heads * head_dim + cols
    x1 = tl.load(src_ptr + offsets, mask=inside, other=0.0)
    dtype = x1.dtype
    a = x1.to(tl.float32)
    b = tl.load(src_ptr + half + offsets, mask=inside, other=0.0).to(tl.float32)
    if HAS_NORM:  # Qwen3's per-head RMSNorm, before the rotation, rounded as torch rounds it
        sum_sq = tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)
        scale = tl.rsqrt(sum_sq / head_dim + eps)[:, None]
        w1 = tl.load(weight_ptr + cols, mask=cols < half).to(tl.float32)
        w2 = tl.load(weight_ptr + half + cols, mask=cols < half).to(tl.float32)
        a = (w1 * (a * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        b = (w2 * (b * scale).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    tl.store(dst_ptr + offsets, a * cos - b * sin, mask=inside)
    tl.store(dst_ptr + half + offsets, b * cos + a * sin, mask=inside)


@triton.jit
def norm_rope_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    q_weight_ptr,
    k_weight_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_token_stride,
    k_token_stride,
    cache_stride,
    num_q_heads,
    num_k_heads,
    head_dim,
    eps,
    HAS_NORM: tl.constexpr,
    HEADS_BLOCK: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
):
    """Program (token, part) of a [tokens, 2] grid: every q head of the token (part 0) or
    every k head (part 1), with the token's cos and sin rows loaded once for all of them.

    A program per head moves 256 bytes: a 16,384-token prefill of Qwen3-0.6B was then 393,216
    programs, and took six times as long on an H200 as this grid (chapter 19's page has the
    figures).
    """
    token = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cols = tl.arange(0, HALF_BLOCK)[None, :]
    inside = cols < head_dim // 2
    cos = tl.load(cos_ptr + position * cache_stride + cols, mask=inside)
    sin = tl.load(sin_ptr + position * cache_stride + cols, mask=inside)
    if part == 0:
        src = q_ptr + token * q_token_stride
        dst = q_out_ptr + token * num_q_heads * head_dim
        weight_ptr, num_heads = q_weight_ptr, num_q_heads
    else:
        src = k_ptr + token * k_token_stride
        dst = k_out_ptr + token * num_k_heads * head_dim
        weight_ptr, num_heads = k_weight_ptr, num_k_heads
    _norm_rope_heads(
        src, dst, weight_ptr, cos, sin, num_heads, eps, head_dim, HAS_NORM, HEADS_BLOCK, HALF_BLOCK
    )


def norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim], normalized per head when
    weights are given, then rotated by their token's position; new contiguous tensors.

    q and k may be views into one qkv row (their heads contiguous, tokens strided). cos_cache
    and sin_cache are RotaryEmbedding's float32 tables [max_position, head_dim], whose two
    halves are equal.
    """
    tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    if q.stride(2) != 1 or q.stride(1) != head_dim or k.stride(2) != 1 or k.stride(1) != head_dim:
        raise ValueError("norm_rope needs each token's heads side by side (a view of qkv is fine)")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    has_norm = q_weight is not None and k_weight is not None
    norm_rope_kernel[(tokens, 2)](
        q,
        k,
        q_out,
        k_out,
        q_weight if has_norm else q,
        k_weight if has_norm else k,
        positions,
        cos_cache,
        sin_cache,
        q.stride(0),
        k.stride(0),
        cos_cache.stride(0),
        num_q_heads,
        num_k_heads,
        head_dim,
        eps,
        HAS_NORM=has_norm,
        HEADS_BLOCK=triton.next_power_of_2(max(num_q_heads, num_k_heads)),
        HALF_BLOCK=triton.next_power_of_2(head_dim // 2),
    )
    return q_out, k_out


@triton.jit
def silu_and_mul_kernel(gate_up_ptr, out_ptr, row_stride, size, BLOCK: tl.constexpr):
    """Program (row, block): SiLU(gate) * up for BLOCK columns of one row, in float32, rounding
    SiLU's result to the input dtype first, as torch's two operators do."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < size
    gate = tl.load(gate_up_ptr + row * row_stride + cols, mask=inside, other=0.0)
    up = tl.load(gate_up_ptr + row * row_stride + size + cols, mask=inside, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * size + cols, silu * up.to(tl.float32), mask=inside)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up where gate_up's last dimension is [gate | up]; one launch."""
    size = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * size)
    out = torch.empty(rows.shape[0], size, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(size))
    silu_and_mul_kernel[(rows.shape[0], triton.cdiv(size, block))](
        rows, out, rows.stride(0), size, BLOCK=block
    )
    return out.view(*gate_up.shape[:-1], size)


class FusedRMSNorm(RMSNorm):
    """Chapter 2's RMSNorm, one kernel per call (with the residual addition fused in)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm(x, self.weight, self.eps)[0]

    def forward_residual(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, summed = rmsnorm(x, self.weight, self.eps, residual)
        assert summed is not None
        return normed, summed


class FusedAttentionLayer(AttentionLayer):
    """Chapter 2's attention layer with q/k norm and RoPE in one kernel."""

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        ctx = get_global_ctx()
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        has_norm = self.q_norm is not None and self.k_norm is not None
        norms = (self.q_norm, self.k_norm) if has_norm else None
        q, k = norm_rope(
            q,
            k,
            ctx.batch.positions,
            self.rotary.cos_cache,
            self.rotary.sin_cache,
            norms[0].weight if norms else None,
            norms[1].weight if norms else None,
            norms[0].eps if norms else 0.0,
        )
        out = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
        return out.reshape(-1, q_size)


class FusedMLP(LlamaMLP):
    """Chapter 3's gated MLP with SiLU-and-mul in one kernel."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(hidden)))


FUSED_CLASSES: dict[type[nn.Module], type[nn.Module]] = {
    RMSNorm: FusedRMSNorm,
    AttentionLayer: FusedAttentionLayer,
    LlamaMLP: FusedMLP,
}


# The projections that end a block: attention's output projection and the MLP's down
# projection, each a wide input summed down to the hidden size.
OUTPUT_PROJECTIONS = ("o_proj", "down_proj")


def store_column_major(model: nn.Module, names: Sequence[str] = OUTPUT_PROJECTIONS) -> int:
    """Store the weight of every Linear of `model` called one of `names` column-major; returns
    how many changed (by default the output projections, o_proj and down_proj).

    The weight stays the same [out, in] matrix with the same values: only its layout changes,
    so that W^T is the contiguous one, and F.linear hands cuBLAS x @ W^T as a product with a
    contiguous right-hand side. On an H200 that is what a batch-1 decode step needs: Qwen3-0.6B's
    o_proj took 12.6 us a call at one row stored row-major and 5.7 us column-major, and
    within 2% either way at 16 to 256 rows (benchmark/gpu_report.md, 2026-12-02, day).
    """
    changed = 0
    for module in model.modules():
        for name in names:
            projection = getattr(module, name, None)
            if isinstance(projection, Linear):
                projection.weight.data = projection.weight.data.t().contiguous().t()
                changed += 1
    return changed


def fuse_layers(model: nn.Module) -> int:
    """Give every norm, attention layer and MLP of `model` its fused forward; returns how
    many modules changed. Only exact instances change (a subclass may compute otherwise)."""
    changed = 0
    for module in model.modules():
        fused = FUSED_CLASSES.get(type(module))
        if fused is not None:
            module.__class__ = fused
            changed += 1
    return changed
