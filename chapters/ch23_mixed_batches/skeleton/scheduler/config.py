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
    # Chapter 23: decode tokens and prompt chunks in one step, under max_extend_tokens.
    mixed_batches: bool = False
    # Chapter 23: "conservative" reserves each request's worst case (prompt + max_tokens) at
    # admission; "optimistic" admits while the prompt fits now, and preempts when KV runs out.
    admission: str = "conservative"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cache_type not in ("radix", "naive"):
            raise ConfigError(f"cache_type must be 'radix' or 'naive', got {self.cache_type!r}")
        if self.admission not in ("conservative", "optimistic"):
            raise ConfigError(
                f"admission must be 'conservative' or 'optimistic', got {self.admission!r}"
            )
        if self.max_extend_tokens < 1:
            raise ConfigError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
        if self.mixed_batches and self.max_extend_tokens < self.max_running_req:
            raise ConfigError(  # every running request's token must fit in a mixed step
                f"mixed_batches needs max_extend_tokens >= max_running_req, got "
                f"{self.max_extend_tokens} < {self.max_running_req}"
            )
