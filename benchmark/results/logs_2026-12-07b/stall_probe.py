"""Do first uses of cuBLAS at new row counts stall the host until the device is idle?

    python benchmark/results/logs_2026-12-07b/stall_probe.py scenario        # as the GPU test
    SWEEP=1 python benchmark/results/logs_2026-12-07b/stall_probe.py scenario
    python benchmark/results/logs_2026-12-07b/stall_probe.py official hybrid
    SWEEP=1 python benchmark/results/logs_2026-12-07b/stall_probe.py official hybrid

`scenario` is tests/test_gpu_overlap.py's flashinfer case (a random 4-layer Qwen3 with
Qwen3-0.6B's attention shape, bf16, graphs, 12 prompts prefilled under 64 tokens a step), whose
steps 5 and 16 waited for a 100 ms spin on three machines; it prints every timed step (phase,
rows, tokens, ms). `official` runs the official workload on the backend after the benchmark's
warm-up and prints the steps over STALL_MS with the run's time, and the garbage collector's
collections of generations 1 and 2 (and any over 5 ms) with the step each ran in. With SWEEP=1, every distinct
weight of the model's projections and its LM head first multiplies inputs of 1 to 512 rows and
then every 128 rows up to the prefill budget (`sweep_gemms`), so cuBLAS has met every row count
class before the clock.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from benchmark.checkpoints import RANDOM_MODEL, resolve_model  # noqa: E402
from minisgl.benchmark import WORKLOADS, make_workload  # noqa: E402
from minisgl.benchmark.offline import greedy_params, warmup_workload  # noqa: E402

STALL_MS = 40.0
SPIN_CYCLES = 200_000_000


def sweep_gemms(model: torch.nn.Module, max_rows: int) -> float:
    """Multiply each distinct projection weight by inputs of many row counts; seconds taken."""
    start = time.perf_counter()
    weights = {}
    for name, param in model.named_parameters():
        if param.dim() == 2 and "embed" not in name or name.endswith("lm_head.weight"):
            weights[(tuple(param.shape), param.stride(), param.dtype)] = param
    embed = getattr(getattr(model, "model", model), "embed_tokens", None)
    if embed is not None:  # a tied LM head multiplies by the embedding table
        weights[("lm_head",)] = embed.weight
    rows = list(range(1, 513)) + list(range(640, max_rows + 1, 128))
    with torch.inference_mode():
        for weight in weights.values():
            for m in rows:
                F.linear(torch.zeros(m, weight.shape[1], dtype=weight.dtype, device=weight.device), weight)
    torch.cuda.synchronize()
    print(f"sweep: {len(weights)} weights x {len(rows)} row counts in {time.perf_counter() - start:.2f} s")
    return time.perf_counter() - start


def scenario() -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from minisgl.core import SamplingParams
    from minisgl.scheduler import Scheduler, SchedulerConfig

    path = Path(tempfile.mkdtemp()) / "qwen3_h128"
    config = Qwen3Config(vocab_size=49152, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
                         initializer_range=0.1)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_bytes((Path("models/tiny-qwen3") / name).read_bytes())
    scheduler = Scheduler(SchedulerConfig(
        str(path), device="cuda", dtype=torch.bfloat16, attention_backend="flashinfer",
        cuda_graph_max_bs=32, page_size=16, num_pages=512, max_running_req=32,
        max_extend_tokens=64, enable_overlap=True, show_progress=False))
    if os.environ.get("SWEEP"):
        sweep_gemms(scheduler.engine.model, 64)
    for n in (24, 40, 70, 100):
        scheduler.add_request([(3 * j + n) % 400 + 1 for j in range(n)],
                              SamplingParams(max_tokens=4, ignore_eos=True))
    while scheduler.has_work:
        scheduler.step()
    for i in range(12):
        scheduler.add_request([(7 * i + j) % 400 + 1 for j in range(40 + i)],
                              SamplingParams(max_tokens=64, ignore_eos=True))
    scheduler.step()
    torch.cuda.synchronize()
    steps = []
    for _ in range(24):
        torch.cuda._sleep(SPIN_CYCLES)
        start = time.perf_counter()
        scheduler.step()
        steps.append((*scheduler.stats.steps[-1], round((time.perf_counter() - start) * 1e3, 1)))
        torch.cuda.synchronize()
    print(f"scenario, sweep={bool(os.environ.get('SWEEP'))}: (phase, rows, tokens, ms) {steps}")


def official(backend: str) -> None:
    from minisgl.llm import LLM
    from minisgl.scheduler import Scheduler

    work = make_workload(WORKLOADS["official"], 0)
    warm = warmup_workload(work)
    model = resolve_model(RANDOM_MODEL, torch.bfloat16)
    with LLM(str(model), dtype=torch.bfloat16, max_running_req=256, show_progress=False,
             max_seq_len=work.longest + 16, page_size=256, max_extend_tokens=16384,
             attention_backend=backend) as llm:
        if os.environ.get("SWEEP"):
            sweep_gemms(llm.scheduler.engine.model, 16384)
        llm.generate(warm.prompts, greedy_params(warm))
        torch.cuda.synchronize()
        step = Scheduler.step
        steps: list[tuple] = []

        def timed_step(scheduler: Scheduler) -> list:
            start = time.perf_counter()
            try:
                return step(scheduler)
            finally:
                last = scheduler.stats.steps[-1] if scheduler.stats.steps else None
                steps.append((len(steps) + 1, last, round((time.perf_counter() - start) * 1e3, 1)))

        collections: list[tuple] = []  # (generation, ms, the step it ran in)
        gc_start = [0.0]

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                gc_start[0] = time.perf_counter()
            else:
                ms = (time.perf_counter() - gc_start[0]) * 1e3
                collections.append((info["generation"], round(ms, 1), len(steps) + 1))

        Scheduler.step = timed_step
        gc.callbacks.append(on_gc)
        try:
            start = time.perf_counter()
            llm.generate(work.prompts, greedy_params(work))
            seconds = time.perf_counter() - start
        finally:
            Scheduler.step = step
            gc.callbacks.remove(on_gc)
    slow = [s for s in steps if s[2] > STALL_MS]
    print(f"official {backend}, sweep={bool(os.environ.get('SWEEP'))}: {seconds:.2f} s, "
          f"{len(steps)} steps, over {STALL_MS} ms: {slow}")
    print("  prefill steps:", [s for s in steps if s[1] and s[1][0] == "prefill"])
    print(f"  {len(gc.get_objects())} objects tracked; collections (generation, ms, step):",
          [c for c in collections if c[0] > 0 or c[1] > 5], f"and {len(collections)} in all")


if __name__ == "__main__":
    if sys.argv[1] == "scenario":
        scenario()
    else:
        official(sys.argv[2])
