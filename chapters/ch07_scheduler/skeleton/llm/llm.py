"""LLM: offline batch generation in one process, no servers or sockets involved.

    with LLM("models/SmolLM2-135M-Instruct") as llm:
        outputs = llm.generate(["The capital of France is"], SamplingParams(max_tokens=16))
        print(outputs[0]["text"])

All prompts go into the scheduler's queue at once; continuous batching then runs them,
admitting new requests as others finish.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Sequence

from tqdm import tqdm

from minisgl import features
from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import ConfigError, InvalidRequestError, load_tokenizer


# The scheduler class for an engine in one process, and (chapter 16's llm/tp.py) for rank 0
# of several processes that share the model: the rows of features.SCHEDULERS.
SCHEDULER_TYPES: Mapping[str, type[Scheduler]] = features.Registry(features.SCHEDULERS)


class LLM:
    def __init__(self, model_path: str, **config: Any) -> None:
        """`config` takes any SchedulerConfig field, e.g. cache_type="naive", page_size=16.

        With tp_size=N (chapter 16) this process is rank 0 of N, each a process of its own.
        """
        scheduler_config = SchedulerConfig(model_path, **config)
        kind = "one process" if scheduler_config.tp_size == 1 else "several processes"
        if kind not in SCHEDULER_TYPES:
            raise ConfigError(
                f"tp_size={scheduler_config.tp_size} needs a scheduler of several processes "
                "(tensor parallelism), and features.SCHEDULERS has none in this tree"
            )
        self.scheduler: Scheduler = SCHEDULER_TYPES[kind](scheduler_config)
        self.tokenizer = load_tokenizer(model_path)

    def generate(
        self,
        prompts: Sequence[str] | Sequence[list[int]] | str,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: bool = False,
    ) -> list[dict[str, Any]]:
        """Generate for every prompt (a string, or a list of token ids).

        Returns one dict per prompt, in order: `text`, `token_ids` (generated ids),
        `prompt_token_ids` and `finish_reason` ("stop" at EOS, "length" at max_tokens).
        Every request is checked before any is queued: bad input raises and leaves nothing
        behind in the scheduler.
        """
        raise NotImplementedError("ch07: Generate for every prompt (a string, or a list of token ids).")

    def shutdown(self) -> None:
        """Give the engine's device memory back (weights, KV cache, anything recorded), so the
        next LLM of this process gets all of it; stop the other ranks, if any."""
        if self.scheduler is None:
            return
        scheduler, self.scheduler = self.scheduler, None  # type: ignore[assignment]
        engine = scheduler.engine
        scheduler.close()
        del scheduler  # its table rows and caches go too, before the engine frees the memory
        engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
