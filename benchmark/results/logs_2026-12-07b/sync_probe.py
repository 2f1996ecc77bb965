"""Which calls synchronize with the device during the official workload, per backend.

    python benchmark/results/logs_2026-12-07b/sync_probe.py flashinfer hybrid

For each backend, a fresh LLM (the official workload's settings, random Qwen3-0.6B, bf16),
warmed up as `python -m benchmark offline` does, then the timed run under torch's sync debug
mode ("warn"): each distinct (file, line, message) with its count, and the run's seconds.
"""

from __future__ import annotations

import collections
import sys
import time
import warnings

import torch

sys.path.insert(0, ".")
from benchmark.checkpoints import RANDOM_MODEL, resolve_model  # noqa: E402
from minisgl.benchmark import WORKLOADS, make_workload  # noqa: E402
from minisgl.benchmark.offline import greedy_params, warmup_workload  # noqa: E402


def probe(backend: str) -> None:
    from minisgl.llm import LLM

    work = make_workload(WORKLOADS["official"], 0)
    warm = warmup_workload(work)
    model = resolve_model(RANDOM_MODEL, torch.bfloat16)
    with LLM(
        str(model),
        dtype=torch.bfloat16,
        max_running_req=256,
        show_progress=False,
        max_seq_len=work.longest + 16,
        page_size=256,
        max_extend_tokens=16384,
        attention_backend=backend,
    ) as llm:
        llm.generate(warm.prompts, greedy_params(warm))
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            start = time.perf_counter()
            llm.generate(work.prompts, greedy_params(work))
            torch.cuda.set_sync_debug_mode("default")
            seconds = time.perf_counter() - start
    counts = collections.Counter(f"{w.filename}:{w.lineno}: {str(w.message)[:160]}" for w in caught)
    print(f"{backend}: {seconds:.2f} s under sync debug, {sum(counts.values())} syncs")
    for where, n in counts.most_common(20):
        print(f"  {n:6d}  {where}")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        probe(name)
