"""The engine: one forward of one batch, and the sampler."""

from .config import EngineConfig
from .engine import (
    ENGINE_EXTENSIONS,
    EagerRunner,
    Engine,
    EngineExtension,
    ForwardOutput,
    register_engine_extension,
)
from .sample import BatchSamplingArgs, Sampler
from .graph import GraphRunner  # registers CUDA graphs as an engine extension
from minisgl import kernels  # registers the Triton kernels as an engine extension
from minisgl.distributed import extension  # registers tensor parallelism as an extension
from minisgl.structured import sampler  # registers constrained sampling as an engine extension
from .cpu_layout import store_weights_column_major  # registers the CPU's weight layout
