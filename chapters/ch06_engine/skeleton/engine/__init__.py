"""The engine: one forward of one batch, and the sampler."""

from .config import EngineConfig
from .engine import Engine, ForwardOutput
from .sample import BatchSamplingArgs, Sampler
