"""The Engine: loads a model, owns the KV pool and page table, and runs one batch at a time.

It knows nothing about scheduling. Someone else (the scheduler, or you by hand in stage 1)
decides which requests form a batch, gives their tokens KV slots in the page table and fills
the batch's inputs; the engine runs the model on it and samples one token per request.
"""

from __future__ import annotations

import gc
import importlib.util
from typing import TYPE_CHECKING, Callable, NamedTuple, cast

import torch

from minisgl.attention import BaseAttnBackend, TorchAttnBackend
from minisgl.core import Batch, Context
from minisgl.engine.config import EngineConfig
from minisgl.engine.sample import BatchSamplingArgs, Sampler
from minisgl.kvcache import BaseKVCachePool, MHAKVCache
from minisgl.models import ModelConfig, create_model, load_weights
from minisgl.utils import (
    ConfigError,
    InvalidRequestError,
    RequestTooLongError,
    UnsupportedModelError,
    div_ceil,
)

if TYPE_CHECKING:
    from minisgl.engine.graph import GraphRunner


def _flashinfer_backend(engine: Engine, wrappers: object = None) -> BaseAttnBackend:
    """FlashInfer's backend; `wrappers` replaces the flashinfer module (the CPU tests' stand-in)."""
    from minisgl.attention.fi import FlashInferBackend  # needs flashinfer: imported on demand

    return FlashInferBackend(
        engine.kv_cache,
        engine.page_table,
        engine.page_size,
        engine.num_heads,
        engine.num_kv_heads,
        engine.model_config.head_dim,
        wrappers,
    )


ATTENTION_BACKENDS: dict[str, Callable[[Engine], BaseAttnBackend]] = {
    "torch": lambda engine: TorchAttnBackend(engine.kv_cache, engine.page_table),
    "flashinfer": _flashinfer_backend,
}
FLASHINFER_HEAD_DIMS = (64, 128, 256)
MAX_GRAPH_BATCH_SIZE = 256  # default cap of cuda_graph_max_bs


def resolve_attention_backend(
    name: str, device: torch.device, dtype: torch.dtype, head_dim: int
) -> str:
    """ "auto" is FlashInfer where its kernels apply (a GPU, 16-bit floats, a head size it
    compiles for, the package installed), and torch everywhere else."""
    if name != "auto":
        return name
    usable = (
        device.type == "cuda"
        and dtype in (torch.float16, torch.bfloat16)
        and head_dim in FLASHINFER_HEAD_DIMS
        and importlib.util.find_spec("flashinfer") is not None
        and importlib.util.find_spec("minisgl.attention.fi") is not None  # chapter 17 on
    )
    return "flashinfer" if usable else "torch"


class ForwardOutput(NamedTuple):
    """The sampled tokens of one batch: on the device, and on their way to the host."""

    next_tokens_gpu: torch.Tensor  # [batch] on the engine's device (the CPU, without a GPU)
    next_tokens_cpu: torch.Tensor  # [batch] on the host: valid once copy_done_event completes
    copy_done_event: torch.cuda.Event | None  # None on the CPU, where there is no copy


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device
        self.dtype = config.resolved_dtype
        self.page_size = config.page_size
        self.model_config = ModelConfig.from_dir(config.model_path)
        self.backend_name = resolve_attention_backend(
            config.attention_backend, self.device, self.dtype, self.model_config.head_dim
        )
        if self.backend_name not in ATTENTION_BACKENDS:
            raise UnsupportedModelError(
                f"attention backend {config.attention_backend!r} is not available "
                f"(choose from: auto, {', '.join(ATTENTION_BACKENDS)})"
            )
        self.num_heads, self.num_kv_heads = self._local_heads()
        self.model = create_model(self.model_config, self.device, self.dtype)
        load_weights(self.model, config.model_path, progress=config.show_progress)

        model_max = self.model_config.max_position_embeddings
        self.max_seq_len = min(config.max_seq_len or model_max, model_max)
        self.num_pages = config.num_pages or self._pages_that_fit()
        graph_max_bs = self._graph_max_batch_size()
        # CUDA graphs pad a batch with rows that store K/V too: into one spare page, past the
        # pages the scheduler hands out.
        spare_pages = 1 if graph_max_bs else 0
        self.kv_cache: BaseKVCachePool = MHAKVCache(
            (self.num_pages + spare_pages) * self.page_size,
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
        self.attn_backend = ATTENTION_BACKENDS[self.backend_name](self)
        self.ctx = Context(self.page_size, self.kv_cache, self.page_table, self.attn_backend)
        self.sampler = Sampler(self.device, self.model_config.vocab_size, config.seed)
        self.graph_runner = self._capture_graphs(graph_max_bs) if graph_max_bs else None

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.model_config
        return 2 * c.num_layers * self.num_kv_heads * c.head_dim * self.dtype.itemsize

    def _local_heads(self) -> tuple[int, int]:
        """(query heads, KV heads) this process computes and caches: all of them, unless the
        model is split over tensor-parallel ranks (chapter 16), each with its own heads."""
        c = self.model_config
        if self.config.tp_size == 1:
            return c.num_heads, c.num_kv_heads
        from minisgl.distributed import get_tp_info, head_shard

        tp = get_tp_info()
        if tp.size != self.config.tp_size:
            raise ConfigError(
                f"tp_size={self.config.tp_size} needs one process per rank: start the engine "
                f"with LLM(..., tp_size={self.config.tp_size}) or python -m minisgl --tp "
                f"{self.config.tp_size}"
            )
        heads = head_shard(c.num_heads, c.num_kv_heads, tp)
        return heads.num_heads, heads.num_kv_heads

    def _graph_max_batch_size(self) -> int:
        """Largest decode batch replayed from a CUDA graph; 0 when graphs are off.

        Graphs need a GPU, a backend that can plan into fixed buffers (FlashInfer), and
        chapter 18's graph.py."""
        if self.device.type != "cuda" or self.backend_name != "flashinfer":
            return 0
        if importlib.util.find_spec("minisgl.engine.graph") is None:
            return 0
        wanted = self.config.cuda_graph_max_bs
        if wanted is None:
            wanted = MAX_GRAPH_BATCH_SIZE
        return min(wanted, self.config.max_running_req)

    def _capture_graphs(self, max_batch_size: int) -> GraphRunner:
        """Capture the decode graphs of chapter 18; padding rows use the spare page."""
        from minisgl.engine.graph import GraphAttnBackend, GraphRunner

        backend = cast("GraphAttnBackend", self.attn_backend)  # FlashInfer's, see above
        runner = GraphRunner(self.model, self.ctx, backend, max_batch_size, self.num_pages)
        runner.capture()
        return runner

    def drop_graphs(self) -> None:
        """Free the captured decode graphs (eager forwards from now on).

        A tensor-parallel rank calls this before it leaves its group: the graphs hold NCCL
        work captured on the group's communicator, and destroying the group under live
        graphs hung on two H200s."""
        self.graph_runner = None
        gc.collect()

    def _pages_that_fit(self) -> int:
        """How many KV pages the budget holds (free GPU memory share, or kv_cache_gib on CPU)."""
        if self.device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(self.device)
            budget = free_bytes * self.config.gpu_memory_fraction
        else:
            budget = self.config.kv_cache_gib * 2**30
        pages = max(1, int(budget // (self.kv_bytes_per_token * self.page_size)))
        if self.config.tp_size == 1:
            return pages
        from minisgl.distributed import min_over_ranks

        return min_over_ranks(pages)  # every rank's scheduler must see the same pool

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
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            self.graph_runner.prepare(batch)  # chapter 18: plan the graph's fixed buffers
        else:
            self.attn_backend.prepare_metadata(batch)

    def run_model(self, batch: Batch) -> torch.Tensor:
        """The logits of a prepared batch, one row per request: the model's forward with the
        batch active in the context, or the replay of a captured decode graph (chapter 18)."""
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        with self.ctx.forward_batch(batch):
            return self.model()

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
