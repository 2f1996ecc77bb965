"""Paged attention in Triton: a split-KV decode kernel, its LSE merge, and a causal prefill.

All three read the KV pool in place, through the page table: entry [row, pos] of a request's
row is the pool slot of its token `pos`, so a block of keys is one load of slots and one
gather of [block, head_dim] rows, whatever the page size. Nothing is copied or padded.

Decode (one query per request) is memory-bound: each key and value is read once and used for a
handful of multiply-adds. Two ideas make it fast:

- GQA packing: the `group` query heads that share a KV head are one program's rows, so a
  block of that KV head's keys is read once for all of them (and the scores are one `tl.dot`).
- split-KV: batch x kv_heads programs are too few to fill a GPU when the batch is small, so
  each request's context is cut into `num_splits` chunks, one program each. A program writes
  its chunk's output, normalised over the chunk alone, and the chunk's log-sum-exp (LSE) of
  the scores; `merge_kernel` then weighs the partial outputs by exp(lse - max lse).

Online softmax, in every kernel: a program walks its keys block by block, keeping per query
row the running maximum score m, the running sum l of exp(score - m) and the running
exp-weighted sum acc of values; a new block with a larger maximum rescales l and acc by
exp(m_old - m_new). At the end acc / l is the softmax-weighted mean of the values and
m + log(l) the LSE of the scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minisgl.utils import div_ceil


MAX_SPLITS = 32  # more chunks than this cost more in the merge than they gain in parallelism
WAVES = 2  # programs per SM the split count aims at: one wave leaves SMs idle at its tail
MIN_DOT = 16  # tl.dot wants every dimension of a tile to be at least 16


@dataclass(frozen=True)
class DecodeConfig:
    """How a decode launch is tiled: keys per block, warps per program, and how many
    programs per SM the split count aims at. The default is what `num_decode_splits` and
    the kernels use; the benchmark times a few others."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    waves: int = WAVES


DEFAULT_DECODE = DecodeConfig()


def num_decode_splits(batch_size: int, num_kv_heads: int, sm_count: int, waves: int = WAVES) -> int:
    """How many chunks to cut each request's context into, from the grid alone.

    Without splitting there are batch_size * num_kv_heads programs; aim for `waves` programs
    per SM: ceil(waves * sm_count / programs) splits, at least 1 and at most MAX_SPLITS. It
    reads no length (a CUDA graph replays one grid for every batch of its size), so a short
    context may leave some chunks empty: they write an empty partial that the merge ignores.
    """
    programs = batch_size * num_kv_heads
    return max(1, min(MAX_SPLITS, div_ceil(waves * sm_count, programs)))


@triton.jit
def load_kv_block(
    k_cache_ptr,
    v_cache_ptr,
    table_row_ptr,
    pos,
    key_ok,
    head_offset,
    cache_slot_stride,
    dims,
    dim_ok,
):
    """K and V rows [BLOCK_N, BLOCK_DIM] of one KV head for the tokens at positions `pos`.

    table_row_ptr points at the request's page-table row: token pos's slot is
    table_row_ptr[pos] (load only where key_ok). A row starts at slot * cache_slot_stride +
    head_offset in each pool, the slot taken as int64 (a large pool passes 2**31 elements).
    Masked keys and dims load as 0.
    """
    slots = tl.load(table_row_ptr + pos, mask=key_ok, other=0).to(tl.int64)
    offsets = slots[:, None] * cache_slot_stride + head_offset + dims[None, :]
    mask = key_ok[:, None] & dim_ok[None, :]
    k = tl.load(k_cache_ptr + offsets, mask=mask, other=0.0)
    v = tl.load(v_cache_ptr + offsets, mask=mask, other=0.0)
    return k, v


@triton.jit
def online_softmax_step(q, k, v, allowed, m_i, l_i, acc, sm_scale, DOT_PRECISION: tl.constexpr):
    """Fold one block of keys into the running softmax of every query row; new (m, l, acc).

    scores = q . k^T * sm_scale, -inf where not `allowed` (broadcast to [rows, BLOCK_N]).
    With m_new = max(m, the block's largest score per row), everything so far is rescaled by
    alpha = exp(m - m_new): l = l * alpha + sum(exp(scores - m_new)), acc = acc * alpha +
    exp(scores - m_new) @ v (in v's dtype for the product, float32 accumulated). Each row
    needs an allowed key in the first block it sees (exp(-inf - -inf) would be NaN): key 0 of
    its walk is always allowed here.
    """
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale
    scores = tl.where(allowed, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    page_table_ptr,
    rows_ptr,
    seq_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    q_token_stride,
    q_head_stride,
    cache_slot_stride,
    cache_head_stride,
    table_row_stride,
    sm_scale,
    head_dim,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One chunk of one request's keys, for every query head of one KV head.

    Program (request, kv_head, split) of a [batch, kv_heads, NUM_SPLITS] grid. The request's
    length n = seq_lens[req] and table row come from device tensors. Its chunk is
    [split * chunk, min((split + 1) * chunk, n)) with chunk = ceil(n / NUM_SPLITS) rounded up
    to BLOCK_N; it may be empty. The GROUP query heads kv_head * GROUP + g are the rows of a
    [BLOCK_GROUP, BLOCK_DIM] tile (rows >= GROUP and dims >= head_dim masked). Walk the chunk
    BLOCK_N keys at a time: K and V rows through the page table (load_kv_block), then
    online_softmax_step with the keys past the chunk not allowed. Write acc / l to
    partial_out[req, head, split] and m + log(l) to partial_lse[req, head, split] (float32
    both); an empty chunk writes zeros and an LSE of -inf.
    """
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    row = tl.load(rows_ptr + req).to(tl.int64)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    groups = tl.arange(0, BLOCK_GROUP)
    dims = tl.arange(0, BLOCK_DIM)
    heads = kv_head * GROUP + groups
    row_ok = groups < GROUP
    dim_ok = dims < head_dim
    q = tl.load(
        q_ptr + req * q_token_stride + heads[:, None] * q_head_stride + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_GROUP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_GROUP], dtype=tl.float32)
    acc = tl.zeros([BLOCK_GROUP, BLOCK_DIM], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        pos = block_start + tl.arange(0, BLOCK_N)
        key_ok = pos < end
        k, v = load_kv_block(
            k_cache_ptr,
            v_cache_ptr,
            page_table_ptr + row * table_row_stride,
            pos,
            key_ok,
            kv_head * cache_head_stride,
            cache_slot_stride,
            dims,
            dim_ok,
        )
        m_i, l_i, acc = online_softmax_step(
            q, k, v, key_ok[None, :], m_i, l_i, acc, sm_scale, DOT_PRECISION
        )

    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    part = (req * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split
    tl.store(
        partial_out_ptr + part[:, None] * BLOCK_DIM + dims[None, :],
        out,
        mask=row_ok[:, None],
    )
    tl.store(partial_lse_ptr + part, lse, mask=row_ok)


@triton.jit
def merge_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    out_ptr,
    out_token_stride,
    out_head_stride,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
):
    """Combine one (request, head)'s NUM_SPLITS partial outputs by their LSEs.

    Program (request, head) of a [batch, heads] grid. With M the largest LSE, chunk s weighs
    w_s = exp(lse_s - M) (0 for an empty chunk, whose LSE is -inf), and the output is
    sum_s w_s * out_s / sum_s w_s: each partial was normalised over its own chunk, and w_s
    restores its share of the whole softmax. A request with no keys at all (a padding row)
    gets zeros. Store in out's dtype at out[request, head, :head_dim].
    """
    req = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_SPLITS)
    dims = tl.arange(0, BLOCK_DIM)
    split_ok = splits < NUM_SPLITS
    base = (req * tl.num_programs(1) + head) * NUM_SPLITS
    lse = tl.load(partial_lse_ptr + base + splits, mask=split_ok, other=float("-inf"))
    parts = tl.load(
        partial_out_ptr + (base + splits)[:, None] * BLOCK_DIM + dims[None, :],
        mask=split_ok[:, None],
        other=0.0,
    )
    top = tl.max(lse, 0)
    weights = tl.exp(lse - tl.where(top > float("-inf"), top, 0.0))  # exp(-inf) = 0
    total = tl.sum(weights, 0)
    out = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + req * out_token_stride + head * out_head_stride + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < head_dim,
    )


def dot_precision(dtype: torch.dtype) -> str:
    """float32 attention in full precision (tl.dot would round its inputs to TF32 on a GPU,
    and greedy tokens would drift from the torch backend's); 16-bit inputs are exact anyway."""
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    num_splits: int,
    config: DecodeConfig = DEFAULT_DECODE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first pass of decode: each chunk's output and LSE, before the merge.

    q: [batch, heads, head_dim]; k_cache, v_cache: [slots, kv_heads, head_dim] of one layer;
    page_table: [rows, max_seq_len] slots; rows, seq_lens: [batch] int32 on the device.
    Launches decode_kernel on grid (batch, kv_heads, num_splits); returns float32 partials
    [batch, heads, num_splits, BLOCK_DIM] and LSEs [batch, heads, num_splits]. Tiles of at
    least MIN_DOT rows and columns: BLOCK_GROUP = the group rounded up to a power of two,
    BLOCK_DIM = head_dim rounded up, both at least MIN_DOT. No length is read on the host.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    block_dim = max(MIN_DOT, triton.next_power_of_2(head_dim))
    partial_out = torch.empty(
        batch, num_heads, num_splits, block_dim, dtype=torch.float32, device=q.device
    )
    partial_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    decode_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        page_table,
        rows,
        seq_lens,
        partial_out,
        partial_lse,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        page_table.stride(0),
        head_dim**-0.5,
        head_dim,
        GROUP=group,
        NUM_SPLITS=num_splits,
        BLOCK_GROUP=max(MIN_DOT, triton.next_power_of_2(group)),
        BLOCK_N=config.block_n,
        BLOCK_DIM=block_dim,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return partial_out, partial_lse


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    num_splits: int,
    config: DecodeConfig = DEFAULT_DECODE,
) -> torch.Tensor:
    """Attention of one query token per request over its first seq_lens[i] tokens: the
    partials of decode_partials, merged by merge_partials into a tensor like q."""
    partial_out, partial_lse = decode_partials(
        q, k_cache, v_cache, page_table, rows, seq_lens, num_splits, config
    )
    out = torch.empty_like(q)
    merge_partials(partial_out, partial_lse, out)
    return out


def merge_partials(partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Launch merge_kernel: partials [batch, heads, splits, BLOCK_DIM] and their LSEs
    [batch, heads, splits] (float32, contiguous) into out [batch, heads, head_dim]."""
    batch, num_heads, num_splits, block_dim = partial_out.shape
    merge_kernel[(batch, num_heads)](
        partial_out,
        partial_lse,
        out,
        out.stride(0),
        out.stride(1),
        out.shape[2],
        NUM_SPLITS=num_splits,
        BLOCK_SPLITS=triton.next_power_of_2(num_splits),
        BLOCK_DIM=block_dim,
    )


@triton.jit
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    page_table_ptr,
    rows_ptr,
    seq_lens_ptr,
    cached_lens_ptr,
    qo_indptr_ptr,
    q_token_stride,
    q_head_stride,
    out_token_stride,
    out_head_stride,
    cache_slot_stride,
    cache_head_stride,
    table_row_stride,
    sm_scale,
    head_dim,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """BLOCK_M new tokens of one request, one query head, over its cached and new keys.

    Program (request, head, m_block) of a [batch, heads, ceil(max extend / BLOCK_M)] grid.
    The request's new tokens are positions [cached_len, seq_len), rows qo_indptr[req] + i of
    q and out; a program whose block starts past extend_len = seq_len - cached_len returns.
    Query i sits at position cached_len + i and sees keys at positions <= that (its cached
    prefix, then the causal part of the new tokens); so the walk over the keys, BLOCK_N at a
    time, stops at cached_len + the block's last query. Keys come from KV head head // GROUP
    (load_kv_block); online_softmax_step allows a key where it is in the walk and at or before
    the query's position; store acc / l for the rows < extend_len.
    """
    req = tl.program_id(0)
    head = tl.program_id(1)
    m_block = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    cached_len = tl.load(cached_lens_ptr + req)
    extend_len = seq_len - cached_len
    if m_block * BLOCK_M >= extend_len:
        return
    row = tl.load(rows_ptr + req).to(tl.int64)
    q_start = tl.load(qo_indptr_ptr + req)
    kv_head = head // GROUP

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_DIM)
    q_ok = offs_m < extend_len
    dim_ok = dims < head_dim
    tokens = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * q_token_stride + head * q_head_stride + dims[None, :],
        mask=q_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    query_pos = cached_len + offs_m

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DIM], dtype=tl.float32)
    key_end = tl.minimum(seq_len, cached_len + (m_block + 1) * BLOCK_M)
    for block_start in range(0, key_end, BLOCK_N):
        pos = block_start + tl.arange(0, BLOCK_N)
        key_ok = pos < key_end
        k, v = load_kv_block(
            k_cache_ptr,
            v_cache_ptr,
            page_table_ptr + row * table_row_stride,
            pos,
            key_ok,
            kv_head * cache_head_stride,
            cache_slot_stride,
            dims,
            dim_ok,
        )
        allowed = key_ok[None, :] & (pos[None, :] <= query_pos[:, None])
        m_i, l_i, acc = online_softmax_step(
            q, k, v, allowed, m_i, l_i, acc, sm_scale, DOT_PRECISION
        )

    out = acc / l_i[:, None]
    tl.store(
        out_ptr + tokens[:, None] * out_token_stride + head * out_head_stride + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=q_ok[:, None] & dim_ok[None, :],
    )


PREFILL_BLOCK_M = 64  # new tokens per program
PREFILL_BLOCK_N = 64  # keys per block of the walk
# Two stages of K and V blocks in flight: with float32 tiles of head_dim 128 a third would
# pass the shared memory of an SM (q, then 64 KiB of K and V per stage).
PREFILL_STAGES = 2


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    cached_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    max_extend_len: int,
) -> torch.Tensor:
    """Causal attention of every request's new tokens over its cached prefix and themselves.

    q: [tokens, heads, head_dim], request i's new tokens at rows qo_indptr[i]:qo_indptr[i+1];
    rows, seq_lens, cached_lens, qo_indptr: int32 on the device; max_extend_len: the host's
    largest extend length, which sizes the grid (batch, heads, ceil(max_extend_len /
    PREFILL_BLOCK_M)). Returns like q.
    """
    num_tokens, num_heads, head_dim = q.shape
    batch = rows.shape[0]
    out = torch.empty_like(q)
    block_m = min(PREFILL_BLOCK_M, max(MIN_DOT, triton.next_power_of_2(max_extend_len)))
    prefill_kernel[(batch, num_heads, div_ceil(max_extend_len, block_m))](
        q,
        k_cache,
        v_cache,
        out,
        page_table,
        rows,
        seq_lens,
        cached_lens,
        qo_indptr,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        page_table.stride(0),
        head_dim**-0.5,
        head_dim,
        GROUP=num_heads // k_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=PREFILL_BLOCK_N,
        BLOCK_DIM=max(MIN_DOT, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=dot_precision(q.dtype),
        num_stages=PREFILL_STAGES,
    )
    return out
