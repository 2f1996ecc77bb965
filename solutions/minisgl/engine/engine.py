"""The Engine: loads a model, owns the KV pool and page table, and runs one batch at a time.

It knows nothing about scheduling. Someone else (the scheduler, or you by hand in stage 1)
decides which requests form a batch, gives their tokens KV slots in the page table and fills
the batch's inputs; the engine runs the model on it and samples one token per request.
"""

from __future__ import annotations

import torch

from minisgl.attention import BaseAttnBackend, TorchAttnBackend
from minisgl.core import Batch, Context
from minisgl.engine.config import EngineConfig
from minisgl.engine.sample import Sampler
from minisgl.kvcache import BaseKVCachePool, MHAKVCache
from minisgl.models import ModelConfig, create_model, load_weights
from minisgl.utils import (InvalidRequestError, RequestTooLongError, UnsupportedModelError,
                           div_ceil)

ATTENTION_BACKENDS: dict[str, type[BaseAttnBackend]] = {"torch": TorchAttnBackend}


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device
        self.dtype = config.resolved_dtype
        self.page_size = config.page_size
        self.model_config = ModelConfig.from_dir(config.model_path)
        if config.attention_backend not in ATTENTION_BACKENDS:
            raise UnsupportedModelError(
                f"attention backend {config.attention_backend!r} is not available "
                f"(choose from: {', '.join(ATTENTION_BACKENDS)})")
        self.model = create_model(self.model_config, self.device, self.dtype)
        load_weights(self.model, config.model_path, progress=config.show_progress)

        model_max = self.model_config.max_position_embeddings
        self.max_seq_len = min(config.max_seq_len or model_max, model_max)
        self.num_pages = config.num_pages or self._pages_that_fit()
        self.kv_cache: BaseKVCachePool = MHAKVCache(
            self.num_pages * self.page_size, self.model_config.num_layers,
            self.model_config.num_kv_heads, self.model_config.head_dim, self.dtype, self.device)
        # One row per running request; entry [row, pos] is the KV slot of token `pos`. Rows
        # hold whole pages: the last page of a max_seq_len request may stick out past it.
        row_len = div_ceil(self.max_seq_len, self.page_size) * self.page_size
        self.page_table = torch.zeros(config.max_running_req, row_len, dtype=torch.int32,
                                      device=self.device)
        self.attn_backend = ATTENTION_BACKENDS[config.attention_backend](self.kv_cache,
                                                                         self.page_table)
        self.ctx = Context(self.page_size, self.kv_cache, self.page_table, self.attn_backend)
        self.sampler = Sampler(self.device, self.model_config.vocab_size, config.seed)

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.model_config
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.dtype.itemsize

    def _pages_that_fit(self) -> int:
        """How many KV pages the budget holds (free GPU memory share, or kv_cache_gib on CPU)."""
        if self.device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(self.device)
            budget = free_bytes * self.config.gpu_memory_fraction
        else:
            budget = self.config.kv_cache_gib * 2**30
        return max(1, int(budget // (self.kv_bytes_per_token * self.page_size)))

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
                f"exceeds max_seq_len={self.max_seq_len}")
        capacity = self.num_pages * self.page_size
        if needed + self.page_size > capacity:
            raise RequestTooLongError(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) + one page of slack "
                f"needs {needed + self.page_size} KV slots, but the pool has only {capacity} "
                f"({self.num_pages} pages of {self.page_size}); raise num_pages or shorten "
                "the request")

    def prepare_batch(self, batch: Batch) -> None:
        """Compute the attention metadata of a batch whose inputs are filled in."""
        self.attn_backend.prepare_metadata(batch)

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> torch.Tensor:
        """Run the model on a prepared batch; return one sampled token id per request."""
        with self.ctx.forward_batch(batch):
            logits = self.model()
        return self.sampler.sample(logits, self.sampler.prepare(batch.reqs))

