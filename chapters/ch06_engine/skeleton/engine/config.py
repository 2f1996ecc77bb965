"""Everything needed to build an Engine, with defaults that suit the machine it runs on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.utils import ConfigError


@dataclass
class EngineConfig:
    model_path: str
    device: str | None = None  # None: "cuda" when available, else "cpu"
    dtype: torch.dtype | None = None  # None: bfloat16 on GPU, float32 on CPU
    page_size: int = 1
    num_pages: int | None = None  # None: as many as `kv_cache_gib` (CPU) or free memory (GPU) allow
    kv_cache_gib: float = 1.0  # KV budget on the CPU, when num_pages is None
    gpu_memory_fraction: float = 0.85  # share of free GPU memory for the KV cache
    max_running_req: int = 32  # rows of the page table: requests that can run at once
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    attention_backend: str = "auto"  # "torch", "flashinfer" ("fi"), or "auto": see Engine
    cuda_graph_max_bs: int | None = None  # decode CUDA graphs up to this batch; None: auto, 0: off
    seed: int = 0  # seeds the sampler's random generator
    show_progress: bool = True  # progress bar while loading weights
    tp_size: int = 1  # tensor-parallel ranks, one process each (chapter 16)

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ConfigError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_running_req < 1:
            raise ConfigError(f"max_running_req must be >= 1, got {self.max_running_req}")
        if self.tp_size < 1:
            raise ConfigError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 0:
            raise ConfigError(f"cuda_graph_max_bs must be >= 0, got {self.cuda_graph_max_bs}")

    @property
    def resolved_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def resolved_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        return torch.bfloat16 if self.resolved_device.type == "cuda" else torch.float32
