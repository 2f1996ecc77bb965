"""Where one CPU decode step goes: the scheduler step at a fixed batch, split into its parts.

    python -m benchmark cpu-step                      # SmolLM2, float32, batch 32, 64-token prompts
    python -m benchmark cpu-step --batch 64 --context 256 --json results.jsonl

`--batch` requests with `--context`-token prompts are prefilled; after a warm-up, `--steps`
decode steps are timed (wall time, no profiler), then as many run under cProfile, which splits
the host time of a step into its parts (exclusive: they add up to the whole step), and as many
again under torch.profiler, which splits it into the operators that ran (self time). On the
CPU every part is host time: the model's forward is computed where it is launched.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from minisgl.benchmark import append_result

from .decode_step import fill_decode_batch
from .checkpoints import DEFAULT_MODEL
from .scheduler_probes import SETTLE_FUNCTION

StepParts = dict[str, tuple[str, str]]  # part -> (file suffix, function name)
# The parts of a CPU decode step, none inside another; "the rest" is what none of them covers
# (picking the batch, the ledgers' advance, the loop itself).
CPU_STEP_PARTS: StepParts = {
    "model forward": ("engine/engine.py", "run"),
    "sampling": ("engine/sample.py", "sample"),
    "sampling args": ("engine/sample.py", "prepare"),
    "attention metadata": ("attention/torch_backend.py", "prepare_metadata"),
    "pages (allocate_paged)": ("scheduler/cache.py", "allocate_paged"),
    "step inputs (prepare_inputs)": ("scheduler/table.py", "prepare_inputs"),
    "token pool write": ("scheduler/table.py", "write_next_tokens"),
    "results, per request": SETTLE_FUNCTION,
}
WHOLE_STEP = ("scheduler/scheduler.py", "step")


def profile_steps(scheduler, steps: int, parts: StepParts) -> dict[str, float]:  # noqa: ANN001
    """Host milliseconds per step spent in each of `parts` (cumulative, under cProfile)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        scheduler.step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    return {
        part: sum(
            entry[3]
            for (file, _, func), entry in stats.items()
            if func == name and file.endswith(suffix)
        )
        / steps
        * 1e3
        for part, (suffix, name) in parts.items()
    }


def step_parts(scheduler, steps: int) -> dict[str, float]:  # noqa: ANN001
    """Milliseconds per step of each of CPU_STEP_PARTS, "the rest" and "whole step"."""
    parts = profile_steps(scheduler, steps, CPU_STEP_PARTS | {"whole step": WHOLE_STEP})
    whole = parts.pop("whole step")
    return parts | {"the rest": whole - sum(parts.values()), "whole step": whole}


def top_operators(scheduler, steps: int, top: int) -> list[tuple[str, int, float]]:  # noqa: ANN001
    """The `top` operators by self CPU time: (name, calls per step, milliseconds per step)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            scheduler.step()
    ranked = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [(e.key, e.count // steps, e.self_cpu_time_total / steps / 1e3) for e in ranked]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark cpu-step", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per request")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--top", type=int, default=10, help="operators listed")
    parser.add_argument("--json", type=Path, help="also append the figures as JSON lines here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from minisgl.llm import LLM

    steps = args.warmup + 3 * args.steps
    with LLM(
        args.model,
        device="cpu",
        dtype=torch.float32,
        max_running_req=args.batch,
        page_size=16,
        show_progress=False,
        max_seq_len=args.context + steps + 16,
    ) as llm:
        scheduler = llm.scheduler
        fill_decode_batch(scheduler, args.batch, args.context, steps + 2)
        for _ in range(args.warmup):
            scheduler.step()
        start = time.perf_counter()
        for _ in range(args.steps):
            scheduler.step()
        step_ms = (time.perf_counter() - start) / args.steps * 1e3
        parts = step_parts(scheduler, args.steps)
        operators = top_operators(scheduler, args.steps, args.top)
    print(
        f"decode step of {Path(args.model).name}, float32, {args.threads} threads, batch "
        f"{args.batch}, {args.context}-token prompts: {step_ms:.1f} ms ({args.steps} steps)"
    )
    print(f"{'part (cProfile)':<30}{'ms/step':>9}{'share':>7}")
    for part, ms in parts.items():
        print(f"{part:<30}{ms:>9.2f}{ms / parts['whole step']:>7.1%}")
    print(f"{'operator (torch.profiler)':<40}{'calls/step':>11}{'ms/step':>9}")
    for name, calls, ms in operators:
        print(f"{name[:39]:<40}{calls:>11}{ms:>9.2f}")
    if args.json:
        shape = {"batch": args.batch, "context": args.context, "threads": args.threads}
        append_result(args.json, {"benchmark": "cpu_step", **shape, "step_ms": step_ms})
        for part, ms in parts.items():
            append_result(
                args.json, {"benchmark": "cpu_step_part", **shape, "part": part, "ms": ms}
            )
        for name, calls, ms in operators:
            append_result(
                args.json,
                {"benchmark": "cpu_step_op", **shape, "op": name, "calls": calls, "ms": ms},
            )
    return 0
