"""A projection of a few rows (a decode step of one to four requests) as one Triton kernel.

At batch 1 a decode step multiplies one row by each weight matrix: the work is reading the
weights once, and the arithmetic is negligible. cuBLAS runs these products as general matrix
multiplies, often split along K with a second kernel to sum the parts; on an H100 Qwen3-0.6B's
112 projections of a batch-1 step took 0.61 ms (plus 0.05 ms of split-K sums) where reading
their 0.88 GB takes 0.26 ms (benchmark/gpu_report.md, 2026-12-06, night). This kernel is the
plain matrix-vector product: each program owns BLOCK_N output columns, streams their rows of
the weight along K once, and keeps the products in float32 registers, summed once at the end.

`FewRowsLinear` is chapter 2's Linear with this forward for inputs of at most FEW_ROWS rows;
larger inputs keep cuBLAS. With MINISGL_FEW_ROWS_LINEAR=1 the kernel extension gives it to the
model's projections (`fuse_layers`). It is opt-in until `python -m benchmark projection-kernels`
and the batch-1 workload have measured it against cuBLAS on a GPU; the tests check its products
in Triton's interpreter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from minisgl.layers import Linear

FEW_ROWS = 4  # inputs of up to this many rows take the kernel; more go to cuBLAS
# Per rows-block: (BLOCK_N, BLOCK_K, num_warps). ROWS * BLOCK_N * BLOCK_K float32 products stay
# in registers, 32 per thread at four warps; benchmark/projection_kernels.py measures others.
CONFIGS: dict[int, tuple[int, int, int]] = {1: (16, 256, 4), 2: (16, 128, 4), 4: (16, 64, 4)}


def rows_block(rows: int) -> int:
    """The kernel's ROWS for an input of `rows` rows: the power of two at or above."""
    return triton.next_power_of_2(max(1, rows))


def tiling(rows: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) of the kernel for an input of `rows` rows."""
    return CONFIGS[rows_block(rows)]


@triton.jit
def few_rows_linear_kernel(
    x_ptr,
    weight_ptr,
    bias_ptr,
    out_ptr,
    rows,
    n,
    x_row_stride,
    weight_n_stride,
    weight_k_stride,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program i: out[:, i*BLOCK_N : (i+1)*BLOCK_N] = x @ W[those columns]^T (+ bias), for the
    `rows` (<= ROWS) rows of x. Each weight element is read once and multiplied by every row.
    K is a compile-time constant (a model has a few): the loop's bounds are known when compiling."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    lines = tl.arange(0, ROWS)
    products = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        w = tl.load(
            weight_ptr + cols[:, None] * weight_n_stride + ks[None, :] * weight_k_stride,
            mask=(cols[:, None] < n) & (ks[None, :] < K),
            other=0.0,
        )
        x = tl.load(
            x_ptr + lines[:, None] * x_row_stride + ks[None, :],
            mask=(lines[:, None] < rows) & (ks[None, :] < K),
            other=0.0,
        )
        products += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    out = tl.sum(products, axis=2)
    if HAS_BIAS:
        out += tl.load(bias_ptr + cols, mask=cols < n, other=0.0).to(tl.float32)[None, :]
    tl.store(
        out_ptr + lines[:, None] * n + cols[None, :],
        out,
        mask=(lines[:, None] < rows) & (cols[None, :] < n),
    )


def few_rows_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """x @ weight^T (+ bias) for x [..., K] of at most FEW_ROWS rows in all, weight [N, K] of
    any strides; one launch. `config` overrides CONFIGS' (BLOCK_N, BLOCK_K, num_warps)."""
    size = x.shape[-1]
    lines = x.reshape(-1, size)
    if lines.shape[0] > FEW_ROWS:
        raise ValueError(f"few_rows_linear takes at most {FEW_ROWS} rows, got {lines.shape[0]}")
    if lines.stride(-1) != 1:
        lines = lines.contiguous()
    n = weight.shape[0]
    block_n, block_k, warps = config or tiling(lines.shape[0])
    out = torch.empty(lines.shape[0], n, dtype=x.dtype, device=x.device)
    few_rows_linear_kernel[(triton.cdiv(n, block_n),)](
        lines,
        weight,
        bias if bias is not None else weight,
        out,
        lines.shape[0],
        n,
        lines.stride(0),
        weight.stride(0),
        weight.stride(1),
        K=size,
        HAS_BIAS=bias is not None,
        ROWS=rows_block(lines.shape[0]),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
    )
    return out.view(*x.shape[:-1], n)


class FewRowsLinear(Linear):
    """Chapter 2's Linear; an input of at most FEW_ROWS rows takes the matrix-vector kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= FEW_ROWS * self.input_size:
            return few_rows_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)
