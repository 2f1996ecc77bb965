"""Mixture of experts: each token runs through only `top_k` of the layer's expert MLPs.

    router logits -> softmax -> top-k -> (renormalize) -> weights, expert ids
    pairs (token, slot) sorted by expert -> each expert's gated MLP on its tokens
    -> each output times its weight, summed back into its token's row

The torch path here is the readable one, used on the CPU; on a GPU the same sorted order feeds
one grouped GEMM kernel for all experts (`minisgl.kernels.fused_moe`).

Under tensor parallelism every rank holds a slice of every expert's intermediate dimension
(the rows of gate/up, the columns of down), so each rank's output is a partial sum that
`all_reduce` completes, exactly as for a dense row-parallel MLP. The router is replicated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import all_reduce, get_tp_info
from minisgl.layers.activation import silu_and_mul
from minisgl.layers.linear import Linear

if TYPE_CHECKING:
    from minisgl.layers.parallel import Sliceable


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's top_k experts and their weights: softmax, top-k, renormalize (Qwen3-MoE).

    router_logits: [tokens, experts]. Returns (weights [tokens, top_k] float32, expert ids
    [tokens, top_k] int64), best expert first. The softmax runs over ALL experts in float32;
    with `renormalize` the k kept probabilities are then divided by their own sum, so each
    token's weights add up to 1 (without it they add up to less).
    """
    raise NotImplementedError("ch20: Each token's top_k experts and their weights: softmax, top-k, renormalize (Qwen3-MoE).")


def sort_by_expert(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Order the (token, slot) pairs by expert: returns (order, tokens_per_expert).

    A pair is named by its flat index `token * top_k + slot` into `expert_ids` [tokens, top_k].
    `order` [tokens * top_k] lists the pairs of expert 0 first, then expert 1, ...; within one
    expert in token order (a stable sort). `tokens_per_expert` [num_experts] counts each
    expert's pairs (zeros included), so expert e's pairs are one contiguous run of `order`.
    """
    raise NotImplementedError("ch20: Order the (token, slot) pairs by expert: returns (order, tokens_per_expert).")


def expert_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert's gated MLP on its tokens: down(SiLU(gate x) * up x).

    x [n, hidden]; gate_up [2 * intermediate, hidden] holds gate's rows then up's;
    down [hidden, intermediate]. The same computation as the dense LlamaMLP.
    """
    raise NotImplementedError("ch20: One expert's gated MLP on its tokens: down(SiLU(gate x) * up x).")


def scatter_back(
    expert_out: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Sum each pair's expert output, times its routing weight, into its token's row.

    expert_out [pairs, hidden] is in sorted order: row i belongs to pair `order[i]`, i.e. to
    token `order[i] // top_k` with weight `weights.flatten()[order[i]]`. Returns
    [num_tokens, hidden] in expert_out's dtype.
    """
    raise NotImplementedError("ch20: Sum each pair's expert output, times its routing weight, into its token's row.")


def moe_forward_torch(
    hidden: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
) -> torch.Tensor:
    """Dispatch: sort the pairs by expert, run each expert on its tokens, scatter back.

    hidden [tokens, hidden]; gate_up [experts, 2 * intermediate, hidden]; down [experts,
    hidden, intermediate]; weights and expert_ids [tokens, top_k] from `route`. Use
    `sort_by_expert`, `expert_mlp` on each expert's contiguous run of tokens (skip experts
    with none) and `scatter_back`.
    """
    raise NotImplementedError("ch20: Dispatch: sort the pairs by expert, run each expert on its tokens, scatter back.")


class ExpertWeights(nn.Module):
    """One weight matrix per expert, stacked: `weight[e]` is expert e's [rows, cols] matrix.

    It loads like a merged `Linear`: `output_sizes` has one entry per checkpoint tensor
    (expert e's projection j is shard `e * len(projection_rows) + j`), and `load_slice` reads
    one of them into its rows, only this rank's slice of dimension `split_dim`.
    """

    def __init__(
        self, num_experts: int, projection_rows: list[int], cols: int, split_dim: int
    ) -> None:
        super().__init__()
        self.projection_rows = projection_rows
        self.output_sizes = projection_rows * num_experts
        self.split_dim = split_dim  # 0: each rank keeps some rows; 1: some columns
        shape = (num_experts, sum(projection_rows), cols)
        self.weight = nn.Parameter(torch.empty(shape), requires_grad=False)

    def load_slice(self, param_name: str, shard: int | None, checkpoint: Sliceable) -> None:
        """Read this rank's slice of one expert's checkpoint tensor into that expert's rows.

        `shard` names the expert and projection (see the class). Rank r of n keeps part r of n
        of the checkpoint tensor along `split_dim` (rows of gate and up, columns of down), as
        many as the target holds; index `checkpoint` with slices, which reads only that part
        of a safetensors file. A tensor of the wrong shape raises ValueError.
        """
        raise NotImplementedError("ch20: Read this rank's slice of one expert's checkpoint tensor into that expert's rows.")


class SparseMoeBlock(nn.Module):
    """The MoE replacement of a decoder layer's MLP: a router and `num_experts` gated MLPs.

    Module names follow the checkpoints (`mlp.gate`, `mlp.experts`); the experts' weights are
    stacked as transformers holds them in memory: gate_up [E, 2I, H], down [E, H, I].
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        renormalize: bool,
    ) -> None:
        super().__init__()
        tp = get_tp_info()
        if intermediate_size % tp.size:
            raise ValueError(
                f"the experts' intermediate size {intermediate_size} does not split "
                f"over {tp.size} ranks"
            )
        local = intermediate_size // tp.size
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = Linear(hidden_size, [num_experts])  # the router, on every rank
        self.experts = nn.ModuleDict(
            {
                "gate_up_proj": ExpertWeights(num_experts, [local, local], hidden_size, 0),
                "down_proj": ExpertWeights(num_experts, [hidden_size], local, 1),
            }
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Route each token, run its experts (fused kernel on CUDA), all-reduce over ranks."""
        weights, expert_ids = route(self.gate(hidden), self.top_k, self.renormalize)
        gate_up, down = self.experts["gate_up_proj"].weight, self.experts["down_proj"].weight
        if hidden.is_cuda:
            from minisgl.kernels.fused_moe import fused_moe  # Triton: imported on demand

            out = fused_moe(hidden, gate_up, down, weights, expert_ids)
        else:
            out = moe_forward_torch(hidden, gate_up, down, weights, expert_ids)
        return all_reduce(out)
