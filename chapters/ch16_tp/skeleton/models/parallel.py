"""The sharded projections of one rank of a tensor-parallel Llama-style decoder.

Attention: the rank's query heads and the KV heads they read (`head_shard`) take their rows of
the merged QKV projection (column parallel: no communication) and the matching columns of the
output projection (row parallel: one all-reduce). The MLP alike, with a block of the
intermediate dimension: rows of gate and up, columns of down. `RankLayout` hands these, and the
vocabulary-parallel embedding and LM head, to the decoder: `init_tp_group` installs it in every
rank process (chapter 3's `use_layout`).
"""

from __future__ import annotations

from torch import nn

from minisgl.distributed.comm import min_over_ranks
from minisgl.distributed.info import DistributedInfo
from minisgl.distributed.shard import HeadShard, head_shard, split_range
from minisgl.layers.parallel import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from minisgl.models.config import ModelConfig
from minisgl.models.layout import ModelLayout


def qkv_rows(heads: HeadShard, head_dim: int) -> list[tuple[int, int]]:
    """This rank's [start, end) rows of the q, k and v projections, in that order.

    Head h owns rows [h * head_dim, (h + 1) * head_dim) of its projection: q's rows come from
    the query heads [q_start, q_end), k's and v's from the KV heads [kv_start, kv_end).
    """
    raise NotImplementedError("ch16: This rank's [start, end) rows of the q, k and v projections, in that order.")


def sharded_attention(
    config: ModelConfig, tp: DistributedInfo
) -> tuple[HeadShard, ColumnParallelLinear, RowParallelLinear]:
    """This rank's heads, its QKV projection (rows) and its output projection (columns)."""
    heads = head_shard(config.num_heads, config.num_kv_heads, tp)
    rows = qkv_rows(heads, config.head_dim)
    qkv_proj = ColumnParallelLinear(config.hidden_size, rows, config.qkv_bias)
    o_proj = RowParallelLinear(rows[0], config.hidden_size, config.o_bias)
    return heads, qkv_proj, o_proj


def sharded_mlp(
    config: ModelConfig, tp: DistributedInfo
) -> tuple[ColumnParallelLinear, RowParallelLinear]:
    """This rank's gate/up projection (its rows of each) and down projection (its columns)."""
    block = split_range(config.intermediate_size, tp.size, tp.rank)
    gate_up_proj = ColumnParallelLinear(config.hidden_size, [block, block], bias=False)
    down_proj = RowParallelLinear(block, config.hidden_size, bias=False)
    return gate_up_proj, down_proj


class RankLayout(ModelLayout):
    """One rank's slice of the model: its heads and their projections, its block of the MLP and
    of the vocabulary. `agree` gives every rank the smallest value of any."""

    def __init__(self, tp: DistributedInfo) -> None:
        self.tp = tp
        self.processes = tp.size

    def heads(self, config: ModelConfig) -> tuple[int, int]:
        heads = head_shard(config.num_heads, config.num_kv_heads, self.tp)
        return heads.num_heads, heads.num_kv_heads

    def attention_projections(self, config: ModelConfig) -> tuple[nn.Module, nn.Module]:
        _, qkv_proj, o_proj = sharded_attention(config, self.tp)
        return qkv_proj, o_proj

    def mlp_projections(self, config: ModelConfig) -> tuple[nn.Module, nn.Module]:
        return sharded_mlp(config, self.tp)

    def embedding(self, config: ModelConfig) -> nn.Module:
        return VocabParallelEmbedding(config.vocab_size, config.hidden_size, self.tp)

    def lm_head(self, config: ModelConfig, tied_to: nn.Module | None) -> nn.Module:
        return ParallelLMHead(config.vocab_size, config.hidden_size, self.tp, tied_to)  # type: ignore[arg-type]

    def agree(self, value: int) -> int:
        return min_over_ranks(value)
