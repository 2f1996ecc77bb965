"""Offline throughput: minisgl's LLM.generate against transformers' batched generate, one run.

    python -m benchmark offline                       # both CPU workloads on SmolLM2
    python -m benchmark offline --workload uniform    # 32 prompts x 64 new tokens
    python -m benchmark offline --workload mixed      # 64 requests, lengths uniform in [16, 256]
    python -m benchmark offline --workload official --model random-qwen3-0.6b \
        --dtype bfloat16 --variants minisgl,no-graphs,no-overlap,torch-backend,transformers
    python -m benchmark offline --workload official --model random-qwen3-0.6b \
        --dtype bfloat16 --variants minisgl,triton-backend   # chapter 22's attention
    python -m benchmark offline --workload official --model random-qwen3-0.6b \
        --dtype bfloat16 --tp 2                       # tensor parallel over 2 GPUs

The official workload (for a GPU) is 256 requests with input and output lengths uniform in
[100, 1024] and random token ids, seed 0: 142,827 input and 133,966 output tokens; the engine
runs it with the settings of upstream's benchmark (`WORKLOAD_SETTINGS`).
`--model random-qwen3-0.6b` builds Qwen3-0.6B's shape with random bf16 weights from a
transformers config (no download), once, under build/. The variants are the engine as
configured by default (FlashInfer and CUDA graphs on a GPU, overlap scheduling), the engine with
one feature switched off, and transformers.

Both sides run the same model, dtype, thread count and prompts (random token ids, fixed seed),
greedy, ignoring EOS, so every request generates exactly its requested number of tokens.
transformers runs static batches of `--hf-batch-size` prompts in arrival order (left-padded),
each batch generating until its longest request is done; only the requested tokens count.
Each variant runs in a fresh process of its own (`in_own_process`), so none inherits what
another left behind. With `--repeat N` the engine's variants run in another order each round
(rotated by one place, `benchmark/order.py`; transformers always first), so that none always
runs in the same place. The workload, the timing and the accounting are minisgl.benchmark's
(chapter 21).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TypeVar
from unittest import mock

import torch

from minisgl.benchmark import (
    WORKLOADS,
    OfflineResult,
    Workload,
    append_result,
    make_workload,
    run_engine,
    run_transformers,
    speedups,
)

from .checkpoints import DEFAULT_MODEL, RANDOM_MODEL, resolve_model
from .order import rotated
from .scheduler_probes import StepClock, StepTable, decode_floor_s

# The engine's settings of each variant: everything on, then one feature off at a time.
VARIANTS: dict[str, dict[str, object]] = {
    "minisgl": {},
    "no-graphs": {"cuda_graph_max_bs": 0},
    "no-overlap": {"enable_overlap": False},
    "torch-backend": {"attention_backend": "torch"},
    "triton-backend": {"attention_backend": "triton"},  # chapter 22's kernels
    "hybrid-backend": {"attention_backend": "hybrid"},  # FlashInfer, Triton for small decodes
    "hybrid-64": {"attention_backend": "hybrid"},  # ... up to 64 rows (VARIANT_ENV)
    "hybrid-256": {"attention_backend": "hybrid"},  # ... up to 256 rows
    "torch-kernels": {},  # chapter 19's kernels off: MINISGL_KERNELS=torch (VARIANT_ENV)
    "row-major": {},  # a CPU's weights row-major: MINISGL_CPU_LAYOUT=row (VARIANT_ENV)
}
# The engine settings of upstream's official benchmark (mini-sglang 20fcd7f,
# benchmark/offline/bench.py:17-23): a prefill budget of 16,384 tokens and pages of 256 tokens.
WORKLOAD_SETTINGS: dict[str, dict[str, object]] = {
    "official": {"max_extend_tokens": 16384, "page_size": 256}
}
# Variants that flip an environment switch rather than an engine setting.
VARIANT_ENV: dict[str, dict[str, str]] = {
    "torch-kernels": {"MINISGL_KERNELS": "torch"},
    "row-major": {"MINISGL_CPU_LAYOUT": "row"},
    "hybrid-64": {"MINISGL_TRITON_DECODE_ROWS": "64"},
    "hybrid-256": {"MINISGL_TRITON_DECODE_ROWS": "256"},
}
T = TypeVar("T")


def run_variant(
    model: Path, name: str, work: Workload, dtype: torch.dtype, variant: str, tp: int
) -> OfflineResult:
    """The engine's run of one variant on workload `name`, with the workload's engine settings
    and the variant's, and its environment switches set for the run."""
    settings = WORKLOAD_SETTINGS.get(name, {}) | VARIANTS[variant] | {"tp_size": tp}
    with mock.patch.dict(os.environ, VARIANT_ENV.get(variant, {})):
        return run_engine(model, work, dtype, settings, variant)


def measure(
    model: Path,
    name: str,
    work: Workload,
    dtype: torch.dtype,
    variant: str,
    args: argparse.Namespace,
) -> tuple[OfflineResult, StepTable]:
    """One variant's run on workload `name` and, with --step-times, an engine variant's steps
    (every one of them: the ablations' steps are what tell where their time went)."""
    torch.set_num_threads(args.threads)
    clock = StepClock()
    with clock if args.step_times and variant != "transformers" else contextlib.nullcontext():
        result = (
            run_transformers(model, work, dtype, args.hf_batch_size)
            if variant == "transformers"
            else run_variant(model, name, work, dtype, variant, args.tp)
        )
    return result, clock.table()


def in_own_process(function: Callable[..., T], *args: object) -> T:
    """`function(*args)`, run in a fresh Python process, its value sent back.

    Variants measured one after the other in one process do not start equal: on an H200 the
    engine ran the official workload 2-4% slower right after transformers in the same process
    than in fresh processes on the same machine (three calls on 2026-12-02,
    benchmark/gpu_report.md). A process of its own for each variant removes what any of them
    leaves behind (memory, caches, library state). It is spawned, not forked: a fork would
    inherit this process's state, CUDA's included.
    """
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=send_value, args=(sender, function, args))
    process.start()
    sender.close()
    try:
        failed, value = receiver.recv()
    except EOFError:  # it died without a word: killed, or out of memory
        process.join()
        raise RuntimeError(f"the measuring process died (exit code {process.exitcode})") from None
    except BaseException:  # interrupted here: stop the measurement too
        process.terminate()
        raise
    process.join()
    if failed:
        raise RuntimeError(f"the measuring process failed:\n{value}")
    return value


def send_value(sender: Connection, function: Callable[..., object], args: tuple) -> None:
    """In the measuring process: send (False, function(*args)), or (True, the traceback)."""
    try:
        value = function(*args)
    except BaseException:
        sender.send((True, traceback.format_exc()))  # the caller raises with it
        sys.exit(1)
    sender.send((False, value))


def report_run(
    args: argparse.Namespace,
    name: str,
    work: Workload,
    device: str,
    result: OfflineResult,
    ratio: float | None,
    round_: int,
    position: int,
) -> None:
    """Print one variant's run of workload `name`, the `position`-th of round `round_` (and
    append it to --json)."""
    print(
        f"{name:<10}{result.variant:<15}{len(work.prompts):>9}{result.output_tokens:>11}"
        f"{result.seconds:>9.2f}{result.tokens_per_s:>10.1f}"
        + (f"{ratio:>7.2f}" if ratio is not None else ""),
        flush=True,
    )
    if args.json:
        append_result(
            args.json,
            {
                "benchmark": "offline",
                "workload": name,
                "variant": result.variant,
                "device": device,
                "tp": args.tp,
                "seconds": result.seconds,
                "output_tokens": result.output_tokens,
                "input_tokens": work.input_tokens,
                # output throughput over transformers' in this round (None without it)
                "vs_transformers": ratio,
                "round": round_,
                "position": position,  # its place in the round's order
            },
        )


def report_steps(
    args: argparse.Namespace,
    name: str,
    device: str,
    variant: str,
    steps: StepTable,
    model: Path,
) -> None:
    """Print where a run's time went by step (--step-times), and append it to --json. A
    decode bucket on a GPU of known bandwidth also gets its floor: the time its steps' bytes
    (the weights once a step, the KV tokens their attention read) take at that bandwidth."""
    dtype_bytes = getattr(torch, args.dtype).itemsize
    for phase, sizes, count, seconds, parts, kv_tokens in steps:
        floor = None
        if phase == "decode":
            floor = decode_floor_s(model, dtype_bytes, device, count, kv_tokens)
        print(
            f"    {phase:<8} batch {sizes:<8} {count:>5} steps {seconds:>8.3f} s  "
            + "  ".join(f"{k} {v:.3f}" for k, v in parts.items())
            + (f"  floor {floor:.3f} s ({floor / seconds:.0%})" if floor else "")
        )
        if args.json:
            append_result(
                args.json,
                {
                    "benchmark": "offline_steps",
                    "workload": name,
                    "variant": variant,
                    "device": device,
                    "phase": phase,
                    "batch_sizes": sizes,
                    "steps": count,
                    "seconds": seconds,
                    **{f"{k}_s": v for k, v in parts.items()},
                    "kv_tokens": kv_tokens,
                    "floor_s": floor,
                },
            )


def report_medians(
    args: argparse.Namespace,
    name: str,
    work: Workload,
    device: str,
    runs: dict[str, list[OfflineResult]],
) -> None:
    """Each variant's median run of the --repeat rounds, and its ratio to transformers' median
    run: on a shared machine one round can be a fifth faster than the next for both sides."""
    medians = {
        variant: statistics.median(r.seconds for r in results) for variant, results in runs.items()
    }
    base = medians.get("transformers")
    for variant, seconds in medians.items():
        tokens = runs[variant][0].output_tokens
        ratio = base / seconds if base is not None else None
        print(
            f"{name:<10}{'median ' + variant:<22}{args.repeat:>2} runs{seconds:>9.2f}"
            f"{tokens / seconds:>10.1f}" + (f"{ratio:>7.2f}" if ratio is not None else ""),
            flush=True,
        )
        if args.json:
            append_result(
                args.json,
                {
                    "benchmark": "offline_median",
                    "workload": name,
                    "variant": variant,
                    "device": device,
                    "tp": args.tp,
                    "runs": args.repeat,
                    "seconds": seconds,
                    "all_seconds": [r.seconds for r in runs[variant]],
                    "output_tokens": tokens,
                    # median throughput over transformers' median (None without it)
                    "vs_transformers": ratio,
                },
            )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark offline", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model", default=str(DEFAULT_MODEL), help=f"a checkpoint directory, or {RANDOM_MODEL}"
    )
    parser.add_argument(
        "--workload",
        choices=[*WORKLOADS, "cpu"],
        default="cpu",
        help="cpu = uniform and mixed",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--requests",
        type=int,
        help="run only each workload's first N requests (a quick run; the lines record it)",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--variants",
        default="minisgl,transformers",
        help=f"comma-separated: {', '.join(VARIANTS)}, transformers",
    )
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--tp", type=int, default=1, help="the engine's tensor-parallel size")
    parser.add_argument("--json", type=Path, help="also append each result as a JSON line here")
    parser.add_argument(
        "--step-times", action="store_true", help="where each engine variant's time goes, by step"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every variant this many rounds, then compare each variant's median run",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS and v != "transformers"]
    if unknown:
        parser.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}, transformers")
    model = resolve_model(args.model, dtype)
    names = ["uniform", "mixed"] if args.workload == "cpu" else [args.workload]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(
        f"model {model.name}, {args.dtype}, {device}, {args.threads} threads, tp {args.tp}, "
        f"greedy, ignore_eos, seed {args.seed}"
    )
    print(
        f"{'workload':<10}{'variant':<15}{'requests':>9}{'out tokens':>11}{'seconds':>9}"
        f"{'tok/s':>10}{'vs HF':>7}"
    )
    for name in names:
        work = make_workload(WORKLOADS[name], args.seed)
        if args.requests:
            work = work.first(args.requests)
        runs: dict[str, list[OfflineResult]] = {v: [] for v in variants}
        for round_ in range(1, args.repeat + 1):
            results: list[OfflineResult] = []
            # transformers first, so every engine row can show its ratio; the engine's variants
            # in another order each round
            engines = [v for v in variants if v != "transformers"]
            order = [v for v in variants if v == "transformers"] + rotated(engines, round_ - 1)
            for position, variant in enumerate(order, start=1):
                result, steps = in_own_process(measure, model, name, work, dtype, variant, args)
                results.append(result)
                runs[variant].append(result)
                ratio = speedups(results).get(variant)
                report_run(args, name, work, device, result, ratio, round_, position)
                report_steps(args, name, device, variant, steps, model)
        if args.repeat > 1:
            report_medians(args, name, work, device, runs)
    return 0
