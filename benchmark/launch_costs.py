"""What launching a kernel costs the host, for each kind of launch a prefill step makes.

    python -m benchmark launch-costs --json results.jsonl

A step that launches more work than the device can run in the same time is bound by the host:
the GPU waits for the next launch. This times, on the host alone (perf_counter, no sync inside
the loop), `--calls` launches of each kind the engine's 16-bit forward makes, on inputs small
enough that the device keeps up: a torch matmul (`F.linear`), a torch elementwise op, an
allocation, chapter 19's Triton RMSNorm, FlashInfer's prefill `run`, and a whole decoder
layer's forward; then one prefill forward of `--tokens` tokens, host time against device time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from minisgl.benchmark import append_result

from .checkpoints import RANDOM_MODEL, resolve_model
from .scheduler_probes import launch, schedule, settle


def host_us(launch: Callable[[], object], calls: int) -> float:
    """Mean host microseconds of one `launch()` (the device drained before and after)."""
    for _ in range(10):
        launch()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        launch()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def finish(scheduler, forward_input, output=None) -> None:  # noqa: ANN001
    """Run a batch scheduled by hand (unless `output` says it ran), process its results, and
    run the scheduler until it is idle, as if its own loop had scheduled the batch."""
    settle(scheduler, forward_input, output or launch(scheduler, forward_input))
    while scheduler.has_work:
        scheduler.step()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark launch-costs", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=RANDOM_MODEL)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from minisgl.core import SamplingParams
    from minisgl.kernels.fused_layers import rmsnorm
    from minisgl.scheduler import Scheduler, SchedulerConfig

    device = torch.device("cuda")
    x = torch.randn(16, 1024, dtype=torch.bfloat16, device=device)
    weight = torch.randn(4096, 1024, dtype=torch.bfloat16, device=device)
    norm_weight = torch.ones(1024, dtype=torch.bfloat16, device=device)
    costs = {
        "F.linear (16 x 1024 -> 4096)": lambda: F.linear(x, weight),
        "torch add": lambda: x + x,
        "torch.empty": lambda: torch.empty(16, 1024, dtype=torch.bfloat16, device=device),
        "Triton RMSNorm": lambda: rmsnorm(x, norm_weight, 1e-6),
    }
    model = resolve_model(args.model, torch.bfloat16)
    scheduler = Scheduler(
        SchedulerConfig(
            model_path=str(model),
            max_running_req=64,
            page_size=16,
            max_seq_len=args.tokens + 64,
            enable_overlap=False,
        )
    )
    engine = scheduler.engine
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    scheduler.add_request(list(range(16)), params)  # a 16-token prefill, for the layer timings
    forward_input = schedule(scheduler)
    batch = forward_input.batch
    layer = engine.model.model.layers[0]
    hidden = torch.randn(16, 1024, dtype=torch.bfloat16, device=device)
    with engine.ctx.forward_batch(batch):
        q = torch.randn(16, 16, 128, dtype=torch.bfloat16, device=device)
        kv = torch.randn(16, 8, 128, dtype=torch.bfloat16, device=device)
        costs["FlashInfer prefill run (16 tokens)"] = lambda: engine.attn_backend.forward(
            q, kv, kv, 0, batch
        )
        costs["decoder layer forward (16 tokens)"] = lambda: layer(hidden, None)
        results = {name: host_us(launch, args.calls) for name, launch in costs.items()}
    finish(scheduler, forward_input)
    # one prefill of args.tokens tokens, the second of its size (the first pays for new shapes):
    # host time of the launch against the device's time
    for first_id in (20_000, 40_000):  # other prompts than before: no prefix-cache hit
        scheduler.add_request(list(range(first_id, first_id + args.tokens)), params)
        forward_input = schedule(scheduler)
        torch.cuda.synchronize()
        start_event = torch.cuda.Event(enable_timing=True)
        end_event = torch.cuda.Event(enable_timing=True)
        # The device sleeps while the host launches, so the events time the kernels alone.
        torch.cuda._sleep(1_000_000_000)
        start_event.record()
        start = time.perf_counter()
        output = launch(scheduler, forward_input)
        launch_s = time.perf_counter() - start
        end_event.record()
        end_event.synchronize()
        finish(scheduler, forward_input, output)
    results[f"prefill forward of {args.tokens} tokens: host"] = launch_s * 1e6
    device_us = start_event.elapsed_time(end_event) * 1e3
    results[f"prefill forward of {args.tokens} tokens: device"] = device_us
    for name, us in results.items():
        print(f"{us:10.1f} us  {name}")
        if args.json:
            append_result(args.json, {"benchmark": "launch_cost", "launch": name, "host_us": us})
    scheduler.engine.close()
    return 0
