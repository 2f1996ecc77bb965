"""Linear layers. Several projections that read the same input are merged into one matrix.

q, k and v (and gate and up) all multiply the same hidden state, so stacking their weights
turns three small matrix multiplies into one larger one, which is faster on every device.
The checkpoint still stores them apart; `load_shard` puts each into its rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x W^T (+ b), with W stored as [sum(output_sizes), input_size].

    `output_sizes` lists the shards stacked in W, e.g. [q, k, v] for a merged QKV projection;
    a plain projection has one shard. Parameters start uninitialised: they are always loaded.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        out = sum(self.output_sizes)
        self.weight = nn.Parameter(torch.empty(out, input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W^T (+ b) for x of shape [..., input_size]."""
        return F.linear(x, self.weight, self.bias)

    def load_shard(self, param_name: str, shard: int, tensor: torch.Tensor) -> None:
        """Copy one checkpoint tensor (shard `shard` of `weight` or `bias`) into place."""
        param = getattr(self, param_name)
        start = sum(self.output_sizes[:shard])
        rows = param.data[start : start + self.output_sizes[shard]]
        if rows.shape != tensor.shape:
            raise ValueError(
                f"shape mismatch: expected {tuple(rows.shape)}, "
                f"checkpoint has {tuple(tensor.shape)}"
            )
        rows.copy_(tensor)
