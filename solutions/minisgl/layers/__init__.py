"""Neural-network layers of the decoder, each as small as the math it computes."""

from .activation import silu_and_mul
from .attention import AttentionLayer
from .embedding import LMHead, VocabEmbedding
from .linear import Linear
from .moe import SparseMoeBlock
from .norm import RMSNorm
from .parallel import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from .rotary import RotaryEmbedding
