"""The experts of a MoE layer as two grouped GEMMs in Triton, one launch each for all experts.

The torch path (`minisgl.layers.moe.moe_forward_torch`) runs one small matmul per expert: a
hundred launches per layer, most on a handful of tokens. Here the (token, slot) pairs are
sorted by expert and each expert's run is padded to whole blocks of BLOCK_M rows, so every
block of rows belongs to one expert; one program multiplies one block by a tile of its
expert's weights, and one launch covers every expert:

    launch 1: intermediate[pair] = SiLU(x[token] @ gate[e]^T) * (x[token] @ up[e]^T)
    launch 2: pair_out[pair]     = weight[pair] * (intermediate[pair] @ down[e]^T)
    then      out[token]         = sum of its top_k pair outputs

Nothing here waits for the GPU (no `.item()`, no data-dependent shapes): the padded layout is
sized for the worst case, and unused blocks exit at once, so CUDA graphs can capture it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.layers.moe import sort_by_expert

BLOCK_N = 64
BLOCK_K = 32


def align_to_blocks(
    expert_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted pair ids with each expert's run padded to whole blocks of `block_m` rows.

    Returns (pair_ids, block_expert). `pair_ids` [max_blocks * block_m] lists the pairs
    (flat indices into expert_ids) of expert 0, then padding up to a multiple of block_m, then
    expert 1's, and so on; padding and the unused tail hold `num_pairs` (no pair).
    `block_expert` [max_blocks] is the expert of each block, -1 after the last used block.
    max_blocks = ceil(num_pairs / block_m) + min(num_experts, num_pairs) bounds any routing,
    so the shapes depend only on the batch size.
    """
    num_pairs = expert_ids.numel()
    order, tokens_per_expert = sort_by_expert(expert_ids, num_experts)
    blocks_per_expert = (tokens_per_expert + block_m - 1) // block_m
    blocks_end = torch.cumsum(blocks_per_expert, 0)
    first_block = blocks_end - blocks_per_expert
    first_pair = torch.cumsum(tokens_per_expert, 0) - tokens_per_expert
    sorted_experts = expert_ids.flatten()[order]
    index_in_expert = torch.arange(num_pairs, device=order.device) - first_pair[sorted_experts]
    destination = first_block[sorted_experts] * block_m + index_in_expert
    max_blocks = triton.cdiv(num_pairs, block_m) + min(num_experts, num_pairs)
    pair_ids = order.new_full((max_blocks * block_m,), num_pairs)
    pair_ids[destination] = order
    blocks = torch.arange(max_blocks, device=order.device)
    block_expert = torch.searchsorted(blocks_end, blocks, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return pair_ids, block_expert


@triton.jit
def grouped_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    pair_ids_ptr,
    block_expert_ptr,
    weights_ptr,
    num_pairs,
    N,
    stride_a,
    stride_b_expert,
    stride_b_row,
    stride_c,
    K: tl.constexpr,  # a compile-time loop bound (Triton's interpreter needs one with NumPy 2.4)
    PAIRS_PER_A_ROW: tl.constexpr,
    GATED: tl.constexpr,
    WEIGHTED: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """C[pair, cols] = f(A[pair // PAIRS_PER_A_ROW] @ B[expert, cols]^T) for one block of pairs.

    Program (m, n) takes the m-th block of BLOCK_M sorted pairs (all of expert
    block_expert[m]; a block with expert -1 does nothing) and output columns
    [n * BLOCK_N, (n + 1) * BLOCK_N) of N. A's row of a pair is `pair // PAIRS_PER_A_ROW`
    (top_k when A is the tokens' hidden states, 1 when A is already per pair). B is
    [experts, rows, K]. GATED: B holds gate's N rows then up's, and the result is
    SiLU(A gate^T) * (A up^T). WEIGHTED: each row is multiplied by weights[pair]. Accumulate
    in float32 over K in steps of BLOCK_K with masked loads; padding pairs (== num_pairs) and
    columns past N are never loaded or stored.
    """
    expert = tl.load(block_expert_ptr + tl.program_id(0))
    if expert < 0:
        return
    pairs = tl.load(pair_ids_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
    real = pairs < num_pairs
    a_rows = pairs // PAIRS_PER_A_ROW
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    b_expert = b_ptr + expert.to(tl.int64) * stride_b_expert
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(
            a_ptr + a_rows[:, None] * stride_a + ks[None, :],
            mask=real[:, None] & k_ok[None, :],
            other=0.0,
        )
        b_mask = k_ok[:, None] & col_ok[None, :]
        b = tl.load(b_expert + cols[None, :] * stride_b_row + ks[:, None], mask=b_mask, other=0.0)
        acc += tl.dot(a, b, input_precision=PRECISION)
        if GATED:
            up_rows = b_expert + (cols[None, :] + N) * stride_b_row + ks[:, None]
            b_up = tl.load(up_rows, mask=b_mask, other=0.0)
            acc_up += tl.dot(a, b_up, input_precision=PRECISION)
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(weights_ptr + pairs, mask=real, other=0.0)[:, None]
    tl.store(
        c_ptr + pairs[:, None] * stride_c + cols[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=real[:, None] & col_ok[None, :],
    )


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    pair_ids: torch.Tensor,
    block_expert: torch.Tensor,
    weights: torch.Tensor,
    pairs_per_a_row: int,
    gated: bool,
    block_m: int,
) -> torch.Tensor:
    """Launch `grouped_gemm_kernel` over every block and column tile: [pairs, N] in a's dtype."""
    num_pairs = weights.numel()
    n = b.shape[1] // 2 if gated else b.shape[1]
    out = a.new_empty(num_pairs, n)
    grid = (block_expert.numel(), triton.cdiv(n, BLOCK_N))
    grouped_gemm_kernel[grid](
        a,
        b,
        out,
        pair_ids,
        block_expert,
        weights,
        num_pairs,
        n,
        a.stride(0),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        K=b.shape[2],
        PAIRS_PER_A_ROW=pairs_per_a_row,
        GATED=gated,
        WEIGHTED=not gated,
        # float32 stays float32 (no TF32), so a float32 run matches the torch path closely.
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    return out


def fused_moe(
    hidden: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
) -> torch.Tensor:
    """The experts' output [tokens, hidden], as `moe_forward_torch` computes it, in 2 launches.

    hidden [tokens, hidden]; gate_up [experts, 2 * intermediate, hidden]; down [experts,
    hidden, intermediate]; weights (float32) and expert_ids [tokens, top_k] from `route`.
    """
    num_experts, top_k = gate_up.shape[0], expert_ids.shape[1]
    # Small batches give each expert a few pairs: small blocks waste less padding.
    block_m = 16 if expert_ids.numel() <= 4 * num_experts else 64
    pair_ids, block_expert = align_to_blocks(expert_ids, num_experts, block_m)
    weights = weights.contiguous()
    intermediate = grouped_gemm(
        hidden.contiguous(),
        gate_up.contiguous(),
        pair_ids,
        block_expert,
        weights,
        top_k,
        True,
        block_m,
    )
    pair_out = grouped_gemm(
        intermediate, down.contiguous(), pair_ids, block_expert, weights, 1, False, block_m
    )
    return pair_out.view(hidden.shape[0], top_k, -1).sum(dim=1)
