"""Settings of the scheduler, on top of the engine's."""

from __future__ import annotations

from dataclasses import dataclass

from minisgl import features
from minisgl.engine import EngineConfig
from minisgl.utils import ConfigError, check_setting


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
    # Chapter 24: speculative decoding by prompt lookup. Up to this many draft tokens per step
    # (0: off), found by matching the last ngram_max down to ngram_min tokens earlier on.
    speculative_tokens: int = 0
    ngram_max: int = 3
    ngram_min: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if features.find(features.PREFIX_CACHES, self.cache_type) is None:
            names = " or ".join(repr(part.name) for part in features.PREFIX_CACHES)
            raise ConfigError(f"cache_type must be {names} here, got {self.cache_type!r}")
        if self.admission not in ("conservative", "optimistic"):
            raise ConfigError(
                f"admission must be 'conservative' or 'optimistic', got {self.admission!r}"
            )
        check_setting("max_extend_tokens", self.max_extend_tokens, int, at_least=1)
        check_setting("enable_overlap", self.enable_overlap, bool, optional=True)
        check_setting("mixed_batches", self.mixed_batches, bool)
        check_setting("speculative_tokens", self.speculative_tokens, int, at_least=0)
        check_setting("ngram_max", self.ngram_max, int, at_least=1)
        check_setting("ngram_min", self.ngram_min, int, at_least=1)
        if self.ngram_min > self.ngram_max:
            raise ConfigError(
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}"
            )
        if self.mixed_batches and self.max_extend_tokens < self.max_running_req:
            raise ConfigError(  # every running request's token must fit in a mixed step
                f"mixed_batches needs max_extend_tokens >= max_running_req, got "
                f"{self.max_extend_tokens} < {self.max_running_req}"
            )
