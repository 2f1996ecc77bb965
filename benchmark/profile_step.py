"""Profile single engine steps on a GPU with torch.profiler: where a prefill and a decode go.

    python -m benchmark profile-step --model random-qwen3-0.6b --json results.jsonl
    python -m benchmark profile-step --decode-batches 1,64,256 --page-size 256  # decode only
    python -m benchmark profile-step --page-size 256 --max-extend-tokens 16384  # as upstream
    python -m benchmark profile-step --attention-backend hybrid   # chapter 22's hybrid backend

Queues the official workload's first requests (up to one prefill budget of prompt tokens),
runs their prefill and a few decode steps, and profiles one prefill step and one decode step
(graphs on): the device time of each kind of kernel, the number of kernels launched, and the
step's wall time. Prints the top kernels of each step, and appends a summary line per step.
With `--decode-batches`, it profiles one decode step at each of those batch sizes instead (the
workload's first requests, 64 tokens into their decode), and also reports the device's busy
span from the first kernel's start to the last one's end: the span less the kernel time is the
time between kernels, which a CUDA graph shortens but does not remove.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from minisgl.benchmark import WORKLOADS, append_result, make_workload
from minisgl.scheduler.config import SchedulerConfig

from .checkpoints import RANDOM_MODEL, resolve_model


def profiled_step(scheduler, label: str, args: argparse.Namespace) -> None:  # noqa: ANN001
    """Run one scheduler step under the profiler (the device drained before and after)."""
    json_path, top = args.json, args.top
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        scheduler.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    device_us = sum(e.device_time for e in kernels)
    span_us = max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)
    print(
        f"{label}: wall {wall * 1e3:.2f} ms, {len(kernels)} kernels, {device_us / 1e3:.2f} ms "
        f"of kernel time in a {span_us / 1e3:.2f} ms span"
    )
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name, []).append(event.device_time)
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))
    for name, times in ranked[:top]:
        print(f"  {sum(times) / 1e3:8.3f} ms {len(times):5d}x  {name[:90]}")
    if json_path:
        append_result(
            json_path,
            {
                "benchmark": "step_profile",
                "step": label,
                "attention_backend": args.attention_backend,
                "wall_s": wall,
                "kernels": len(kernels),
                "kernel_s": device_us / 1e6,
                "span_s": span_us / 1e6,
                "top": [[name[:120], len(t), sum(t) / 1e6] for name, t in ranked[:top]],
            },
        )


def host_profile(scheduler, top: int, steps: int = 1) -> None:  # noqa: ANN001
    """`steps` scheduler steps under cProfile: the host functions that take their time."""
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(steps):
        scheduler.step()
    profiler.disable()
    print(f"host profile of {steps} step(s): {(time.perf_counter() - start) * 1e3:.2f} ms")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark profile-step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=RANDOM_MODEL)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--host",
        action="store_true",
        help="also cProfile a later prefill step (with --decode-batches: 10 decode steps)",
    )
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument(
        "--max-extend-tokens",
        type=int,
        default=SchedulerConfig.max_extend_tokens,
        help="the prefill budget (the engine's default; the official workload's: 16384)",
    )
    parser.add_argument(
        "--decode-batches", help="comma-separated batch sizes: profile a decode step at each"
    )
    parser.add_argument(
        "--attention-backend", default="auto", help="the engine's backend (auto: its pick)"
    )
    args = parser.parse_args(argv)
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    model = resolve_model(args.model, torch.bfloat16)
    work = make_workload(WORKLOADS["official"], 0)
    with LLM(
        str(model),
        max_running_req=256,
        page_size=args.page_size,
        show_progress=False,
        max_seq_len=work.longest + 16,
        max_extend_tokens=args.max_extend_tokens,
        attention_backend=args.attention_backend,
    ) as llm:
        scheduler = llm.scheduler
        llm.generate(work.prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm up
        if args.decode_batches:
            for size in map(int, args.decode_batches.split(",")):
                params = SamplingParams(max_tokens=80, ignore_eos=True)
                for ids in work.prompts[:size]:
                    scheduler.add_request(ids, params)
                for _ in range(64):
                    scheduler.step()
                profiled_step(scheduler, f"decode@{size}", args)
                if args.host:
                    host_profile(scheduler, 3 * args.top, steps=10)
                while scheduler.has_work:
                    scheduler.step()
            return 0
        params = SamplingParams(max_tokens=64, ignore_eos=True)
        for ids in work.prompts:
            scheduler.add_request(ids, params)
        profiled_step(scheduler, "prefill", args)  # the first prefill budget
        if args.host:
            scheduler.step()  # a decode step of the first prefill's requests
            host_profile(scheduler, 3 * args.top)  # the second prefill budget
        while scheduler.prefill_manager.runnable:
            scheduler.step()
        for _ in range(4):
            scheduler.step()
        profiled_step(scheduler, f"decode@{len(scheduler.decode_manager.running_reqs)}", args)
    return 0
