"""Time a decode step at fixed batch sizes: the whole scheduler step, and the forward alone.

    python -m benchmark decode-step --model random-qwen3-0.6b --batch-sizes 1,64,256

For each batch size, that many requests with `--context`-token prompts are prefilled; then
`--steps` decode steps are timed after a warm-up. "step" is the wall time of one scheduler
step in steady decode (schedule, prepare, launch, process the previous results: what a user
waits per token); "forward" is the device time of the model's forward alone, measured with CUDA
events around a replay of the batch's CUDA graph (graphs on) or an eager forward (graphs off).

With `--parts`, further steps of the graphs variant run under the step clock of offline.py, and
the time of a step's parts is printed: scheduling the batch (with its inputs and attention
plan), launching it, waiting for the previous batch's tokens, processing them. A step that
waits is bound by the device; one that hardly waits, by the host.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from minisgl.benchmark import append_result
from minisgl.benchmark.offline import release_gpu_memory
from minisgl.engine import GraphRunner

from .checkpoints import RANDOM_MODEL, resolve_model
from .scheduler_probes import StepClock


def fill_decode_batch(scheduler, batch_size: int, context: int, max_tokens: int) -> None:  # noqa: ANN001
    """Queue `batch_size` random prompts of `context` tokens and prefill them all: from here on
    every step is a decode step of the whole batch."""
    from minisgl.core import SamplingParams

    rng = random.Random(batch_size)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for _ in range(batch_size):
        scheduler.add_request([rng.randrange(10000) for _ in range(context)], params)
    while scheduler.prefill_manager.runnable:  # admit and prefill everyone
        scheduler.step()


def mean_step_seconds(scheduler, steps: int) -> float:  # noqa: ANN001
    """Mean wall time of the next `steps` scheduler steps, the device drained at both ends."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        scheduler.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def time_steps(  # noqa: ANN001
    llm, batch_size: int, context: int, warmup: int, steps: int, parts: bool = False
) -> tuple[float, dict[str, float]]:
    """Mean wall time of one scheduler step in steady decode, in seconds, and (with `parts`)
    the milliseconds per step of its parts (the step clock's: scheduling, launching, waiting
    for the device, processing results), measured on as many further steps."""
    scheduler = llm.scheduler
    fill_decode_batch(scheduler, batch_size, context, warmup + 2 * steps + 4)
    for _ in range(warmup):
        scheduler.step()
    elapsed = mean_step_seconds(scheduler, steps)
    per_step: dict[str, float] = {}
    if parts:
        with StepClock() as clock:
            for _ in range(steps):
                scheduler.step()
        summed = StepClock.summed_parts(step_parts for _, _, _, step_parts, _ in clock.steps)
        per_step = {part: seconds / steps * 1e3 for part, seconds in summed.items()}
    while scheduler.has_work:
        scheduler.step()
    return elapsed, per_step


def time_forward(llm, batch_size: int, repeats: int = 50) -> float:  # noqa: ANN001
    """Device time of one decode forward at this batch size (graph replay if captured)."""
    engine = llm.scheduler.engine
    runner = engine.runner
    if not isinstance(runner, GraphRunner) or batch_size > runner.max_batch_size:
        return float("nan")  # an eager forward needs a live batch: the step time covers it
    graph = runner.graphs[runner.graph_size(batch_size)]
    graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / repeats / 1e3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark decode-step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=RANDOM_MODEL)
    parser.add_argument("--batch-sizes", default="1,64,256")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--parts", action="store_true", help="where a step's time goes")
    parser.add_argument(
        "--attention-backend", default="auto", help="the engine's backend (auto: its pick)"
    )
    args = parser.parse_args(argv)
    from minisgl.llm import LLM

    model = resolve_model(args.model, torch.bfloat16)
    sizes = [int(n) for n in args.batch_sizes.split(",")]
    print(
        f"decode step, {model.name}, context {args.context}, attention {args.attention_backend},"
        f" {torch.cuda.get_device_name()}"
    )
    print(f"{'variant':<12}{'batch':>6}{'step ms':>9}{'forward ms':>12}{'tok/s':>10}")
    for variant, graphs in (("graphs", None), ("no-graphs", 0)):
        with LLM(
            str(model),
            max_running_req=max(sizes),
            page_size=16,
            show_progress=False,
            max_seq_len=args.context + args.warmup + 2 * args.steps + 64,
            cuda_graph_max_bs=graphs,
            attention_backend=args.attention_backend,
        ) as llm:
            runner = llm.scheduler.engine.runner
            if isinstance(runner, GraphRunner):
                print(
                    f"  captured {len(runner.graphs)} graphs in {runner.capture_seconds:.1f} s,"
                    f" {runner.capture_bytes / 2**20:.0f} MiB"
                )
            time_steps(llm, 1, 64, 2, 2)  # first-call costs out of the timing
            for size in sizes:
                with_parts = args.parts and variant == "graphs"
                step, parts = time_steps(
                    llm, size, args.context, args.warmup, args.steps, with_parts
                )
                forward = time_forward(llm, size)
                print(
                    f"{variant:<12}{size:>6}{step * 1e3:>9.3f}{forward * 1e3:>12.3f}"
                    f"{size / step:>10.0f}",
                    flush=True,
                )
                if args.json:
                    append_result(
                        args.json,
                        {
                            "benchmark": "decode_step",
                            "variant": variant,
                            "batch": size,
                            "context": args.context,
                            "attention_backend": args.attention_backend,
                            "step_s": step,
                            "forward_s": forward,
                        },
                    )
                if parts:
                    print("    ms per step: " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()))
                    if args.json:
                        append_result(
                            args.json,
                            {
                                "benchmark": "decode_step_parts",
                                "batch": size,
                                "context": args.context,
                                "attention_backend": args.attention_backend,
                                "step_ms": step * 1e3,
                                "forward_ms": forward * 1e3,
                                **{f"{part}_ms": ms for part, ms in parts.items()},
                            },
                        )
        release_gpu_memory()
    return 0
