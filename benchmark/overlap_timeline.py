"""Draw what the CPU and the GPU do during a few decode steps, overlap scheduling on and off.

    python -m benchmark overlap-timeline --model random-qwen3-0.6b \
        --out docs/figures/overlap_h200.svg

Each scheduler step is profiled with torch.profiler (a `step N` range on the CPU); every GPU
kernel is attributed to the step whose CPU range launched it. With overlap on, the kernels of
step N run while the CPU is already in step N+1 (scheduling it and processing step N's
results); with it off, the CPU waits for each step's kernels before it schedules the next.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from minisgl.benchmark.offline import release_gpu_memory

from .checkpoints import RANDOM_MODEL, ROOT, resolve_model


def profile_steps(model: Path, overlap: bool, batch_size: int, steps: int, trace: Path) -> None:
    """Run `steps` steady decode steps of `batch_size` requests under the profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    rng = random.Random(0)
    with LLM(
        str(model),
        max_running_req=batch_size,
        page_size=16,
        show_progress=False,
        max_seq_len=1024,
        enable_overlap=overlap,
    ) as llm:
        scheduler = llm.scheduler
        params = SamplingParams(max_tokens=steps + 40, ignore_eos=True)
        for _ in range(batch_size):
            scheduler.add_request([rng.randrange(10000) for _ in range(512)], params)
        while scheduler.prefill_manager.runnable:
            scheduler.step()
        for _ in range(20):
            scheduler.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(steps):
                with record_function(f"step {i}"):
                    scheduler.step()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace))
        while scheduler.has_work:
            scheduler.step()
    release_gpu_memory()


Span = tuple[int, float, float]  # (step, start, end) in microseconds


def merge(spans: list[Span], gap: float = 20.0) -> list[Span]:
    """Join spans of the same step that are less than `gap` us apart (a figure, not a list
    of thousands of kernels)."""
    merged: list[Span] = []
    for step, start, end in sorted(spans, key=lambda s: s[1]):
        if merged and merged[-1][0] == step and start - merged[-1][2] < gap:
            merged[-1] = (step, merged[-1][1], max(end, merged[-1][2]))
        else:
            merged.append((step, start, end))
    return merged


def overlapped_share(steps: list[Span], kernels: list[Span]) -> float:
    """Share of GPU kernel time that runs while the CPU is already in a later step."""
    cpu_range = {step: (start, end) for step, start, end in steps}
    total = hidden = 0.0
    for step, start, end in kernels:
        total += end - start
        later = [cpu_range[n] for n in cpu_range if n > step]
        hidden += sum(max(0.0, min(end, e) - max(start, s)) for s, e in later)
    return hidden / total if total else 0.0


def step_spans(trace: Path) -> tuple[list[Span], list[Span]]:
    """(step, start us, end us) of each step's CPU range, and of each kernel it launched."""
    events = json.loads(trace.read_text())["traceEvents"]
    steps = sorted(
        (int(e["name"].split()[1]), e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("step ")
    )
    launch_time = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    kernels = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        launched = launch_time.get(e["args"].get("correlation"))
        owner = next(
            (n for n, start, end in steps if launched is not None and start <= launched <= end),
            None,
        )
        if owner is not None:
            kernels.append((owner, e["ts"], e["ts"] + e["dur"]))
    return steps, merge(kernels)


def draw(panels: list[tuple[str, list[Span], list[Span]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.2 * len(panels)), squeeze=False)
    for ax, (title, steps, kernels) in zip(axes[:, 0], panels):
        origin = steps[0][1]
        for lane, spans in ((1, steps), (0, kernels)):
            for step, start, end in spans:
                ax.broken_barh(
                    [((start - origin) / 1e3, (end - start) / 1e3)],
                    (lane - 0.35, 0.7),
                    color=colors[step % len(colors)],
                )
        for step, start, _ in steps:
            ax.text((start - origin) / 1e3, 1.45, f"step {step}", fontsize=7)
        ax.set_yticks([0, 1], ["GPU kernels", "CPU: scheduler step"])
        ax.set_ylim(-0.6, 1.8)
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_xlabel("ms (colour = the step that launched the work)")
    fig.tight_layout()
    fig.savefig(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark overlap-timeline", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=RANDOM_MODEL)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True, help="the figure (.svg)")
    args = parser.parse_args(argv)
    model = resolve_model(args.model, torch.bfloat16)
    (ROOT / "build").mkdir(exist_ok=True)
    panels = []
    for overlap in (True, False):
        trace = ROOT / "build" / f"trace_overlap_{'on' if overlap else 'off'}.json"
        profile_steps(model, overlap, args.batch_size, args.steps, trace)
        steps, kernels = step_spans(trace)
        share = overlapped_share(steps, kernels)
        print(
            f"overlap {'on' if overlap else 'off'}: {share:.0%} of GPU kernel time runs while "
            "the CPU is in a later step"
        )
        panels.append(
            (
                f"overlap {'on' if overlap else 'off'}: decode, batch {args.batch_size},"
                f" {torch.cuda.get_device_name()}; {share:.0%} of GPU time under a later "
                "CPU step",
                steps,
                kernels,
            )
        )
    args.out.with_suffix(".json").write_text(json.dumps(panels))
    draw(panels, args.out)
    print(f"wrote {args.out}")
    return 0
