"""Chapter 20 tests: the mixture-of-experts layer and Qwen3-MoE.

References are computed, never typed: transformers' own Qwen3-MoE router, expert MLP, sparse
block and greedy generation; a dense loop over tokens and their experts; Python's stable
sort. The fused Triton kernel runs in Triton's interpreter on the CPU (TRITON_INTERPRET is set
before triton is imported) and is compared with the torch path.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton: kernels run on the CPU

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
from conftest import MODELS, encode, greedy, guarded_llm, hf_greedy_cached, require_model
from course.differential import Tolerance, assert_same_call, use_reference_stubs
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from test_ch17_gpu_attention import HostSyncGuard
from test_ch19_kernels import assert_same_kernel
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeMLP,
    Qwen3MoeSparseMoeBlock,
    Qwen3MoeTopKRouter,
)

from minisgl.distributed import set_tp_info
from minisgl.kernels import fused_moe as fused_moe_module
from minisgl.kernels.fused_moe import align_to_blocks, fused_moe, grouped_gemm_kernel
from minisgl.models import ModelConfig, create_model, load_weights
from minisgl.layers.moe import (
    ExpertWeights,
    SparseMoeBlock,
    expert_mlp,
    moe_forward_torch,
    route,
    scatter_back,
    sort_by_expert,
)

MODEL = MODELS / "tiny-qwen3-moe"
CPU = torch.device("cpu")
HIDDEN, INTERMEDIATE, EXPERTS = 48, 40, 8  # not multiples of the kernel's blocks on purpose
# float32 everywhere: ours and transformers' differ only in summation order.
ATOL = 1e-5
PROMPTS = [
    "The capital of France is",
    "The capital of France is a city of",  # shares a prefix with the first: radix reuse
    "One, two, three,",
    "Water boils at one hundred degrees",
]


def hf_config(top_k: int = 2, renormalize: bool = True) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        hidden_size=HIDDEN,
        moe_intermediate_size=INTERMEDIATE,
        num_experts=EXPERTS,
        num_experts_per_tok=top_k,
        norm_topk_prob=renormalize,
    )


def random_experts(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [E, 2I, H], down [E, H, I]) with unit-scale outputs."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=g) / HIDDEN**0.5
    down = torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, generator=g) / INTERMEDIATE**0.5
    return gate_up, down


def routed(tokens: int, top_k: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """hidden [tokens, H] and a top-k routing of it (renormalized), from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, HIDDEN, generator=g)
    weights, expert_ids = route(torch.randn(tokens, EXPERTS, generator=g) * 2, top_k, True)
    return hidden, weights, expert_ids


def dense_reference(
    hidden: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
) -> torch.Tensor:
    """The MoE output the slow, obvious way: every token, every one of its experts."""
    out = torch.zeros_like(hidden)
    for t in range(hidden.shape[0]):
        for slot in range(expert_ids.shape[1]):
            e = int(expert_ids[t, slot])
            gate, up = (gate_up[e] @ hidden[t]).chunk(2)
            out[t] += weights[t, slot] * (down[e] @ (torch.nn.functional.silu(gate) * up))
    return out


def moe_block(top_k: int, renormalize: bool, seed: int = 0) -> SparseMoeBlock:
    """Our block with seeded weights (loaded through its own checkpoint protocol)."""
    block = SparseMoeBlock(HIDDEN, EXPERTS, top_k, INTERMEDIATE, renormalize)
    gate_up, down = random_experts(seed)
    router = torch.randn(EXPERTS, HIDDEN, generator=torch.Generator().manual_seed(seed + 1))
    block.gate.weight.data.copy_(router)
    for e in range(EXPERTS):
        gate, up = gate_up[e].chunk(2)
        block.experts["gate_up_proj"].load_slice("weight", 2 * e, gate)
        block.experts["gate_up_proj"].load_slice("weight", 2 * e + 1, up)
        block.experts["down_proj"].load_slice("weight", e, down[e])
    return block


def hf_block_like(block: SparseMoeBlock, top_k: int, renormalize: bool) -> Qwen3MoeSparseMoeBlock:
    """transformers' Qwen3-MoE sparse block holding our block's weights."""
    hf = Qwen3MoeSparseMoeBlock(hf_config(top_k, renormalize))
    with torch.no_grad():
        hf.gate.weight.copy_(block.gate.weight)
        hf.experts.gate_up_proj.copy_(block.experts["gate_up_proj"].weight)
        hf.experts.down_proj.copy_(block.experts["down_proj"].weight)
    return hf


# --- routing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_route_matches_the_transformers_router(top_k, renormalize):
    router = Qwen3MoeTopKRouter(hf_config(top_k, renormalize))
    g = torch.Generator().manual_seed(top_k)
    router.weight.data.copy_(torch.randn(EXPERTS, HIDDEN, generator=g) / HIDDEN**0.5)
    hidden = torch.randn(9, HIDDEN, generator=g)
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(hidden)
    weights, expert_ids = route(logits, top_k, renormalize)
    assert torch.equal(expert_ids, hf_ids)
    torch.testing.assert_close(weights.float(), hf_weights.float(), atol=1e-6, rtol=1e-6)
    if renormalize:  # each token's weights sum to 1; without it, to less (k of 8 experts)
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(9))
    else:
        assert bool((weights.sum(dim=-1) < 1 - 1e-3).all())


@st.composite
def routings(draw: st.DrawFn, max_tokens: int = 12) -> tuple[torch.Tensor, int, int]:
    """Random expert ids [tokens, top_k] over num_experts: (ids, num_experts, top_k)."""
    num_experts = draw(st.integers(1, 10))
    top_k = draw(st.integers(1, min(num_experts, 4)))
    tokens = draw(st.integers(1, max_tokens))
    # a few favourite experts, as real routers have; distinct within each token
    rows = [draw(st.permutations(range(num_experts)))[:top_k] for _ in range(tokens)]
    return torch.tensor(rows, dtype=torch.int64), num_experts, top_k


@settings(max_examples=25)
@given(
    tokens=st.integers(1, 6),
    num_experts=st.integers(2, 10),
    data=st.data(),
    renormalize=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_route_softmaxes_all_experts_in_float32_and_keeps_the_best_k(
    tokens, num_experts, data, renormalize, dtype
):
    top_k = data.draw(st.integers(1, num_experts), label="top_k")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    logits = torch.randn(tokens, num_experts, generator=torch.Generator().manual_seed(seed)) * 3
    logits = logits.to(dtype)
    weights, expert_ids = route(logits, top_k, renormalize)
    assert weights.dtype == torch.float32, (
        f"weights are {weights.dtype}: the softmax runs in float32"
    )
    assert expert_ids.dtype == torch.int64, f"expert ids are {expert_ids.dtype}, not int64"
    assert weights.shape == expert_ids.shape == (tokens, top_k)
    probs = torch.softmax(logits.double(), dim=-1)  # over ALL experts
    kept = probs.gather(1, expert_ids)
    assert bool((weights[:, :-1] >= weights[:, 1:]).all()), "the best expert comes first"
    best = probs.topk(top_k, dim=-1).values
    torch.testing.assert_close(kept, best, atol=1e-6, rtol=0, msg="not the k most likely experts")
    expected = kept / kept.sum(-1, keepdim=True) if renormalize else kept
    torch.testing.assert_close(weights.double(), expected, atol=1e-6, rtol=1e-5)


# --- dispatch: sort by expert, run each expert, scatter back -------------------------------------


@pytest.mark.parametrize("tokens,top_k", [(1, 2), (7, 2), (20, 3)])
def test_sort_by_expert_groups_pairs_in_a_stable_order(tokens, top_k):
    _, _, expert_ids = routed(tokens, top_k)
    flat = expert_ids.flatten().tolist()
    order, tokens_per_expert = sort_by_expert(expert_ids, EXPERTS)
    assert order.tolist() == sorted(range(len(flat)), key=lambda pair: flat[pair])
    assert tokens_per_expert.tolist() == [flat.count(e) for e in range(EXPERTS)]


def test_expert_mlp_matches_transformers_mlp():
    mlp = Qwen3MoeMLP(hf_config(), intermediate_size=INTERMEDIATE)
    gate_up, down = random_experts()
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(gate_up[3, :INTERMEDIATE])
        mlp.up_proj.weight.copy_(gate_up[3, INTERMEDIATE:])
        mlp.down_proj.weight.copy_(down[3])
        x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(expert_mlp(x, gate_up[3], down[3]), mlp(x), atol=ATOL, rtol=0)


def test_scatter_back_sums_weighted_outputs_into_their_tokens():
    _, weights, expert_ids = routed(6, 3)
    order = torch.randperm(18, generator=torch.Generator().manual_seed(3))  # any pair order
    expert_out = torch.randn(18, HIDDEN, generator=torch.Generator().manual_seed(4))
    expected = torch.zeros(6, HIDDEN)
    for row, pair in enumerate(order.tolist()):
        expected[pair // 3] += weights.flatten()[pair] * expert_out[row]
    got = scatter_back(expert_out, order, weights, 6)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("tokens,top_k", [(1, 2), (11, 2), (16, 3)])
def test_moe_forward_torch_matches_the_dense_reference(tokens, top_k):
    hidden, weights, expert_ids = routed(tokens, top_k)
    gate_up, down = random_experts()
    expected = dense_reference(hidden, gate_up, down, weights, expert_ids)
    got = moe_forward_torch(hidden, gate_up, down, weights, expert_ids)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("renormalize", [True, False])
def test_sparse_block_matches_the_transformers_sparse_block(renormalize):
    block = moe_block(2, renormalize)
    hf = hf_block_like(block, 2, renormalize)
    hidden = torch.randn(1, 12, HIDDEN, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(block(hidden[0]), hf(hidden)[0], atol=ATOL, rtol=0)


@settings(max_examples=40)
@given(routing=routings(max_tokens=20))
def test_sort_by_expert_never_waits_for_the_device(routing):
    """Any routing, some experts unused: a stable sort, every expert counted, and nothing
    that reads a value back to the host (bincount does: on a GPU it stalls the step)."""
    expert_ids, num_experts, _ = routing
    flat = expert_ids.flatten().tolist()
    with HostSyncGuard("sort_by_expert", fatal=True):
        order, tokens_per_expert = sort_by_expert(expert_ids, num_experts)
    assert order.tolist() == sorted(range(len(flat)), key=lambda pair: flat[pair])
    assert tokens_per_expert.tolist() == [flat.count(e) for e in range(num_experts)]
    assert order.dtype == tokens_per_expert.dtype == torch.int64


@settings(max_examples=30)
@given(routing=routings(), extra_tokens=st.integers(0, 3), data=st.data())
def test_scatter_back_weights_each_pair_into_its_token_in_the_outputs_dtype(
    routing, extra_tokens, data
):
    expert_ids, _, top_k = routing
    tokens = expert_ids.shape[0]
    pairs = tokens * top_k
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]), label="dtype")
    gen = torch.Generator().manual_seed(pairs)
    weights = torch.rand(tokens, top_k, generator=gen)  # float32, as route returns them
    order = torch.randperm(pairs, generator=gen)
    expert_out = torch.randn(pairs, 8, generator=gen).to(dtype)
    num_tokens = tokens + extra_tokens  # the last rows receive no pair
    got = scatter_back(expert_out, order, weights, num_tokens)
    assert got.dtype == dtype, f"the result is {got.dtype}, expert_out is {dtype}"
    expected = torch.zeros(num_tokens, 8, dtype=torch.float64)
    for row, pair in enumerate(order.tolist()):
        expected[pair // top_k] += weights.flatten()[pair].double() * expert_out[row].double()
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(got.double(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_moe_forward_torch_keeps_the_hidden_dtype_and_skips_unused_experts(dtype):
    """Every token on experts 2 and 5 only: the other experts get no tokens (and their
    weights, NaN here, must never be read)."""
    hidden, weights, _ = routed(5, 2)
    expert_ids = torch.tensor([[2, 5], [5, 2]] * 2 + [[2, 5]])
    gate_up, down = random_experts()
    expected = dense_reference(hidden, gate_up, down, weights, expert_ids)
    unused = [e for e in range(EXPERTS) if e not in (2, 5)]
    gate_up[unused], down[unused] = float("nan"), float("nan")
    got = moe_forward_torch(
        hidden.to(dtype), gate_up.to(dtype), down.to(dtype), weights, expert_ids
    )
    assert got.dtype == dtype and got.shape == hidden.shape
    tolerance = ATOL if dtype == torch.float32 else 0.05
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


# --- loading: one checkpoint tensor per expert and projection ------------------------------------


def test_expert_weights_load_each_experts_tensors_and_this_ranks_slice():
    model = create_model(ModelConfig.from_dir(require_model(MODEL)), CPU, torch.float32)
    load_weights(model, MODEL, progress=False)
    with safe_open(MODEL / "model.safetensors", framework="pt") as f:
        layer = next(i for i in range(2) if f"model.layers.{i}.mlp.gate.weight" in f.keys())
        prefix = f"model.layers.{layer}.mlp.experts"
        expert = EXPERTS - 1
        gate, up, down = (
            f.get_tensor(f"{prefix}.{expert}.{name}.weight")
            for name in ("gate_proj", "up_proj", "down_proj")
        )
    experts = model.model.layers[layer].mlp.experts
    assert torch.equal(experts["gate_up_proj"].weight[expert], torch.cat([gate, up]))
    assert torch.equal(experts["down_proj"].weight[expert], down)
    # Rank 1 of 2 keeps the second half of each expert's intermediate dimension.
    set_tp_info(1, 2)
    try:
        half = ExpertWeights(EXPERTS, [gate.shape[0] // 2] * 2, gate.shape[1], 0)
        half.load_slice("weight", 2 * expert + 1, up)
        columns = ExpertWeights(EXPERTS, [down.shape[0]], down.shape[1] // 2, 1)
        columns.load_slice("weight", expert, down)
    finally:
        set_tp_info(0, 1)
    assert torch.equal(half.weight[expert, gate.shape[0] // 2 :], up[up.shape[0] // 2 :])
    assert torch.equal(columns.weight[expert], down[:, down.shape[1] // 2 :])


class CheckpointSlice:
    """safetensors' lazy slice: indexing reads that part alone; reading it all is refused."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.reads = tensor, []

    def __getitem__(self, index: slice | tuple[slice, ...]) -> torch.Tensor:
        parts = index if isinstance(index, tuple) else (index,)
        assert all(isinstance(part, slice) for part in parts), f"indexed with {index!r}"
        whole = all(part == slice(None) for part in parts)
        assert not whole, "read the whole checkpoint tensor: index only this rank's part"
        self.reads.append(index)
        return self.tensor[index]


@settings(max_examples=40)
@given(
    num_experts=st.integers(1, 4),
    projection_rows=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    cols=st.integers(1, 4),
    split_dim=st.sampled_from([0, 1]),
    tp_size=st.integers(1, 4),
    data=st.data(),
)
def test_load_slice_fills_one_experts_projection_with_this_ranks_part(
    num_experts, projection_rows, cols, split_dim, tp_size, data
):
    rank = data.draw(st.integers(0, tp_size - 1), label="rank")
    expert = data.draw(st.integers(0, num_experts - 1), label="expert")
    projection = data.draw(st.integers(0, len(projection_rows) - 1), label="projection")
    weights = ExpertWeights(num_experts, projection_rows, cols, split_dim)
    weights.weight.data.fill_(-1.0)  # what no checkpoint holds
    rows = projection_rows[projection]
    full = (rows * tp_size, cols) if split_dim == 0 else (rows, cols * tp_size)
    tensor = torch.arange(full[0] * full[1], dtype=torch.float32).view(full)
    checkpoint = CheckpointSlice(tensor)
    set_tp_info(rank, tp_size)
    try:
        weights.load_slice("weight", expert * len(projection_rows) + projection, checkpoint)
    finally:
        set_tp_info(0, 1)
    start = sum(projection_rows[:projection])
    part = rows if split_dim == 0 else cols
    mine = tensor.narrow(split_dim, rank * part, part)
    assert torch.equal(weights.weight[expert, start : start + rows], mine), (
        f"expert {expert}, projection {projection}: not rank {rank}'s part {rank} of {tp_size} "
        f"along dimension {split_dim}"
    )
    untouched = weights.weight.clone()
    untouched[expert, start : start + rows] = -1.0
    assert bool((untouched == -1.0).all()), "rows of another expert or projection changed"
    assert len(checkpoint.reads) == 1, "index the checkpoint once, with this rank's slice"


def test_load_slice_refuses_a_checkpoint_tensor_of_the_wrong_shape():
    weights = ExpertWeights(2, [3, 3], 4, 0)
    with pytest.raises(ValueError):
        weights.load_slice("weight", 1, torch.zeros(2, 4))  # 2 rows where the target holds 3
    with pytest.raises(ValueError):
        weights.load_slice("weight", 0, torch.zeros(3, 5))  # 5 columns for 4
    columns = ExpertWeights(2, [4], 3, 1)
    with pytest.raises(ValueError):
        columns.load_slice("weight", 1, torch.zeros(4, 2))


# --- the whole model: greedy parity with transformers --------------------------------------------


def generate(**config: object) -> list[list[list[int]]]:
    """Each prompt's greedy tokens, twice: the second round reuses the first's cached prefixes."""
    llm = guarded_llm(require_model(MODEL), show_progress=False, **config)
    try:
        rounds = [llm.generate(encode(MODEL, PROMPTS), greedy(10)) for _ in range(2)]
    finally:
        llm.shutdown()
    return [[o["token_ids"] for o in outputs] for outputs in rounds]


def expected_tokens() -> list[list[list[int]]]:
    once = [hf_greedy_cached(Path(MODEL), ids, 10) for ids in encode(MODEL, PROMPTS)]
    return [once, once]


def test_greedy_tokens_match_transformers_with_radix_chunked_prefill_and_overlap():
    got = generate(cache_type="radix", max_extend_tokens=6, enable_overlap=True, max_running_req=4)
    assert got == expected_tokens()


def test_two_tensor_parallel_ranks_split_every_expert_and_match_transformers():
    """Each of 2 rank processes holds half of every expert; the all-reduce adds the halves."""
    llm = guarded_llm(require_model(MODEL), show_progress=False, tp_size=2, max_extend_tokens=6)
    try:
        got = [o["token_ids"] for o in llm.generate(encode(MODEL, PROMPTS), greedy(10))]
    finally:
        llm.shutdown()
    assert got == expected_tokens()[0]


def test_a_wrong_top_k_renormalization_breaks_parity(monkeypatch):
    """The parity test above would catch a router that skips the renormalization."""
    import minisgl.layers.moe as moe

    real_route = moe.route
    monkeypatch.setattr(moe, "route", lambda logits, k, _renormalize: real_route(logits, k, False))
    got = generate(max_extend_tokens=6, enable_overlap=True, max_running_req=4)
    assert got != expected_tokens()


# --- the fused Triton kernel, in Triton's interpreter --------------------------------------------


@pytest.mark.parametrize("tokens,top_k,block_m", [(1, 2, 16), (13, 2, 16), (40, 3, 16), (9, 2, 64)])
def test_align_to_blocks_pads_each_expert_to_whole_blocks(tokens, top_k, block_m):
    _, _, expert_ids = routed(tokens, top_k)
    flat = expert_ids.flatten().tolist()
    pair_ids, block_expert = align_to_blocks(expert_ids, EXPERTS, block_m)
    blocks = pair_ids.view(-1, block_m).tolist()
    assert len(blocks) == block_expert.numel()
    seen = []
    for block, expert in zip(blocks, block_expert.tolist()):
        real = [pair for pair in block if pair != len(flat)]
        if expert == -1:
            assert not real, "an unused block holds pairs"
            continue
        assert real and all(flat[pair] == expert for pair in real), "a block mixes experts"
        seen += real
    assert sorted(seen) == list(range(len(flat))), "every pair appears exactly once"
    used = [e for e in block_expert.tolist() if e != -1]
    assert used == sorted(used) and block_expert.tolist()[: len(used)] == used
    assert len(used) == sum(-(-flat.count(e) // block_m) for e in range(EXPERTS))


@settings(max_examples=40)
@given(routing=routings(max_tokens=20), block_m=st.sampled_from([1, 4, 16]))
def test_align_to_blocks_has_shapes_of_the_batch_alone_and_never_waits(routing, block_m):
    """Any routing: the worst-case layout (its shapes depend only on the number of pairs),
    int64 pair ids with num_pairs for padding, -1 past the last used block, no host sync."""
    expert_ids, num_experts, _ = routing
    flat = expert_ids.flatten().tolist()
    num_pairs = len(flat)
    with HostSyncGuard("align_to_blocks", fatal=True):
        pair_ids, block_expert = align_to_blocks(expert_ids, num_experts, block_m)
    max_blocks = -(-num_pairs // block_m) + min(num_experts, num_pairs)
    assert block_expert.shape == (max_blocks,) and pair_ids.shape == (max_blocks * block_m,)
    assert pair_ids.dtype == torch.int64
    expected_ids, expected_experts = [], []
    for e in range(num_experts):
        pairs = [pair for pair in range(num_pairs) if flat[pair] == e]
        blocks = -(-len(pairs) // block_m)
        expected_ids += pairs + [num_pairs] * (blocks * block_m - len(pairs))
        expected_experts += [e] * blocks
    unused = max_blocks - len(expected_experts)
    assert block_expert.tolist() == expected_experts + [-1] * unused
    assert pair_ids.tolist() == expected_ids + [num_pairs] * (unused * block_m)


def launch_grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    pairs_per_a_row: int,
    gated: bool,
    weighted: bool,
) -> torch.Tensor:
    """The kernel over a sentinel-filled output with a spare row (a padding pair's) and spare
    columns (past N): returns the whole buffer, so a store outside the result shows."""
    num_experts, block_m = b.shape[0], 4
    pair_ids, block_expert = align_to_blocks(expert_ids, num_experts, block_m)
    num_pairs, n = expert_ids.numel(), b.shape[1] // 2 if gated else b.shape[1]
    buffer = torch.full((num_pairs + 1, n + 5), 7.0)
    grouped_gemm_kernel[(block_expert.numel(), triton.cdiv(n, 8))](
        a,
        b,
        buffer,
        pair_ids,
        block_expert,
        weights,
        num_pairs,
        n,
        a.stride(0),
        b.stride(0),
        b.stride(1),
        buffer.stride(0),
        K=b.shape[2],
        PAIRS_PER_A_ROW=pairs_per_a_row,
        GATED=gated,
        WEIGHTED=weighted,
        PRECISION="ieee",
        BLOCK_M=block_m,
        BLOCK_N=8,
        BLOCK_K=8,
    )
    return buffer


@pytest.mark.parametrize("gated,weighted", [(False, False), (True, False), (False, True)])
def test_grouped_gemm_kernel_reads_strided_rows_and_stores_only_real_cells(gated, weighted):
    """A is a strided view (rows wider than K), K and N are not multiples of the blocks, the
    flags each on their own: each pair's row is f(A[pair // top_k] @ B[expert]^T), and
    nothing is stored for the padding pair or past column N."""
    top_k, tokens, k, n = 2, 5, 13, 11
    _, weights, expert_ids = routed(tokens, top_k, seed=7)
    expert_ids = expert_ids % 3  # 3 experts: several pairs each
    expert_ids[:, 1] = (expert_ids[:, 0] + 1) % 3
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(tokens, k + 6, generator=gen)[:, 2 : 2 + k]  # stride(0) = k + 6
    b = torch.randn(3, 2 * n if gated else n, k, generator=gen)
    buffer = launch_grouped_gemm(a, b, expert_ids, weights.contiguous(), top_k, gated, weighted)
    expected = torch.empty(tokens * top_k, n)
    for pair, expert in enumerate(expert_ids.flatten().tolist()):
        row = b[expert] @ a[pair // top_k]
        if gated:
            row = torch.nn.functional.silu(row[:n]) * row[n:]
        expected[pair] = row * weights.flatten()[pair] if weighted else row
    real = buffer[: tokens * top_k, :n]
    torch.testing.assert_close(real, expected, atol=1e-4, rtol=1e-4)
    assert bool((buffer[:, n:] == 7.0).all()), "stored past column N"
    assert bool((buffer[tokens * top_k] == 7.0).all()), "stored the padding pair's row"


# After the kernel tests above: a kernel that stores out of bounds may crash the process here.
@pytest.mark.parametrize("tokens,top_k", [(1, 2), (13, 2), (33, 3)])
def test_fused_moe_kernel_matches_the_torch_path(tokens, top_k):
    hidden, weights, expert_ids = routed(tokens, top_k)
    gate_up, down = random_experts()
    expected = moe_forward_torch(hidden, gate_up, down, weights, expert_ids)
    got = fused_moe(hidden, gate_up, down, weights, expert_ids)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. Floats within the tolerance a correct implementation in
# another order of operations keeps: 1e-5 in float32, 0.05 in 16 bits (as the tests above).
# The kernel runs in Triton's interpreter, launched the same way for yours and the reference's.

FLOAT_DTYPES = st.sampled_from([torch.float32, torch.bfloat16])
TOLERANCE = {
    torch.float32: Tolerance(1e-5, 1e-5),
    torch.bfloat16: Tolerance(0.05, 0.05),
    torch.float16: Tolerance(0.05, 0.05),
}


@st.composite
def router_logits(draw: st.DrawFn) -> tuple[torch.Tensor, int, bool]:
    """(router_logits [0 to 6 tokens, 1 to 10 experts], top_k from 1 to all, renormalize) in
    float32, bfloat16 or float16. Each token's logits are distinct multiples of 1/4, exact in
    every dtype: no two experts tie, so the top k and their order are the contract's alone."""
    experts = draw(st.integers(1, 10))
    tokens = draw(st.integers(0, 6))
    scale = draw(st.sampled_from([0.25, 0.5, 1.0]))
    rows = [draw(st.permutations(range(experts))) for _ in range(tokens)]
    logits = (torch.tensor(rows, dtype=torch.float32).view(tokens, experts) - experts / 2) * scale
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    return logits.to(dtype), draw(st.integers(1, experts)), draw(st.booleans())


@settings(max_examples=40)
@given(args=router_logits())
def test_route_matches_the_reference(args):
    assert_same_call(route, *args, tolerance=Tolerance(1e-5, 1e-6))


@settings(max_examples=40)
@given(routing=routings(max_tokens=12), extra_experts=st.integers(0, 3))
def test_sort_by_expert_matches_the_reference(routing, extra_experts):
    """Any routing, experts past the last one used counted too."""
    expert_ids, num_experts, _ = routing
    assert_same_call(sort_by_expert, expert_ids, num_experts + extra_experts)


@settings(max_examples=25)
@given(
    tokens=st.integers(0, 5),
    hidden=st.integers(1, 12),
    intermediate=st.integers(1, 8),
    dtype=FLOAT_DTYPES,
    seed=st.integers(0, 2**16),
)
def test_expert_mlp_matches_the_reference(tokens, hidden, intermediate, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    gate_up = (torch.randn(2 * intermediate, hidden, generator=gen) / hidden**0.5).to(dtype)
    down = (torch.randn(hidden, intermediate, generator=gen) / intermediate**0.5).to(dtype)
    assert_same_call(expert_mlp, x, gate_up, down, tolerance=TOLERANCE[dtype])


@settings(max_examples=30)
@given(
    routing=routings(),
    extra_tokens=st.integers(0, 3),
    dtype=FLOAT_DTYPES,
    seed=st.integers(0, 2**16),
)
def test_scatter_back_matches_the_reference(routing, extra_tokens, dtype, seed):
    """Pairs in any order; the last rows of the result may receive no pair."""
    expert_ids, _, top_k = routing
    pairs = expert_ids.numel()
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(expert_ids.shape[0], top_k, generator=gen)
    order = torch.randperm(pairs, generator=gen)
    expert_out = torch.randn(pairs, 6, generator=gen).to(dtype)
    num_tokens = expert_ids.shape[0] + extra_tokens
    assert_same_call(
        scatter_back, expert_out, order, weights, num_tokens, tolerance=TOLERANCE[dtype]
    )


@settings(max_examples=20)
@given(routing=routings(max_tokens=8), dtype=FLOAT_DTYPES, seed=st.integers(0, 2**16))
def test_moe_forward_torch_matches_the_reference(routing, dtype, seed):
    """Experts no token chose hold NaN weights: they must not be read."""
    expert_ids, num_experts, top_k = routing
    tokens, hidden, intermediate = expert_ids.shape[0], 8, 6
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    gate_up = torch.randn(num_experts, 2 * intermediate, hidden, generator=gen) / hidden**0.5
    down = torch.randn(num_experts, hidden, intermediate, generator=gen) / intermediate**0.5
    unused = [e for e in range(num_experts) if e not in expert_ids.flatten().tolist()]
    gate_up[unused], down[unused] = float("nan"), float("nan")
    weights = torch.rand(tokens, top_k, generator=gen)
    assert_same_call(
        moe_forward_torch,
        x,
        gate_up.to(dtype),
        down.to(dtype),
        weights,
        expert_ids,
        tolerance=TOLERANCE[dtype],
    )


class LazySlice:
    """safetensors' lazy slice: indexing reads that part alone (`elements_read` counts what
    was read: only this rank's part, once); reading it all is refused."""

    def __init__(self, source: torch.Tensor) -> None:
        self.source, self.elements_read = source, 0

    def __getitem__(self, index: Any) -> torch.Tensor:
        parts = index if isinstance(index, tuple) else (index,)
        if not all(isinstance(part, slice) for part in parts):
            raise TypeError(f"a lazy slice takes slices, not {index!r}")
        if all(part == slice(None) for part in parts):
            raise MemoryError("reading the whole checkpoint tensor: index this rank's part only")
        part = self.source[index]
        self.elements_read += part.numel()
        return part


@contextmanager
def tp_rank(rank: int, size: int) -> Iterator[None]:
    set_tp_info(rank, size)
    try:
        yield
    finally:
        set_tp_info(0, 1)


@settings(max_examples=40)
@given(
    num_experts=st.integers(1, 3),
    projection_rows=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    cols=st.integers(1, 4),
    split_dim=st.sampled_from([0, 1]),
    tp_size=st.sampled_from([1, 2, 4]),
    wrong_shape=st.sampled_from([0, 0, 0, -1, 1]),
    data=st.data(),
)
def test_load_slice_matches_the_reference(
    num_experts, projection_rows, cols, split_dim, tp_size, wrong_shape, data
):
    """Every expert and projection, every rank of 1, 2 or 4, rows or columns split; now and
    then a checkpoint tensor one row or column off in the dimension not split (ValueError)."""
    rank = data.draw(st.integers(0, tp_size - 1), label="rank")
    shard = data.draw(st.integers(0, num_experts * len(projection_rows) - 1), label="shard")
    rows = projection_rows[shard % len(projection_rows)]
    if split_dim == 0:  # every rank's part of the rows, all the columns
        shape = (rows * tp_size, cols + wrong_shape)
    else:
        shape = (rows + wrong_shape, cols * tp_size)

    def build() -> tuple:
        weights = ExpertWeights(num_experts, projection_rows, cols, split_dim)
        weights.weight.data.fill_(-1.0)  # what no checkpoint holds
        object.__setattr__(weights, "loaded", weights.weight.data)  # public: compared after
        checkpoint = torch.arange(shape[0] * shape[1], dtype=torch.float32).view(shape)
        return weights, "weight", shard, LazySlice(checkpoint)

    with tp_rank(rank, tp_size):
        assert_same_call(ExpertWeights.load_slice, build=build)


@settings(max_examples=40)
@given(routing=routings(max_tokens=20), block_m=st.sampled_from([1, 2, 4, 16]))
def test_align_to_blocks_matches_the_reference(routing, block_m):
    expert_ids, num_experts, _ = routing
    assert_same_call(align_to_blocks, expert_ids, num_experts, block_m)


LAYOUT_STUBS = {"layers/moe.py:sort_by_expert", "kernels/fused_moe.py:align_to_blocks"}


def launch_into(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    pair_ids: torch.Tensor,
    block_expert: torch.Tensor,
    weights: torch.Tensor,
    num_pairs: int,
    n: int,
    pairs_per_a_row: int,
    gated: bool,
    weighted: bool,
    block_m: int,
) -> None:
    """grouped_gemm's launch of the module's grouped_gemm_kernel (looked up now: yours or the
    reference's), into `out`, with blocks of 8 columns and 8 of K."""
    kernel = fused_moe_module.grouped_gemm_kernel
    kernel[(block_expert.numel(), triton.cdiv(n, 8))](
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
        WEIGHTED=weighted,
        PRECISION="ieee",
        BLOCK_M=block_m,
        BLOCK_N=8,
        BLOCK_K=8,
    )


@settings(max_examples=10)
@given(
    routing=routings(max_tokens=5),
    k=st.integers(1, 20),
    n=st.integers(1, 12),
    flags=st.sampled_from([(False, False), (True, False), (False, True), (True, True)]),
    per_pair_a=st.booleans(),
    block_m=st.sampled_from([2, 4]),
    seed=st.integers(0, 2**16),
)
def test_grouped_gemm_kernel_matches_the_reference(routing, k, n, flags, per_pair_a, block_m, seed):
    """A a strided view (its rows the tokens', or per pair), K and N not multiples of the
    blocks, GATED and WEIGHTED each on or off, unused blocks (-1) in the layout: the whole
    output buffer after, with a spare row (a padding pair's) and spare columns (past N)
    that must keep their sentinel."""
    expert_ids, num_experts, top_k = routing
    gated, weighted = flags
    num_pairs = expert_ids.numel()
    a_rows = num_pairs if per_pair_a else expert_ids.shape[0]
    with use_reference_stubs(20, only=LAYOUT_STUBS):  # the layout is not this test's subject
        pair_ids, block_expert = fused_moe_module.align_to_blocks(expert_ids, num_experts, block_m)

    def build() -> tuple:
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(a_rows, k + 3, generator=gen)[:, 1 : k + 1]
        b = torch.randn(num_experts, 2 * n if gated else n, k, generator=gen)
        weights = torch.rand(num_pairs, generator=gen)
        out = torch.full((num_pairs + 1, n + 5), 7.0)
        per_a_row = 1 if per_pair_a else top_k
        return (
            a,
            b,
            out,
            pair_ids,
            block_expert,
            weights,
            num_pairs,
            n,
            per_a_row,
            gated,
            weighted,
            block_m,
        )

    assert_same_kernel(
        fused_moe_module,
        "grouped_gemm_kernel",
        launch_into,
        build,
        tolerance=Tolerance(1e-5, 1e-5),
        chapter=20,
    )
