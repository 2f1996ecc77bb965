"""Offline throughput of a Qwen3-30B-A3B-shaped MoE model (random bf16 weights) on one GPU:
minisgl (fused Triton experts) against transformers' `generate`, in one run.

    python -m benchmark moe                        # the official workload, 256 requests
    python -m benchmark moe --hf-requests 32       # transformers on the first 32 requests
    python -m benchmark moe --num-layers 24        # half the layers, if memory or disk is short
    python -m benchmark moe --layer-only           # one layer's experts: fused kernel vs torch

The model is built from a transformers `Qwen3MoeConfig` with Qwen3-30B-A3B's shape (48 layers,
hidden 2048, 128 experts of intermediate 768, top 8, renormalized) directly on the GPU with a
fixed seed, and saved once as safetensors (about 61 GB in bf16) under `--workdir`, so both
sides load a real checkpoint directory. The workload is chapter 21's official one (256
requests, input and output lengths uniform in [100, 1024], seed 0). transformers' static
batches would take far longer on all of it, so it runs only the first `--hf-requests` requests;
both throughputs are output tokens per second of their own run, and the output says so.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from minisgl.benchmark import WORKLOADS, Workload, append_result, make_workload, run_engine
from minisgl.benchmark.offline import (
    OfflineResult,
    release_gpu_memory,
    save_random_checkpoint,
    static_batch,
    static_batches,
    timed,
)

from .checkpoints import TOKENIZER

# Qwen3-30B-A3B's config.json, less what does not change the computation.
QWEN3_30B_A3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
BYTES_PER_PARAM = 2  # bf16


def checkpoint_bytes(config: object) -> int:
    """The size of the model's safetensors in bf16, from its config (before building it)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()) * BYTES_PER_PARAM


def default_workdir() -> Path:
    """Shared memory when the machine has it (the checkpoint is large for a small disk)."""
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path(tempfile.gettempdir())) / "minisgl-random-qwen3-moe"


def build_random_moe(workdir: Path, num_layers: int) -> Path:
    """Qwen3-30B-A3B's shape with random bf16 weights, saved once under `workdir`."""
    from transformers import Qwen3MoeConfig

    path = workdir / f"qwen3-30b-a3b-shape-{num_layers}-layers"
    if (path / "config.json").is_file():
        return path
    config = Qwen3MoeConfig(**(QWEN3_30B_A3B | {"num_hidden_layers": num_layers}))
    needed = checkpoint_bytes(config)
    workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(workdir).free
    if free < needed * 1.05:
        raise SystemExit(
            f"{workdir} has {free / 1e9:.0f} GB free, the checkpoint needs {needed / 1e9:.0f} GB: "
            "pass --workdir on a larger file system, or fewer --num-layers"
        )
    print(f"building {path.name} on the GPU ({needed / 1e9:.0f} GB in bf16), seed 0", flush=True)
    return save_random_checkpoint(config, path, TOKENIZER)


def run_transformers_on_gpu(model: Path, work: Workload, batch_size: int) -> OfflineResult:
    """transformers' generate in static batches, the weights loaded straight onto the GPU
    (loading them into host memory first would need the model's size again there)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, device_map="cuda")
    tokens, seconds = timed(
        partial(static_batches, hf.eval(), work, batch_size),
        warmup=partial(static_batch, hf, work.prompts[:2], 4),
    )
    del hf
    release_gpu_memory()
    return OfflineResult("transformers", seconds, tokens)


HBM_BYTES_PER_S = 4.3e12  # an H200's device-to-device copy, measured on the lent machines


def time_layer(token_counts: list[int], json_path: Path | None) -> None:
    """One Qwen3-30B-A3B layer's experts (random bf16), fused kernel against the torch path:
    median milliseconds, and the time it takes just to read the weights of the experts the
    tokens chose once (the floor of a memory-bound layer)."""
    import triton.testing

    from minisgl.kernels.fused_moe import fused_moe
    from minisgl.layers.moe import moe_forward_torch, route

    shape = QWEN3_30B_A3B
    experts, hidden, inter = (
        shape["num_experts"],
        shape["hidden_size"],
        shape["moe_intermediate_size"],
    )
    torch.manual_seed(0)
    options = dict(device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(experts, 2 * inter, hidden, **options) * 0.02
    down = torch.randn(experts, hidden, inter, **options) * 0.02
    router = torch.randn(experts, hidden, **options) * 0.02
    expert_bytes = 3 * hidden * inter * 2
    print(
        f"{'tokens':>7}{'experts':>8}{'fused ms':>10}{'torch ms':>10}{'speed-up':>9}"
        f"{'floor ms':>10}{'rel err':>9}"
    )
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, **options)
        weights, expert_ids = route(x @ router.T, shape["num_experts_per_tok"], True)
        args = (x, gate_up, down, weights, expert_ids)
        fused, reference = fused_moe(*args), moe_forward_torch(*args)
        error = ((fused.float() - reference.float()).norm() / reference.float().norm()).item()
        fused_ms = triton.testing.do_bench(lambda: fused_moe(*args), return_mode="median")
        torch_ms = triton.testing.do_bench(lambda: moe_forward_torch(*args), return_mode="median")
        touched = expert_ids.unique().numel()
        floor_ms = touched * expert_bytes / HBM_BYTES_PER_S * 1e3
        print(
            f"{tokens:>7}{touched:>8}{fused_ms:>10.3f}{torch_ms:>10.3f}"
            f"{torch_ms / fused_ms:>8.1f}x{floor_ms:>10.3f}{error:>9.1e}",
            flush=True,
        )
        if json_path:
            append_result(
                json_path,
                {
                    "benchmark": "moe-layer",
                    "model": "qwen3-30b-a3b-shape",
                    "tokens": tokens,
                    "experts_touched": touched,
                    "fused_ms": fused_ms,
                    "torch_ms": torch_ms,
                    "weight_read_floor_ms": floor_ms,
                    "relative_error": error,
                    "device": torch.cuda.get_device_name(),
                },
            )


def report(result: OfflineResult, args: argparse.Namespace) -> OfflineResult:
    """Print one variant's line (as soon as it is measured) and append it to --json."""
    print(
        f"{result.variant:<14}{len(result.tokens):>9}{result.output_tokens:>11}"
        f"{result.seconds:>9.2f}{result.tokens_per_s:>10.1f}",
        flush=True,
    )
    if args.json:
        append_result(
            args.json,
            {
                "benchmark": "moe-offline",
                "model": f"qwen3-30b-a3b-shape-{args.num_layers}-layers",
                "workload": args.workload,
                "variant": result.variant,
                "device": torch.cuda.get_device_name(),
                "requests": len(result.tokens),
                "seconds": result.seconds,
                "output_tokens": result.output_tokens,
            },
        )
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark moe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workload", choices=list(WORKLOADS), default="official")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=QWEN3_30B_A3B["num_hidden_layers"])
    parser.add_argument("--workdir", type=Path, default=default_workdir())
    parser.add_argument("--hf-requests", type=int, default=32, help="0: skip transformers")
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--layer-only", action="store_true", help="time one layer's experts")
    parser.add_argument("--json", type=Path, help="also append each result as a JSON line here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a GPU (the model alone is about 61 GB in bf16)")
    if args.layer_only:
        time_layer([1, 16, 64, 256, 1024, 8192], args.json)
        return 0
    model = build_random_moe(args.workdir, args.num_layers)
    work = make_workload(WORKLOADS[args.workload], args.seed)
    device = torch.cuda.get_device_name()
    print(
        f"Qwen3-30B-A3B shape, {args.num_layers} layers, random bf16 weights, {device}; "
        f"workload {args.workload}: {len(work.prompts)} requests, {work.input_tokens} input "
        f"and {work.output_tokens} output tokens, greedy, ignore_eos, seed {args.seed}",
        flush=True,
    )
    print(
        f"{'variant':<14}{'requests':>9}{'out tokens':>11}{'seconds':>9}{'tok/s':>10}", flush=True
    )
    results = [report(run_engine(model, work, torch.bfloat16, {}, "minisgl"), args)]
    subset = replace(
        work,
        prompts=work.prompts[: args.hf_requests],
        output_lens=work.output_lens[: args.hf_requests],
    )
    if args.hf_requests:
        results.append(report(run_transformers_on_gpu(model, subset, args.hf_batch_size), args))
    if len(results) == 2:
        engine, hf = results
        ratio = engine.tokens_per_s / hf.tokens_per_s
        print(
            f"minisgl / transformers output throughput: {ratio:.1f}x "
            f"(transformers ran the first {len(hf.tokens)} of the {len(engine.tokens)} requests)"
        )
    return 0
