"""The KV store as one Triton kernel: a batch's k and v go into their pool slots in one launch.

torch needs two `index_copy_` (one for K, one for V), each with its own index conversion: four
launches per layer, and on a decode step each of them moves a few kilobytes. Here one program
copies one (token, KV head) row of k and of v, so the grid is [tokens, kv_heads] and the whole
store is a single launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kvcache import MHAKVCache


@triton.jit
def store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_loc_ptr,
    k_token_stride,
    k_head_stride,
    v_token_stride,
    v_head_stride,
    cache_slot_stride,
    cache_head_stride,
    head_dim,
    BLOCK_DIM: tl.constexpr,
):
    """Copy row (token, head) of k and of v to row (out_loc[token], head) of the pools.

    Program (token, head) of a [tokens, kv_heads] grid. Load the token's slot from out_loc (as
    int64: slot * stride can pass 2**31 in a large pool), take BLOCK_DIM offsets along the head
    (BLOCK_DIM is head_dim rounded up to a power of two, so mask the offsets >= head_dim), and
    load from k/v with their own token and head strides (k and v may be views of one qkv
    tensor); store into both pools, which share one layout.
    """
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(out_loc_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_DIM)
    inside = dims < head_dim
    dest = slot * cache_slot_stride + head * cache_head_stride + dims
    k_row = tl.load(k_ptr + token * k_token_stride + head * k_head_stride + dims, mask=inside)
    v_row = tl.load(v_ptr + token * v_token_stride + head * v_head_stride + dims, mask=inside)
    tl.store(k_cache_ptr + dest, k_row, mask=inside)
    tl.store(v_cache_ptr + dest, v_row, mask=inside)


def store_cache(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out_loc: torch.Tensor,
) -> None:
    """Launch store_kv_kernel: k, v [tokens, kv_heads, head_dim] into slots out_loc of the pools.

    One program per (token, KV head): grid (tokens, kv_heads). Pass each tensor's strides in
    elements (`tensor.stride(d)`), the pools' slot and head strides once (K and V pools share
    them), and BLOCK_DIM = triton.next_power_of_2(head_dim). The last dimension of every tensor
    must be contiguous (stride 1).
    """
    tokens, kv_heads, head_dim = k.shape
    if k_cache.stride() != v_cache.stride() or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("store_cache needs K and V pools of one layout and contiguous head rows")
    store_kv_kernel[(tokens, kv_heads)](
        k,
        v,
        k_cache,
        v_cache,
        out_loc,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        head_dim,
        BLOCK_DIM=triton.next_power_of_2(head_dim),
    )


class KernelKVCache(MHAKVCache):
    """Chapter 4's KV pool, storing with store_kv_kernel: one launch per layer."""

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        store_cache(self.k_cache(layer_id), self.v_cache(layer_id), k, v, out_loc)
