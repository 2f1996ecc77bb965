"""The engine: one forward of one batch, and the sampler."""

from .config import EngineConfig
from .engine import Engine
from .sample import Sampler, SamplingArgs
