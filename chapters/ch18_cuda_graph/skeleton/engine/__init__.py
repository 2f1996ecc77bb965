"""The engine: one forward of one batch, and the sampler."""

from .config import EngineConfig
from .engine import EagerRunner, Engine, EngineExtension, ForwardOutput, engine_extensions
from .sample import BatchSamplingArgs, Sampler
from .graph import GraphRunner
