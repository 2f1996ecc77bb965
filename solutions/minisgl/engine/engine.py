"""The Engine: loads a model, owns the KV pool and page table, and runs one batch at a time.

It knows nothing about scheduling. Someone else (the scheduler, or you by hand in stage 1)
decides which requests form a batch, gives their tokens KV slots in the page table and fills
the batch's inputs; the engine runs the model on it and samples one token per request.

Later chapters make the engine faster without editing this file: an `EngineExtension` of
theirs (a row of features.ENGINE_EXTENSIONS) may swap the class the KV pool is built from, or
change what the engine built (its model's layers, its sampler); a row of features.RUNNERS may
run decode batches in place of the eager runner.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch import nn

from minisgl import features
from minisgl.attention import ATTENTION_BACKENDS, AttnSetup, BaseAttnBackend, resolve_backend
from minisgl.core import Batch, Context
from minisgl.engine.config import EngineConfig
from minisgl.engine.sample import BatchSamplingArgs, Sampler
from minisgl.kvcache import MHAKVCache
from minisgl.models import ModelConfig, create_model, load_weights
from minisgl.models.layout import current_layout
from minisgl.utils import (
    ConfigError,
    InvalidRequestError,
    RequestTooLongError,
    div_ceil,
)


class ForwardOutput(NamedTuple):
    """The sampled tokens of one batch: on the device, and on their way to the host."""

    next_tokens_gpu: torch.Tensor  # [batch] on the engine's device (the CPU, without a GPU)
    next_tokens_cpu: torch.Tensor  # [batch] on the host: valid once copy_done_event completes
    copy_done_event: torch.cuda.Event | None  # None on the CPU, where there is no copy


class EagerRunner:
    """Runs the model's forward on a batch, one kernel launch at a time."""

    def __init__(self, model: nn.Module, ctx: Context, attn_backend: BaseAttnBackend) -> None:
        self.model, self.ctx, self.attn_backend = model, ctx, attn_backend

    def prepare(self, batch: Batch) -> None:
        """Compute the attention metadata of a batch whose inputs are filled in."""
        self.attn_backend.prepare_metadata(batch)

    def run(self, batch: Batch) -> torch.Tensor:
        """The logits of a prepared batch: the model's forward with the batch in the context."""
        with self.ctx.forward_batch(batch):
            return self.model()


def _unchanged(engine: Engine) -> None:
    pass


@dataclass(frozen=True)
class EngineExtension:
    """A later chapter's change to every engine: a row of features.ENGINE_EXTENSIONS names it,
    and the rows' order is the order their hooks run in."""

    # Before the model and the KV pool are built: may set engine.kv_pool_type or reserve
    # engine.spare_pages, or prepare the process (join its ranks).
    configure: Callable[[Engine], None] = _unchanged
    # Once the engine is built: may change engine.model's layers or replace engine.sampler.
    finish: Callable[[Engine], None] = _unchanged


def engine_extensions() -> list[EngineExtension]:
    """The extensions of features.ENGINE_EXTENSIONS, in its order."""
    return [part.load() for part in features.ENGINE_EXTENSIONS]


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device
        self.dtype = config.resolved_dtype
        self.page_size = config.page_size
        self.model_config = ModelConfig.from_dir(config.model_path)
        # The class of the KV pool; an extension may pick a faster one.
        self.kv_pool_type: type[MHAKVCache] = MHAKVCache
        # Pages of the pool past the scheduler's num_pages, which no request ever gets; an
        # extension may reserve some (chapter 18's CUDA graphs pad their batches into one).
        self.spare_pages = 0
        extensions = engine_extensions()
        for extension in extensions:
            extension.configure(self)
        self.num_heads, self.num_kv_heads = self._local_heads()
        self.model = create_model(self.model_config, self.device, self.dtype)
        load_weights(self.model, config.model_path, progress=config.show_progress)

        model_max = self.model_config.max_position_embeddings
        self.max_seq_len = min(config.max_seq_len or model_max, model_max)
        self.num_pages = config.num_pages or self._pages_that_fit()
        self.kv_cache = self.kv_pool_type(
            (self.num_pages + self.spare_pages) * self.page_size,
            self.model_config.num_layers,
            self.num_kv_heads,
            self.model_config.head_dim,
            self.dtype,
            self.device,
        )
        # One row per running request; entry [row, pos] is the KV slot of token `pos`. Rows
        # hold whole pages: the last page of a max_seq_len request may stick out past it.
        row_len = div_ceil(self.max_seq_len, self.page_size) * self.page_size
        self.page_table = torch.zeros(
            config.max_running_req, row_len, dtype=torch.int32, device=self.device
        )
        setup = AttnSetup(
            self.kv_cache,
            self.page_table,
            self.page_size,
            self.num_heads,
            self.num_kv_heads,
            self.model_config.head_dim,
            self.dtype,
            self.device,
        )
        self.backend_name = resolve_backend(config.attention_backend, setup)
        self.attn_backend = ATTENTION_BACKENDS[self.backend_name].create(setup)
        self.ctx = Context(self.page_size, self.kv_cache, self.page_table, self.attn_backend)
        self.sampler = Sampler(self.device, self.model_config.vocab_size, config.seed)
        for extension in extensions:
            extension.finish(self)
        # Built last: a runner that records the model (CUDA graphs) records it as finished.
        eager = EagerRunner(self.model, self.ctx, self.attn_backend)
        self.runner: EagerRunner = features.first_offer(features.RUNNERS, self) or eager

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.model_config
        return 2 * c.num_layers * self.num_kv_heads * c.head_dim * self.dtype.itemsize

    def _local_heads(self) -> tuple[int, int]:
        """(query heads, KV heads) this process computes and caches: what the model layout
        gives it (all of them, unless the model is split over several processes)."""
        layout = current_layout()
        if layout.processes != self.config.tp_size:
            raise ConfigError(
                f"tp_size={self.config.tp_size} needs one process per rank: start the engine "
                f"with LLM(..., tp_size={self.config.tp_size}) or python -m minisgl --tp "
                f"{self.config.tp_size}"
            )
        return layout.heads(self.model_config)

    def _pages_that_fit(self) -> int:
        """How many KV pages the budget holds (free GPU memory share, or kv_cache_gib on CPU),
        and at least one: a budget under a page still makes a pool (of one page), and
        `check_request_fits` then refuses each request with a clear error."""
        if self.device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(self.device)
            budget = free_bytes * self.config.gpu_memory_fraction
        else:
            budget = self.config.kv_cache_gib * 2**30
        pages = max(1, int(budget // (self.kv_bytes_per_token * self.page_size)))
        return current_layout().agree(pages)  # every process must see the same pool

    def check_request_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Raise RequestTooLongError if a request could never be served by this engine.

        Its worst case is the prompt, every output token and one page of slack for rounding
        up to whole pages: the same amount the scheduler reserves when it admits a request.
        """
        if prompt_len == 0:
            raise InvalidRequestError("the prompt is empty: give at least one token")
        needed = prompt_len + max_tokens
        if needed > self.max_seq_len:
            raise RequestTooLongError(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {needed} tokens "
                f"exceeds max_seq_len={self.max_seq_len}"
            )
        capacity = self.num_pages * self.page_size
        if needed + self.page_size > capacity:
            raise RequestTooLongError(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) + one page of slack "
                f"needs {needed + self.page_size} KV slots, but the pool has only {capacity} "
                f"({self.num_pages} pages of {self.page_size}); raise num_pages or shorten "
                "the request"
            )

    def prepare_batch(self, batch: Batch) -> None:
        """Compute the attention metadata of a batch whose inputs are filled in."""
        self.runner.prepare(batch)

    def run_model(self, batch: Batch) -> torch.Tensor:
        """The logits of a prepared batch, one row per request (the runner's forward)."""
        return self.runner.run(batch)

    @torch.inference_mode()
    def forward_batch(self, batch: Batch, sample_args: BatchSamplingArgs) -> ForwardOutput:
        """Run the model on a prepared batch and sample one token per request.

        The copy of the tokens to the host is queued right behind the sampling, and an event
        marks its end: whoever reads next_tokens_cpu waits on that event, not on the device,
        so on a GPU the CPU can prepare the next batch while this one runs. The logits come
        from self.run_model(batch) (given).
        """
        logits = self.run_model(batch)
        next_tokens = self.sampler.sample(logits, sample_args).to(torch.int32)
        if self.device.type == "cpu":
            return ForwardOutput(next_tokens, next_tokens, None)
        host = torch.empty(next_tokens.shape, dtype=next_tokens.dtype, pin_memory=True)
        host.copy_(next_tokens, non_blocking=True)
        copy_done = torch.cuda.Event()
        copy_done.record()
        return ForwardOutput(next_tokens, host, copy_done)

    def close(self) -> None:
        """Give the engine's device memory back: it cannot run batches afterwards.

        Whatever holds device memory goes (the runner with anything it recorded, the attention
        backend, the KV pool, the page table, the model). On a GPU the garbage collector then
        frees what cycles still hold and torch's caching allocator returns it to the device,
        so the next engine in this process sizes its KV pool from all of it; a CPU engine's
        pool is sized by kv_cache_gib, and a collection (a quarter of a second in a process
        with a large heap) would buy nothing.
        """
        for part in ("runner", "ctx", "attn_backend", "kv_cache", "page_table", "model"):
            if hasattr(self, part):
                delattr(self, part)
        if self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
