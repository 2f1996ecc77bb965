"""Speculative decoding by prompt lookup (chapter 24): acceptance and output tokens per second
with drafts off and on, on a copy workload and a random one, at a batch of 1 and of 16.

    python -m benchmark speculative                                      # SmolLM2 on the CPU
    python -m benchmark speculative --model random-qwen3-0.6b --dtype bfloat16 --json FILE  # GPU

- **copy**: chat prompts that ask the model to repeat or correct a given passage, greedy, up to
  `--output-len` tokens or EOS. The answer quotes the prompt, so its n-grams are found there.
- **random**: prompts of random token ids (seed 0), greedy, ignoring EOS: what a draft is worth
  when the text does not repeat (a random model's output repeats whatever it happens to).

For each k of `--ks` (0: plain decoding) one engine serves every workload and batch size; the
same prompts run at each k, and every run's tokens are compared with k = 0's (greedy decoding
gives the same tokens with or without drafts; in bfloat16 a verify step's extend rounds
differently from plain decode steps, so a long sequence may part). Acceptance is accepted
drafts / drafted tokens; tokens per step is what a request gets from one decode step on
average: the output tokens but each request's first (from prefill) over the request-steps;
about 1 when plain (with overlap, a request that stops at EOS costs one request-step more).
Each result line carries the command, the machine and the date (`--json`).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from minisgl.benchmark import append_result, percentile
from minisgl.benchmark.offline import release_gpu_memory, timed
from minisgl.core import SamplingParams
from minisgl.llm import LLM

from .checkpoints import DEFAULT_MODEL, RANDOM_MODEL, resolve_model
from .scheduler_probes import speculative_stats
from .structured import chat_prompt

PASSAGES = [
    "The river rises in the hills above the town and runs east for forty miles before it meets "
    "the sea. In spring the water is high and brown; by late summer it is low enough to cross "
    "on foot at the old ford below the mill.",
    "To install the tool, download the archive, unpack it into a folder of your choice, and add "
    "that folder to your PATH. Then open a new terminal and run the command with --version to "
    "check that it works.",
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
    "    return total / len(values)\n",
    "Our meeting is moved from Tuesday to Thursday at ten o'clock, in the small room on the "
    "second floor. Please bring the budget figures for the third quarter and your notes on the "
    "new schedule.",
]
TASKS = [
    "Repeat the following text exactly, word for word:\n\n{}",
    "Copy the following text, but write every number in digits:\n\n{}",
    "Rewrite the following text with a title on its first line, keeping every sentence:\n\n{}",
    "Correct any mistakes in the following text and write it out in full:\n\n{}",
]


def copy_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """`count` copy/edit requests: every task with every passage, in turn, as token ids."""
    pairs = [(task, passage) for task in TASKS for passage in PASSAGES]
    texts = [chat_prompt(tokenizer, t.format(p)) for t, p in (pairs * count)[:count]]
    return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]


def random_prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def run_one(
    llm: LLM, prompts: list[list[int]], params: SamplingParams
) -> tuple[list[list[int]], float, dict[str, int]]:
    """Generate (timed, after a warm-up on the first prompt); tokens, seconds and counters of
    the timed run: its decode steps, drafted and accepted tokens."""
    scheduler = llm.scheduler
    spec = speculative_stats(scheduler)
    llm.generate(prompts[:1], params)  # first-call costs (kernels, graphs), untimed
    steps, drafted, accepted = len(scheduler.stats.steps), 0, 0
    if spec is not None:
        drafted, accepted = spec.drafted, spec.accepted
    step_ms: list[float] = []
    step = scheduler.step

    def timed_step() -> list:
        """A step, timed when it launched a decode step (plain or verify)."""
        launched = len(scheduler.stats.steps)
        start = time.perf_counter()
        outputs = step()
        if len(scheduler.stats.steps) > launched and scheduler.stats.steps[-1][0] == "decode":
            step_ms.append((time.perf_counter() - start) * 1000)
        return outputs

    scheduler.step = timed_step  # type: ignore[method-assign]
    try:
        outputs, seconds = timed(lambda: llm.generate(prompts, params), warmup=lambda: None)
    finally:
        del scheduler.step  # the class's again
    counters = {
        # a decode step of n requests is n request-steps: each gives that request 1..k+1 tokens
        "decode_rows": sum(s[1] for s in scheduler.stats.steps[steps:] if s[0] == "decode"),
        "drafted": spec.drafted - drafted if spec is not None else 0,
        "accepted": spec.accepted - accepted if spec is not None else 0,
        "decode_steps": len(step_ms),
        # the median wall time of a step that launched a decode step: with overlap (k = 0) the
        # step also waits for the previous one, so in a steady state it is one step's time
        "ms_per_decode_step": percentile(step_ms, 50) if step_ms else None,
    }
    return [o["token_ids"] for o in outputs], seconds, counters


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark speculative", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model", default=str(DEFAULT_MODEL), help=f"a checkpoint directory, or {RANDOM_MODEL}"
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--ks", default="0,2,4", help="draft tokens per step; 0 is plain")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--workloads", default="copy,random")
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--prompt-len", type=int, default=128, help="of the random workload")
    parser.add_argument("--json", type=Path, help="also append each result as a JSON line here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = resolve_model(args.model, dtype)
    ks = [int(k) for k in args.ks.split(",")]
    sizes = [int(n) for n in args.batch_sizes.split(",")]
    workloads = args.workloads.split(",")
    plain: dict[tuple[str, int], list[list[int]]] = {}
    print(
        f"{'workload':<9}{'batch':>6}{'k':>3}{'tok/s':>10}{'accept':>8}{'tok/step':>9}"
        f"{'ms/step':>9}{'same':>6}"
    )
    for k in ks:
        with LLM(
            str(model),
            dtype=dtype,
            speculative_tokens=k,
            # CUDA graphs go up to max_running_req rows: room for the largest batch's verify
            # step as decode rows, k + 1 per request
            max_running_req=max(sizes) * (max(ks) + 1),
            show_progress=False,
        ) as llm:
            vocab = llm.scheduler.engine.model_config.vocab_size
            for workload in workloads:
                for size in sizes:
                    if workload == "copy":
                        prompts = copy_prompts(llm.tokenizer, size)
                        params = SamplingParams(max_tokens=args.output_len)
                    else:
                        prompts = random_prompts(size, args.prompt_len, min(vocab, 10000))
                        params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
                    tokens, seconds, counters = run_one(llm, prompts, params)
                    reference = plain.setdefault((workload, size), tokens) if k == 0 else None
                    reference = reference or plain.get((workload, size))
                    output_tokens = sum(map(len, tokens))
                    record = {
                        "benchmark": "speculative",
                        "model": model.name,
                        "dtype": args.dtype,
                        "workload": workload,
                        "batch_size": size,
                        "k": k,
                        "output_tokens": output_tokens,
                        "seconds": seconds,
                        "tokens_per_s": output_tokens / seconds,
                        "acceptance": counters["accepted"] / counters["drafted"]
                        if counters["drafted"]
                        else None,
                        "tokens_per_step": (output_tokens - len(prompts))
                        / max(counters["decode_rows"], 1),
                        "same_tokens_share": None
                        if reference is None
                        else sum(a == b for a, b in zip(tokens, reference)) / len(tokens),
                        **counters,
                    }
                    accept = "-" if record["acceptance"] is None else f"{record['acceptance']:.2f}"
                    same = (
                        "-"
                        if record["same_tokens_share"] is None
                        else f"{record['same_tokens_share']:.2f}"
                    )
                    step_ms = record["ms_per_decode_step"] or 0.0
                    print(
                        f"{workload:<9}{size:>6}{k:>3}{record['tokens_per_s']:>10.1f}"
                        f"{accept:>8}{record['tokens_per_step']:>9.2f}{step_ms:>9.2f}{same:>6}"
                    )
                    if args.json:
                        append_result(args.json, record)
        release_gpu_memory()
    return 0
