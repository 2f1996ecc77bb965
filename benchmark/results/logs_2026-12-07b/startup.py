"""The engine's start on the official workload's settings: seconds to build the LLM, its KV
pages, and the device memory in use, under whatever CUDA_MODULE_LOADING the process has.

    CUDA_MODULE_LOADING=EAGER python benchmark/results/logs_2026-12-07b/startup.py hybrid
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, ".")
from benchmark.checkpoints import RANDOM_MODEL, resolve_model  # noqa: E402

if __name__ == "__main__":
    from minisgl.llm import LLM

    model = resolve_model(RANDOM_MODEL, torch.bfloat16)
    start = time.perf_counter()
    torch.cuda.init()
    cuda_s = time.perf_counter() - start
    llm = LLM(str(model), dtype=torch.bfloat16, max_running_req=256, show_progress=False,
              page_size=256, max_extend_tokens=16384, attention_backend=sys.argv[1])
    seconds = time.perf_counter() - start
    free, total = torch.cuda.mem_get_info()
    print(f"CUDA_MODULE_LOADING={os.environ.get('CUDA_MODULE_LOADING', '(unset)')} "
          f"{sys.argv[1]}: CUDA up in {cuda_s:.2f} s, LLM built in {seconds:.2f} s, "
          f"{llm.scheduler.engine.num_pages} pages, {(total - free) / 2**30:.1f} GiB in use")
