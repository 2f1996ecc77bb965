"""Tensor-parallel layers: each rank holds a slice of a weight, and a collective joins the pieces.

A decoder block needs two all-reduces and no other communication (Megatron-LM's layout):

- `ColumnParallelLinear` keeps some output rows of W (for a merged matrix, some rows of each
  shard: this rank's heads of q, k and v). Its output is this rank's slice of y: no collective.
- `RowParallelLinear` keeps the matching input columns. Each rank's product is a partial sum of
  y; the all-reduce adds them up, so every rank ends with the whole y.
- `VocabParallelEmbedding` keeps a block of vocabulary rows; an id outside the block looks up
  zeros, and the all-reduce fills in every row from the rank that has it.
- `ParallelLMHead` computes the logits of its block; the all-gather concatenates the blocks.

Every rank reads only its slice of the checkpoint: `load_slice` is handed the tensor lazily (a
safetensors slice, or a tensor) and indexes out its part.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from minisgl.distributed import DistributedInfo, all_gather, all_reduce, vocab_block
from minisgl.layers.embedding import LMHead, VocabEmbedding
from minisgl.layers.linear import Linear


class Sliceable(Protocol):
    """A checkpoint tensor not read yet (safetensors' `get_slice`), or a tensor: indexing
    `[rows]` or `[:, cols]` reads that part alone."""

    def __getitem__(self, index: slice | tuple[slice, ...]) -> torch.Tensor: ...


class ColumnParallelLinear(Linear):
    """A slice of the output rows of a (merged) projection: rows [start, end) of each shard.

    `shard_rows[i]` is this rank's [start, end) in shard i of the checkpoint (q, k and v of a
    merged QKV; gate and up of a merged gate/up). The local weight stacks these slices.
    """

    def __init__(self, input_size: int, shard_rows: list[tuple[int, int]], bias: bool) -> None:
        super().__init__(input_size, [end - start for start, end in shard_rows], bias)
        self.shard_rows = list(shard_rows)

    def load_slice(self, param_name: str, shard: int | None, checkpoint: Sliceable) -> None:
        """Read this rank's rows of checkpoint shard `shard` (None: the only one) into place.

        Index the checkpoint with this shard's [start, end) rows (`self.shard_rows`), then let
        `Linear.load_shard` copy them into the shard's rows of the local weight or bias.
        """
        shard = shard or 0
        start, end = self.shard_rows[shard]
        self.load_shard(param_name, shard, checkpoint[start:end])


class RowParallelLinear(Linear):
    """Input columns [start, end) of a projection; the outputs are summed over ranks."""

    def __init__(self, input_cols: tuple[int, int], output_size: int, bias: bool) -> None:
        super().__init__(input_cols[1] - input_cols[0], [output_size], bias)
        self.input_cols = input_cols

    def load_slice(self, param_name: str, shard: int | None, checkpoint: Sliceable) -> None:
        """The weight's columns [start, end); the bias whole (it is added once, after the sum)."""
        start, end = self.input_cols
        part = checkpoint[:, start:end] if param_name == "weight" else checkpoint[:]
        self.load_shard(param_name, 0, part)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole y = x W^T + b, from x's and W's columns of this rank: sum the partials.

        Compute F.linear without the bias, `all_reduce` the result, and add the bias after
        the sum: added before, every rank would add it and y would carry it `size` times.
        """
        out = all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


def load_vocab_rows(weight: torch.Tensor, rows: tuple[int, int], checkpoint: Sliceable) -> None:
    """Copy vocabulary rows [start, end) into the top of `weight`; zero the padding below."""
    start, end = rows
    part = checkpoint[start:end]
    if part.shape[1:] != weight.shape[1:] or part.shape[0] > weight.shape[0]:
        raise ValueError(
            f"shape mismatch: rows {start}..{end} are {tuple(part.shape)}, "
            f"this rank holds {tuple(weight.shape)}"
        )
    weight[: end - start].copy_(part)
    weight[end - start :].zero_()


class VocabParallelEmbedding(VocabEmbedding):
    """Embedding rows of this rank's vocabulary block (`vocab_block`), padded to equal size."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: DistributedInfo) -> None:
        start, end, padded = vocab_block(vocab_size, tp)
        super().__init__(padded, hidden_size)
        self.vocab_start, self.vocab_end = start, end

    def load_slice(self, param_name: str, shard: int | None, checkpoint: Sliceable) -> None:
        load_vocab_rows(self.weight.data, (self.vocab_start, self.vocab_end), checkpoint)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each id's row, from whichever rank holds it: look up, zero, all-reduce.

        Ids in [vocab_start, vocab_end) look up local row id - vocab_start; the others look
        up any valid row (0) and are zeroed. `all_reduce` then sums the ranks' rows: exactly
        one rank contributed a non-zero row for each id.
        """
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(mine, input_ids - self.vocab_start, 0)
        rows = F.embedding(local_ids, self.weight).masked_fill(~mine.unsqueeze(-1), 0)
        return all_reduce(rows)


class ParallelLMHead(LMHead):
    """Logits of this rank's vocabulary block; all ranks end with the whole vocabulary's."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        tp: DistributedInfo,
        tied_to: VocabParallelEmbedding | None = None,
    ) -> None:
        start, end, padded = vocab_block(vocab_size, tp)
        super().__init__(padded, hidden_size, tied_to)
        self.vocab_size, self.vocab_start, self.vocab_end = vocab_size, start, end

    def load_slice(self, param_name: str, shard: int | None, checkpoint: Sliceable) -> None:
        load_vocab_rows(self.weight.data, (self.vocab_start, self.vocab_end), checkpoint)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab_size]: this block's, `all_gather`ed over ranks, padding cut off.

        `all_gather` concatenates along the first dimension, so the vocabulary goes to the
        front and back again. Every rank's block has the same padded width, so the gathered
        logits are [..., size * padded]; the columns past vocab_size belong to padding rows.
        """
        weight = self.tied_to.weight if self.tied_to is not None else self.weight
        blocks = all_gather(F.linear(hidden, weight).movedim(-1, 0))  # [size * padded, ...]
        return blocks.movedim(0, -1)[..., : self.vocab_size]
