"""Offline throughput: minisgl's LLM.generate against transformers' batched generate, one run.

    python benchmark/offline.py                       # both CPU workloads on SmolLM2
    python benchmark/offline.py --workload uniform    # 32 prompts x 64 new tokens
    python benchmark/offline.py --workload mixed      # 64 requests, lengths uniform in [16, 256]
    python benchmark/offline.py --workload official   # 256 requests in [100, 1024] (for a GPU)

Both sides run the same model, dtype, thread count and prompts (random token ids, fixed seed),
greedy, ignoring EOS, so every request generates exactly its requested number of tokens.
transformers runs static batches of up to 32 prompts in arrival order (left-padded), each
batch generating until its longest request is done; only the requested tokens count as output.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
HF_BATCH_SIZE = 32


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
    prompts = [[rng.randrange(10000) for _ in range(rng.randint(*input_range))] for _ in range(n)]
    outputs = [rng.randint(*output_range) for _ in range(n)]
    return Workload(name, prompts, outputs)


def run_minisgl(model: Path, work: Workload, dtype: torch.dtype) -> float:
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    longest = max(len(p) + o for p, o in zip(work.prompts, work.output_lens))
    with LLM(str(model), dtype=dtype, max_running_req=len(work.prompts), show_progress=False,
             max_seq_len=longest + 16, page_size=16) as llm:
        params = [SamplingParams(max_tokens=o, ignore_eos=True) for o in work.output_lens]
        llm.generate(work.prompts[:2], params[:2])  # warm-up: first-call costs out of the timing
        start = time.perf_counter()
        outputs = llm.generate(work.prompts, params)
        elapsed = time.perf_counter() - start
    produced = sum(len(o["token_ids"]) for o in outputs)
    assert produced == work.output_tokens, (produced, work.output_tokens)
    return elapsed


def run_transformers(model: Path, work: Workload, dtype: torch.dtype) -> float:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
    pad = 0

    def generate(prompts: list[list[int]], max_new: int) -> None:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new,
                        min_new_tokens=max_new, do_sample=False, eos_token_id=None,
                        pad_token_id=pad)

    generate(work.prompts[:2], 4)  # warm-up
    start = time.perf_counter()
    for i in range(0, len(work.prompts), HF_BATCH_SIZE):
        generate(work.prompts[i : i + HF_BATCH_SIZE], max(work.output_lens[i : i + HF_BATCH_SIZE]))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--workload", choices=["uniform", "mixed", "official", "cpu"],
                        default="cpu", help="cpu = uniform and mixed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    names = ["uniform", "mixed"] if args.workload == "cpu" else [args.workload]
    print(f"model {args.model.name}, {args.dtype}, {args.threads} threads, greedy, ignore_eos, "
          f"seed {args.seed}")
    print(f"{'workload':<10}{'requests':>9}{'out tokens':>11}{'minisgl tok/s':>15}"
          f"{'HF tok/s':>10}{'ratio':>7}")
    for name in names:
        work = make_workload(name, args.seed)
        engine_s = run_minisgl(args.model, work, dtype)
        hf_s = run_transformers(args.model, work, dtype)
        ours, theirs = work.output_tokens / engine_s, work.output_tokens / hf_s
        print(f"{name:<10}{len(work.prompts):>9}{work.output_tokens:>11}{ours:>15.1f}"
              f"{theirs:>10.1f}{ours / theirs:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
