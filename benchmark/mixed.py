"""Chapter 23's two measurements, one run: admission on a KV-tight pool, and decode latency
while a long prompt is prefilled.

    python -m benchmark mixed                                    # SmolLM2 on the CPU
    python -m benchmark mixed --model random-qwen3-0.6b --dtype bfloat16 --workload official \
        --running 64 --output-len 256 --long-prompt 16384 --budget 2048   # a GPU

1. **tight**: the workload runs through `LLM.generate` on a KV pool of `--pool-fraction` of its
   requests' summed worst cases (prompt + max_tokens + a page each), once with conservative
   admission (chapter 8) and once with optimistic admission and preemption (chapter 23):
   output tokens per second, preemptions, and prompt tokens computed (the recompute shows
   there), and the share of requests whose tokens the two runs agree on (all, in float32).
2. **itl**: `--running` requests decode `--output-len` tokens each; after their first few
   tokens a `--long-prompt`-token prompt arrives, prefilled in chunks of `--budget` tokens.
   With mixed batches off the scheduler alternates a decode step and a chunk; with them on,
   each step carries every decode token and a chunk. The inter-token latency of the running
   requests (the gaps between the steps that gave each of them a token) is reported as p50,
   p99 and max, with the long prompt's time to first token.

Prompts are random token ids (seed 0), greedy, ignoring EOS. Each result line carries the
command, the machine and the date (`--json`).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from minisgl.benchmark import WORKLOADS, WorkloadSpec, append_result, make_workload, percentile
from minisgl.benchmark.offline import device_sync, greedy_params, release_gpu_memory, timed
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import div_ceil

from . import scheduler_probes
from .checkpoints import DEFAULT_MODEL, RANDOM_MODEL, resolve_model

# The CPU's KV-tight workload: 32 requests, prompts and outputs of 16 to 128 tokens.
TIGHT_CPU = WorkloadSpec(32, (16, 128), (16, 128))
ARRIVAL_STEP = 4  # the long prompt arrives after this many decode steps of the running ones


def admission_run(
    model: Path, dtype: torch.dtype, spec: WorkloadSpec, fraction: float, page_size: int
) -> dict[str, dict[str, Any]]:
    """The tight workload with each admission on the same pool; their figures and tokens."""
    work = make_workload(spec, 0)
    worst = sum(len(p) + o + page_size for p, o in zip(work.prompts, work.output_lens))
    largest = max(len(p) + o for p, o in zip(work.prompts, work.output_lens)) + page_size
    num_pages = max(div_ceil(int(worst * fraction), page_size), div_ceil(largest, page_size))
    params = greedy_params(work)
    runs: dict[str, dict[str, Any]] = {}
    for admission in ("conservative", "optimistic"):
        with LLM(
            str(model),
            dtype=dtype,
            admission=admission,
            num_pages=num_pages,
            page_size=page_size,
            max_running_req=len(work.prompts),
            max_seq_len=work.longest + page_size,
            show_progress=False,
        ) as llm:
            scheduler = llm.scheduler
            preemptor = scheduler_probes.preemptor(scheduler)
            outputs, seconds = timed(
                lambda: llm.generate(work.prompts, params),
                warmup=lambda: llm.generate(work.prompts[:2], params[:2]),
            )
            stats = scheduler.stats
            computed = stats.computed_prompt_tokens - sum(map(len, work.prompts[:2]))
            steps = len(stats.steps)
        release_gpu_memory()
        tokens = [o["token_ids"] for o in outputs]
        runs[admission] = {
            "admission": admission,
            "requests": len(work.prompts),
            "pool_fraction": fraction,
            "num_pages": num_pages,
            "page_size": page_size,
            "output_tokens": sum(map(len, tokens)),
            "seconds": seconds,
            "tokens_per_s": sum(map(len, tokens)) / seconds,
            "preemptions": preemptor.preemptions if preemptor else 0,
            "prompt_tokens": work.input_tokens,
            "computed_prompt_tokens": computed,
            "steps": steps,
            "tokens": tokens,
        }
    # In float32 the two runs give the same tokens; in bf16 a recomputed prompt is rounded
    # differently from the decode steps it replaces, so a random model's sequences may part.
    same = [a == b for a, b in zip(runs["conservative"]["tokens"], runs["optimistic"]["tokens"])]
    runs["optimistic"]["same_tokens_share"] = sum(same) / len(same)
    return runs


def latency_run(model: Path, dtype: torch.dtype, args: argparse.Namespace, mixed: bool) -> dict:
    """Running requests decode while a long prompt arrives; their inter-token latencies."""
    rng = random.Random(0)
    scheduler = Scheduler(
        SchedulerConfig(
            str(model),
            dtype=dtype,
            mixed_batches=mixed,
            max_extend_tokens=args.budget,
            max_running_req=args.running + 1,
            max_seq_len=args.long_prompt + args.output_len + 16,
            show_progress=False,
        )
    )
    vocab = (0, 9999)
    warm = [rng.randint(*vocab) for _ in range(args.budget)]  # first-call costs, untimed
    scheduler.add_request(warm, SamplingParams(max_tokens=4, ignore_eos=True))
    while scheduler.has_work:
        scheduler.step()
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    running = [
        scheduler.add_request([rng.randint(*vocab) for _ in range(32)], params)
        for _ in range(args.running)
    ]
    long_ids = [rng.randint(*vocab) for _ in range(args.long_prompt)]
    times: dict[int, list[float]] = {uid: [] for uid in running}
    long_uid, arrived, first = -1, 0.0, 0.0
    device_sync()
    while scheduler.has_work:
        decoded = min(len(t) for t in times.values())
        if long_uid < 0 and decoded >= ARRIVAL_STEP:
            long_uid = scheduler.add_request(long_ids, SamplingParams(max_tokens=1))
            arrived = time.perf_counter()
        outputs = scheduler.step()
        now = time.perf_counter()  # a token is out when its step returns it
        for out in outputs:
            if out.uid in times:
                times[out.uid].append(now)
            elif out.uid == long_uid:
                first = now
    gaps = [(b - a) * 1000 for t in times.values() for a, b in zip(t, t[1:])]
    scheduler.engine.close()  # its KV pool and graphs, before the next run sizes its own
    del scheduler
    release_gpu_memory()
    return {
        "mixed": mixed,
        "running": args.running,
        "output_len": args.output_len,
        "long_prompt": args.long_prompt,
        "budget": args.budget,
        "itl_p50_ms": percentile(gaps, 50),
        "itl_p99_ms": percentile(gaps, 99),
        "itl_max_ms": max(gaps),
        "long_ttft_ms": (first - arrived) * 1000,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark mixed", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model", default=str(DEFAULT_MODEL), help=f"a checkpoint directory, or {RANDOM_MODEL}"
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--parts", default="tight,itl", help="comma-separated: tight, itl")
    parser.add_argument(
        "--workload", choices=["cpu", *WORKLOADS], default="cpu", help="the tight part's"
    )
    parser.add_argument("--pool-fraction", type=float, default=0.25)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--running", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--long-prompt", type=int, default=2048)
    parser.add_argument("--budget", type=int, default=256, help="max_extend_tokens of a step")
    parser.add_argument("--json", type=Path, help="also append each result as a JSON line here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = resolve_model(args.model, dtype)
    common = {"model": model.name, "dtype": args.dtype}
    parts = args.parts.split(",")
    if "tight" in parts:
        spec = TIGHT_CPU if args.workload == "cpu" else WORKLOADS[args.workload]
        runs = admission_run(model, dtype, spec, args.pool_fraction, args.page_size)
        print(f"KV-tight: {spec.num_requests} requests, pool {args.pool_fraction} of worst cases")
        print(f"{'admission':<14}{'tok/s':>9}{'seconds':>9}{'preempt':>9}{'computed':>10}")
        for run in runs.values():
            del run["tokens"]
            print(
                f"{run['admission']:<14}{run['tokens_per_s']:>9.1f}{run['seconds']:>9.2f}"
                f"{run['preemptions']:>9}{run['computed_prompt_tokens']:>10}"
            )
            if args.json:
                append_result(
                    args.json,
                    {"benchmark": "mixed_tight", "workload": args.workload, **common, **run},
                )
        share = runs["optimistic"]["same_tokens_share"]
        print(f"requests with the same tokens in both runs: {share:.0%}")
    if "itl" in parts:
        print(
            f"\nlong prompt of {args.long_prompt} tokens during {args.running} decodes, "
            f"budget {args.budget}"
        )
        print(f"{'mixed':<8}{'ITL p50 ms':>12}{'p99 ms':>9}{'max ms':>9}{'long TTFT ms':>14}")
        for mixed in (False, True):
            result = latency_run(model, dtype, args, mixed)
            print(
                f"{'on' if mixed else 'off':<8}{result['itl_p50_ms']:>12.1f}"
                f"{result['itl_p99_ms']:>9.1f}{result['itl_max_ms']:>9.1f}"
                f"{result['long_ttft_ms']:>14.1f}"
            )
            if args.json:
                append_result(args.json, {"benchmark": "mixed_itl", **common, **result})
    return 0
