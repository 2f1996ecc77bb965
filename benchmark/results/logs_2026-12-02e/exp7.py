"""Call 2 of 2026-12-02 (afternoon session): small decode graphs on FlashInfer's CUDA-core
decode instead of its tensor-core one. Steady decode steps at batch 1, 4, 8 (512-token prompts,
pages of 16), whole steps and graph replays, default and with graphs of <= EXP_T rows on CUDA
cores, alternating twice."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, "benchmark")
from decode_step import time_forward, time_steps  # noqa: E402
from offline import resolve_model  # noqa: E402

from minisgl.attention import fi  # noqa: E402

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/exp7.jsonl")
SMALL = 8


def emit(record: dict) -> None:
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")


original = fi.FlashInferBackend._graph_wrapper


def cuda_core_small(self, graph_batch_size):  # noqa: ANN001, ANN202
    if graph_batch_size > SMALL or graph_batch_size in self._graph_wrappers:
        return original(self, graph_batch_size)
    indptr, indices, last_page_len = self._graph_buffers
    wrapper = self._graph_wrappers[graph_batch_size] = self.wrappers.BatchDecodeWithPagedKVCacheWrapper(
        self.workspace,
        kv_layout="NHD",
        use_cuda_graph=True,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=indptr[: graph_batch_size + 1],
        paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last_page_len[:graph_batch_size],
    )
    return wrapper


def main() -> None:
    from minisgl.llm import LLM

    model = resolve_model("random-qwen3-0.6b", torch.bfloat16)
    for round_ in range(2):
        for variant in ("tensor-cores", "cuda-cores<=8"):
            fi.FlashInferBackend._graph_wrapper = (
                original if variant == "tensor-cores" else cuda_core_small
            )
            with LLM(str(model), max_running_req=8, page_size=16, show_progress=False,
                     max_seq_len=1024) as llm:
                time_steps(llm, 1, 64, 2, 2)
                for size in (1, 4, 8):
                    step, _ = time_steps(llm, size, 512, 10, 100)
                    forward = time_forward(llm, size)
                    print(f"{variant:<14} round {round_} batch {size}: step {step * 1e3:.3f} ms,"
                          f" replay {forward * 1e3:.3f} ms", flush=True)
                    emit({"benchmark": "small_graph_decode_kernel", "variant": variant,
                          "round": round_, "batch": size, "context": 512,
                          "step_ms": step * 1e3, "forward_ms": forward * 1e3})
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
