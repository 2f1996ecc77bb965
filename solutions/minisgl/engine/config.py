"""Everything needed to build an Engine, with defaults that suit the machine it runs on."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.utils import check_setting


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
        """Refuse a setting of the wrong type or out of range now, naming it (ConfigError)."""
        check_setting("page_size", self.page_size, int, at_least=1)
        check_setting("num_pages", self.num_pages, int, at_least=1, optional=True)
        check_setting("kv_cache_gib", self.kv_cache_gib, float, above=0)
        check_setting("gpu_memory_fraction", self.gpu_memory_fraction, float, above=0, at_most=1)
        check_setting("max_running_req", self.max_running_req, int, at_least=1)
        check_setting("max_seq_len", self.max_seq_len, int, at_least=1, optional=True)
        check_setting("cuda_graph_max_bs", self.cuda_graph_max_bs, int, at_least=0, optional=True)
        check_setting("seed", self.seed, int)
        check_setting("show_progress", self.show_progress, bool)
        check_setting("tp_size", self.tp_size, int, at_least=1)

    @property
    def resolved_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def resolved_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return self.dtype
        return torch.bfloat16 if self.resolved_device.type == "cuda" else torch.float32
