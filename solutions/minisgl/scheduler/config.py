"""Settings of the scheduler, on top of the engine's."""

from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig
from minisgl.utils import ConfigError


@dataclass
class SchedulerConfig(EngineConfig):
    cache_type: str = "radix"  # "radix" shares prompt prefixes between requests; "naive" does not
    max_extend_tokens: int = 8192  # prefill token budget of one step (chunked prefill)
    enable_overlap: bool | None = None  # None: on unless MINISGL_DISABLE_OVERLAP_SCHEDULING is set

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cache_type not in ("radix", "naive"):
            raise ConfigError(f"cache_type must be 'radix' or 'naive', got {self.cache_type!r}")
        if self.max_extend_tokens < 1:
            raise ConfigError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
