"""Tensor parallelism on one host: the offline workload at TP=1 and TP=2, and what the
all-reduces of a decode step cost.

    NCCL_NVLS_ENABLE=0 python -m benchmark tp                     # Qwen3-8B shape, 256 requests
    NCCL_NVLS_ENABLE=0 python -m benchmark tp --requests 64 --no-graphs

The model has Qwen3-8B's shape (36 layers, hidden 4096, 32 query and 8 KV heads) with random
bf16 weights, built from a transformers Qwen3Config on the GPU and saved as safetensors in a
temporary directory, so that the engine's normal loader reads it (each rank only its slices).
The workload is the official offline one (minisgl.benchmark, chapter 21): prompts and output
lengths uniform in [100, 1024], greedy, ignoring EOS. For each TP size the script reports the
output tokens/s of the whole workload, then runs a separate decode-only batch and measures,
with the profiler on rank 0, the device time of its NCCL all-reduces and all-gathers per step.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from minisgl.benchmark import WORKLOADS, Workload, append_result, make_workload
from minisgl.benchmark.offline import (
    greedy_params,
    release_gpu_memory,
    save_random_checkpoint,
    timed,
)
from minisgl.llm import LLM

from .decode_step import fill_decode_batch, mean_step_seconds
from .checkpoints import TOKENIZER

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off; the ranks inherit it
PROFILED_BATCH = 64  # decode batch of the all-reduce measurement
PROFILED_PROMPT = 128  # its prompts' length


def build_qwen3_8b_shape(path: Path) -> Path:
    """Qwen3-8B's architecture with random bf16 weights, saved as a checkpoint at `path`."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    return save_random_checkpoint(config, path, TOKENIZER)


def collective_ms(prof: torch.profiler.profile, kind: str) -> float:
    """Device milliseconds of the NCCL kernels of `kind` ("AllReduce", "AllGather")."""
    total_us = 0.0
    for avg in prof.key_averages():
        if "nccl" in avg.key.lower() and kind.lower() in avg.key.lower():
            total_us += avg.device_time_total
    return total_us / 1e3


def decode_step_costs(llm: LLM, steps: int) -> dict[str, float]:
    """Milliseconds per decode step of a PROFILED_BATCH batch: wall time, and the device time
    of rank 0's all-reduces and all-gathers (profiled over `steps` more steps)."""
    scheduler = llm.scheduler
    fill_decode_batch(scheduler, PROFILED_BATCH, PROFILED_PROMPT, 2 * steps + 8)
    for _ in range(4):  # a few decode steps to settle
        scheduler.step()
    wall_ms = mean_step_seconds(scheduler, steps) * 1e3
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            scheduler.step()
        torch.cuda.synchronize()
    while scheduler.has_work:
        scheduler.step()
    return {
        "step_ms": wall_ms,
        "all_reduce_ms": collective_ms(prof, "AllReduce") / steps,
        "all_gather_ms": collective_ms(prof, "AllGather") / steps,
    }


def run(
    model: Path, work: Workload, tp: int, settings: dict[str, object], steps: int, progress: bool
) -> dict:
    """Throughput of the workload and the decode-step costs at tensor-parallel size `tp`."""
    params = greedy_params(work)
    with LLM(
        str(model),
        dtype=torch.bfloat16,
        tp_size=tp,
        max_running_req=max(len(work.prompts), PROFILED_BATCH),
        max_seq_len=work.longest + 16,
        page_size=16,
        show_progress=progress,
        **settings,
    ) as llm:
        _, seconds = timed(
            lambda: llm.generate(work.prompts, params),
            warmup=lambda: llm.generate(work.prompts[:2], params[:2]),
        )
        costs = decode_step_costs(llm, steps)
    release_gpu_memory()
    return {"tp": tp, "seconds": seconds, "tokens_per_s": work.output_tokens / seconds, **costs}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark tp", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tp", default="1,2", help="comma-separated tensor-parallel sizes")
    parser.add_argument("--requests", type=int, default=256, help="the workload's first N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20, help="decode steps measured")
    parser.add_argument("--no-graphs", action="store_true", help="cuda_graph_max_bs=0")
    parser.add_argument("--progress", action="store_true", help="progress bars (loading, steps)")
    parser.add_argument("--checkpoint", type=Path, help="reuse (or keep) the checkpoint here")
    parser.add_argument("--json", type=Path, help="also append each result as a JSON line here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.tp.split(",")]
    if torch.cuda.device_count() < max(sizes):
        parser.error(f"--tp {args.tp} needs {max(sizes)} GPUs, {torch.cuda.device_count()} seen")
    full = make_workload(WORKLOADS["official"], args.seed)
    work = Workload(full.prompts[: args.requests], full.output_lens[: args.requests])
    settings: dict[str, object] = {"cuda_graph_max_bs": 0} if args.no_graphs else {}

    scratch = None if args.checkpoint else Path(tempfile.mkdtemp(prefix="minisgl-qwen3-8b-"))
    model = args.checkpoint or scratch
    assert model is not None
    try:
        if not (model / "config.json").is_file():
            start = time.perf_counter()
            build_qwen3_8b_shape(model)
            print(f"built the checkpoint in {time.perf_counter() - start:.0f} s: {model}")
        print(
            f"Qwen3-8B shape, random bf16, {torch.cuda.get_device_name()}, "
            f"{len(work.prompts)} requests, {work.input_tokens} input and {work.output_tokens} "
            f"output tokens, graphs {'off' if args.no_graphs else 'on'}, "
            f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}"
        )
        print(
            f"{'tp':>3}{'seconds':>9}{'tok/s':>10}   decode batch {PROFILED_BATCH}: "
            f"{'step ms':>8}{'all-reduce ms':>15}{'all-gather ms':>15}"
        )
        for tp in sizes:
            result = run(model, work, tp, settings, args.steps, args.progress)
            print(
                f"{tp:>3}{result['seconds']:>9.1f}{result['tokens_per_s']:>10.0f}"
                f"{'':>18}{result['step_ms']:>8.2f}{result['all_reduce_ms']:>15.3f}"
                f"{result['all_gather_ms']:>15.3f}",
                flush=True,
            )
            if args.json:
                record = {"benchmark": "tp", "graphs": not args.no_graphs, **result}
                append_result(args.json, record)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0
