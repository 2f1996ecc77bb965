"""Where the engine is put together: every part a chapter adds to an earlier chapter's machinery,
in one table per kind of part, in chapter order.

A row names its part's module and attribute as a string, "package.module:attribute", and the
module is imported only when the part is first needed: importing the engine imports none of
them, and no module of an earlier chapter imports one of a later chapter. Snapshot K of the
course holds chapters 0..K only; its copy of this file keeps just the rows whose module it
holds (the snapshot builder drops the others), so chapter K's engine is chapter K's table.

The order of a table is the order its parts apply in. A new chapter adds its rows here; the
modules it extends do not change.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Part:
    """One row: a part of chapter `chapter`, known by `name`, found at `target`."""

    chapter: int
    name: str
    target: str  # "package.module:attribute"
    aliases: tuple[str, ...] = ()  # other names it answers to

    def load(self) -> Any:
        """The attribute `target` names (its module is imported at the first call)."""
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


def find(table: tuple[Part, ...], name: str) -> Part | None:
    """The row of `table` known by `name` or one of its aliases; None if there is none."""
    return next((part for part in table if name == part.name or name in part.aliases), None)


class Registry(Mapping[str, Any]):
    """A table as a read-only mapping, name (or alias) -> the attribute its row names, loaded
    at the first lookup; `base` maps the names an earlier chapter's module holds itself."""

    def __init__(self, table: tuple[Part, ...], base: Mapping[str, Any] | None = None) -> None:
        self.table = table
        self.base = dict(base or {})

    def __getitem__(self, name: str) -> Any:
        if name in self.base:
            return self.base[name]
        part = find(self.table, name)
        if part is None:
            raise KeyError(name)
        return part.load()

    def __iter__(self) -> Iterator[str]:
        yield from self.base
        yield from (part.name for part in self.table)

    def __len__(self) -> int:
        return len(self.base) + len(self.table)


def first_offer(table: tuple[Part, ...], *args: Any) -> Any:
    """The first value other than None that a function of `table`, called with `args`,
    returns (None if none does): how a table of offers picks one part for the case at hand."""
    for part in table:
        offer = part.load()(*args)
        if offer is not None:
            return offer
    return None


# Model classes by config.json's architecture name (models/registry.py builds them).
MODELS: tuple[Part, ...] = (
    Part(3, "LlamaForCausalLM", "minisgl.models.llama:LlamaForCausalLM"),
    Part(3, "Qwen2ForCausalLM", "minisgl.models.llama:LlamaForCausalLM"),
    Part(3, "Qwen3ForCausalLM", "minisgl.models.llama:LlamaForCausalLM"),
    Part(20, "Qwen3MoeForCausalLM", "minisgl.models.qwen3_moe:Qwen3MoeForCausalLM"),
)

# Prefix caches by SchedulerConfig.cache_type: `(device, page_size) -> cache`.
PREFIX_CACHES: tuple[Part, ...] = (
    Part(4, "naive", "minisgl.kvcache.naive_cache:naive_prefix_cache"),
    Part(9, "radix", "minisgl.kvcache.radix_cache:RadixPrefixCache"),
)

# Attention backends by the name EngineConfig.attention_backend gives (attention/base.py's
# BackendEntry: how to build one, and whether "auto" may pick it).
ATTENTION_BACKENDS: tuple[Part, ...] = (
    Part(5, "torch", "minisgl.attention.torch_backend:TORCH_BACKEND"),
    Part(17, "flashinfer", "minisgl.attention.fi:FLASHINFER_BACKEND", aliases=("fi",)),
    Part(22, "triton", "minisgl.attention.triton:TRITON_BACKEND"),
    Part(22, "hybrid", "minisgl.attention.hybrid:HYBRID_BACKEND"),
)

# Changes to every engine (engine/engine.py's EngineExtension): `configure` hooks run before
# the model and the KV pool are built, then `finish` hooks once they are, both in this order.
ENGINE_EXTENSIONS: tuple[Part, ...] = (
    Part(16, "tensor parallelism", "minisgl.distributed.extension:TENSOR_PARALLEL"),
    Part(18, "cuda graph padding page", "minisgl.engine.graph:GRAPH_PADDING"),
    Part(19, "triton kernels", "minisgl.kernels.extension:TRITON_KERNELS"),
    Part(21, "CPU weight layout", "minisgl.engine.cpu_layout:CPU_WEIGHT_LAYOUT"),
)

# What runs the engine's forwards in place of the eager runner, built once every extension
# has finished (a runner that records the model records it as they left it): the first
# function that offers one for the engine, `(engine) -> runner or None`.
RUNNERS: tuple[Part, ...] = (Part(18, "cuda graphs", "minisgl.engine.graph:capture_decode_graphs"),)

# How the FlashInfer backend gathers each step's page lists (attention/fi.py's
# gather_page_indices unless a function here offers another for the device,
# `(device) -> function or None`).
PAGE_GATHERS: tuple[Part, ...] = (
    Part(19, "triton kernels", "minisgl.kernels.extension:kernel_page_gather"),
)

# The scheduler's table manager class (scheduler/table.py's TableManager unless a function
# here offers another for the engine, `(engine) -> class or None`).
TABLE_MANAGERS: tuple[Part, ...] = (
    Part(19, "triton kernels", "minisgl.kernels.extension:kernel_table_manager"),
)

# The scheduler's prefill manager class (scheduler/prefill.py's PrefillManager unless a
# function here offers another for the config, `(SchedulerConfig) -> class or None`).
PREFILL_MANAGERS: tuple[Part, ...] = (
    Part(23, "optimistic admission", "minisgl.scheduler.preempt:optimistic_prefill_manager"),
)

# Step policies (scheduler/scheduler.py's StepPolicy), each `(scheduler, policy so far) ->
# policy`: chapter 7's Scheduler innermost, then these in order, each around the one before.
STEP_POLICIES: tuple[Part, ...] = (
    Part(23, "mixed batches and preemption", "minisgl.scheduler.mixed:mixed_policy"),
)

# The scheduler class of an offline LLM, by how many processes share the model.
SCHEDULERS: tuple[Part, ...] = (
    Part(7, "one process", "minisgl.scheduler.scheduler:Scheduler"),
    Part(16, "several processes", "minisgl.llm.tp:TPScheduler"),
)

# Dataclasses that travel between processes besides chapter 12's messages.
MESSAGE_TYPES: tuple[Part, ...] = ()

# Functions that read more of an API request than its sampling fields (server/protocol.py).
SAMPLING_EXTENSIONS: tuple[Part, ...] = ()
