"""Time a decode step at fixed batch sizes: the whole scheduler step, and the forward alone.

    python benchmark/decode_step.py --model random-qwen3-0.6b --batch-sizes 1,64,256

For each batch size, that many requests with `--context`-token prompts are prefilled; then
`--steps` decode steps are timed after a warm-up. "step" is the wall time of one scheduler
step in steady decode (schedule, prepare, launch, process the previous results: what a user
waits per token); "forward" is the device time of the model's forward alone, measured with CUDA
events around a replay of the batch's CUDA graph (graphs on) or an eager forward (graphs off).

With `--profile`, the steps of the graphs variant also run under cProfile, and the host time of
the step's parts (scheduling, input preparation, attention planning, the forward's launch,
sampling, the previous step's results) is printed per step: where the host's time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

import torch

from minisgl.benchmark import append_result
from minisgl.benchmark.offline import release_gpu_memory
from minisgl.engine import GraphRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offline import RANDOM_MODEL, resolve_model  # noqa: E402


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


StepParts = dict[str, tuple[str, str]]  # part -> (file suffix, function name)
# The parts of a scheduler step, by the function that does each: (file suffix, function name).
STEP_PARTS: StepParts = {
    "schedule the batch": ("scheduler/scheduler.py", "_schedule_next_batch"),
    "prepare inputs (table)": ("scheduler/scheduler.py", "_prepare_batch"),
    "attention plan": ("engine/engine.py", "prepare_batch"),
    "sampling args": ("engine/sample.py", "prepare"),
    "forward + sample (launch)": ("engine/engine.py", "forward_batch"),
    "previous results": ("scheduler/scheduler.py", "_process_last_data"),
    "whole step": ("scheduler/scheduler.py", "step"),
}


def profile_steps(scheduler, steps: int, parts: StepParts = STEP_PARTS) -> dict[str, float]:  # noqa: ANN001
    """Host milliseconds per step spent in each of `parts` (cumulative, under cProfile)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        scheduler.step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    per_step = {}
    for part, (suffix, name) in parts.items():
        cumulative = sum(
            entry[3]
            for (file, _, func), entry in stats.items()
            if func == name and file.endswith(suffix)
        )
        per_step[part] = cumulative / steps * 1e3
    return per_step


def time_steps(  # noqa: ANN001
    llm, batch_size: int, context: int, warmup: int, steps: int, profile: bool = False
) -> tuple[float, dict[str, float]]:
    """Mean wall time of one scheduler step in steady decode, in seconds, and (with `profile`)
    the host milliseconds per step of its parts, measured on as many further steps."""
    scheduler = llm.scheduler
    fill_decode_batch(scheduler, batch_size, context, warmup + 2 * steps + 4)
    for _ in range(warmup):
        scheduler.step()
    elapsed = mean_step_seconds(scheduler, steps)
    parts = profile_steps(scheduler, steps) if profile else {}
    while scheduler.has_work:
        scheduler.step()
    return elapsed, parts


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=RANDOM_MODEL)
    parser.add_argument("--batch-sizes", default="1,64,256")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", action="store_true", help="host time of a step's parts")
    args = parser.parse_args()
    from minisgl.llm import LLM

    model = resolve_model(args.model, torch.bfloat16)
    sizes = [int(n) for n in args.batch_sizes.split(",")]
    print(f"decode step, {model.name}, context {args.context}, {torch.cuda.get_device_name()}")
    print(f"{'variant':<12}{'batch':>6}{'step ms':>9}{'forward ms':>12}{'tok/s':>10}")
    for variant, graphs in (("graphs", None), ("no-graphs", 0)):
        with LLM(
            str(model),
            max_running_req=max(sizes),
            page_size=16,
            show_progress=False,
            max_seq_len=args.context + args.warmup + 2 * args.steps + 64,
            cuda_graph_max_bs=graphs,
        ) as llm:
            runner = llm.scheduler.engine.runner
            if isinstance(runner, GraphRunner):
                print(
                    f"  captured {len(runner.graphs)} graphs in {runner.capture_seconds:.1f} s,"
                    f" {runner.capture_bytes / 2**20:.0f} MiB"
                )
            time_steps(llm, 1, 64, 2, 2)  # first-call costs out of the timing
            for size in sizes:
                profile = args.profile and variant == "graphs"
                step, parts = time_steps(llm, size, args.context, args.warmup, args.steps, profile)
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
                            "step_s": step,
                            "forward_s": forward,
                        },
                    )
                for part, ms in parts.items():
                    print(f"    {part:<28}{ms:>8.3f} ms of host time per step (cProfile)")
                    if args.json:
                        append_result(
                            args.json,
                            {
                                "benchmark": "decode_profile",
                                "batch": size,
                                "context": args.context,
                                "part": part,
                                "host_ms_per_step": ms,
                            },
                        )
        release_gpu_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
