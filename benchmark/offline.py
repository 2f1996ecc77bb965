"""Offline throughput: minisgl's LLM.generate against transformers' batched generate, one run.

    python benchmark/offline.py                       # both CPU workloads on SmolLM2
    python benchmark/offline.py --workload uniform    # 32 prompts x 64 new tokens
    python benchmark/offline.py --workload mixed      # 64 requests, lengths uniform in [16, 256]
    python benchmark/offline.py --workload official --model random-qwen3-0.6b \
        --dtype bfloat16 --variants minisgl,no-graphs,no-overlap,torch-backend,transformers

The official workload (for a GPU) is 256 requests with input and output lengths uniform in
[100, 1024] and random token ids, seed 0: 142,827 input and 133,966 output tokens.
`--model random-qwen3-0.6b` builds
Qwen3-0.6B's shape with random bf16 weights from a transformers config (no download), once,
under build/. The variants are the engine as configured by default (FlashInfer and CUDA graphs
on a GPU, overlap scheduling), the engine with one feature switched off, and transformers.

Both sides run the same model, dtype, thread count and prompts (random token ids, fixed seed),
greedy, ignoring EOS, so every request generates exactly its requested number of tokens.
transformers runs static batches of `--hf-batch-size` prompts in arrival order (left-padded),
each batch generating until its longest request is done; only the requested tokens count.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
RANDOM_MODEL = "random-qwen3-0.6b"
# The engine's settings of each variant: everything on, then one feature off at a time.
VARIANTS: dict[str, dict[str, object]] = {
    "minisgl": {},
    "no-graphs": {"cuda_graph_max_bs": 0},
    "no-overlap": {"enable_overlap": False},
    "torch-backend": {"attention_backend": "torch"},
}


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(name: str, seed: int) -> Workload:
    rng = random.Random(seed)
    if name == "uniform":
        n, input_range, output_range = 32, (64, 64), (64, 64)
    elif name == "mixed":
        n, input_range, output_range = 64, (16, 256), (16, 256)
    elif name == "official":
        n, input_range, output_range = 256, (100, 1024), (100, 1024)
    else:
        raise ValueError(f"unknown workload {name!r}")
    # The official workload draws ids with randint(0, 10000) like the upstream benchmarks
    # (nano-vllm's and mini-sglang's bench.py), so its token counts match theirs.
    high = 10001 if name == "official" else 10000
    prompts = [[rng.randrange(high) for _ in range(rng.randint(*input_range))] for _ in range(n)]
    outputs = [rng.randint(*output_range) for _ in range(n)]
    return Workload(name, prompts, outputs)


def release_gpu_memory() -> None:
    """Hand cached GPU memory back, so the next engine sizes its KV cache from all of it."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_random_model(path: Path, dtype: torch.dtype) -> Path:
    """Qwen3-0.6B's architecture with random weights, saved once as a checkpoint at `path`."""
    if (path / "config.json").is_file():
        return path
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
    model.save_pretrained(path)
    # Prompts are token ids; the tokenizer only turns outputs into text.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "models" / "tiny-qwen3" / name, path / name)
    return path


def run_minisgl(
    model: Path, work: Workload, dtype: torch.dtype, settings: dict[str, object]
) -> float:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    longest = max(len(p) + o for p, o in zip(work.prompts, work.output_lens))
    with LLM(
        str(model),
        dtype=dtype,
        max_running_req=len(work.prompts),
        show_progress=False,
        max_seq_len=longest + 16,
        page_size=16,
        **settings,
    ) as llm:
        params = [SamplingParams(max_tokens=o, ignore_eos=True) for o in work.output_lens]
        llm.generate(work.prompts[:2], params[:2])  # warm-up: first-call costs out of the timing
        start = time.perf_counter()
        outputs = llm.generate(work.prompts, params)
        elapsed = time.perf_counter() - start
    release_gpu_memory()
    produced = sum(len(o["token_ids"]) for o in outputs)
    assert produced == work.output_tokens, (produced, work.output_tokens)
    return elapsed


def run_transformers(model: Path, work: Workload, dtype: torch.dtype, batch_size: int) -> float:
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    pad = 0

    def generate(prompts: list[list[int]], max_new: int) -> None:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        with torch.inference_mode():
            hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=pad,
            )

    generate(work.prompts[:2], 4)  # warm-up
    start = time.perf_counter()
    for i in range(0, len(work.prompts), batch_size):
        generate(work.prompts[i : i + batch_size], max(work.output_lens[i : i + batch_size]))
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    hf = None  # drop the weights (the closure shares this variable) before the next variant
    release_gpu_memory()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=str(DEFAULT_MODEL), help=f"a checkpoint directory, or {RANDOM_MODEL}"
    )
    parser.add_argument(
        "--workload",
        choices=["uniform", "mixed", "official", "cpu"],
        default="cpu",
        help="cpu = uniform and mixed",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--variants",
        default="minisgl,transformers",
        help=f"comma-separated: {', '.join(VARIANTS)}, transformers",
    )
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--json", type=Path, help="also append each result as a JSON line here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS and v != "transformers"]
    if unknown:
        parser.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}, transformers")
    model = (
        build_random_model(ROOT / "build" / RANDOM_MODEL, dtype)
        if args.model == RANDOM_MODEL
        else Path(args.model)
    )
    names = ["uniform", "mixed"] if args.workload == "cpu" else [args.workload]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(
        f"model {model.name}, {args.dtype}, {device}, {args.threads} threads, greedy, "
        f"ignore_eos, seed {args.seed}"
    )
    print(
        f"{'workload':<10}{'variant':<15}{'requests':>9}{'out tokens':>11}{'seconds':>9}"
        f"{'tok/s':>10}{'vs HF':>7}"
    )
    for name in names:
        work = make_workload(name, args.seed)
        results: dict[str, float] = {}
        # transformers first, so every engine row can show its ratio
        for variant in sorted(variants, key=lambda v: v != "transformers"):
            seconds = (
                run_transformers(model, work, dtype, args.hf_batch_size)
                if variant == "transformers"
                else run_minisgl(model, work, dtype, VARIANTS[variant])
            )
            results[variant] = rate = work.output_tokens / seconds
            ratio = f"{rate / results['transformers']:>7.2f}" if "transformers" in results else ""
            print(
                f"{name:<10}{variant:<15}{len(work.prompts):>9}{work.output_tokens:>11}"
                f"{seconds:>9.2f}{rate:>10.1f}{ratio}",
                flush=True,
            )
            if args.json:
                with args.json.open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "workload": name,
                                "variant": variant,
                                "device": device,
                                "seconds": seconds,
                                "output_tokens": work.output_tokens,
                                "input_tokens": sum(map(len, work.prompts)),
                            }
                        )
                        + "\n"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
