"""The engine's decode step against transformers', taken in turn in one process (CPU).

    python -m benchmark cpu-versus                    # SmolLM2, float32, batch 32, 64-token prompts
    python -m benchmark cpu-versus --rounds 20 --json results.jsonl
    python -m benchmark cpu-versus --row-major       # also the engine with row-major weights

On a shared two-core machine the speed of the minute moves a whole run by a fifth, so two runs
made one after the other compare the minutes as much as the systems. Here both decode the same
`--batch` prompts: each round runs `--steps` decode steps of the engine, then as many of
transformers (its forward with a DynamicCache, greedy), so both sides see the same minutes; the
median step of each side and their ratio are what the code decides. Both sides' contexts grow by
one token a step, alike. The greedy tokens of the two must agree (they are the same model in
float32), which the script checks before it reports. With `--row-major` a third side takes its
turn: the engine built with MINISGL_CPU_LAYOUT=row, without chapter 21's column-major weights.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

from minisgl.benchmark import WorkloadSpec, append_result, make_workload

from .checkpoints import DEFAULT_MODEL


class EngineSide:
    """The engine's scheduler with the prompts prefilled; `step()` is one decode step."""

    def __init__(self, model: str, prompts: list[list[int]], steps: int) -> None:
        from minisgl.core import SamplingParams
        from minisgl.llm import LLM

        self.llm = LLM(
            model,
            device="cpu",
            dtype=torch.float32,
            max_running_req=len(prompts),
            show_progress=False,
            max_seq_len=len(prompts[0]) + steps + 16,
        )
        self.scheduler = self.llm.scheduler
        params = SamplingParams(max_tokens=steps + 1, ignore_eos=True)  # + the prefill's token
        self.uids = [self.scheduler.add_request(p, params) for p in prompts]
        self.tokens: dict[int, list[int]] = {uid: [] for uid in self.uids}
        while self.scheduler.prefill_manager.runnable:
            self.step()

    def step(self) -> None:
        for out in self.scheduler.step():
            self.tokens[out.uid].append(out.token)

    def finish(self) -> list[list[int]]:
        """Run what is left (a step's results may arrive one step late) and return the tokens."""
        while self.scheduler.has_work:
            self.step()
        self.llm.shutdown()
        return [self.tokens[uid] for uid in self.uids]


class TransformersSide:
    """transformers' model with the prompts prefilled into a DynamicCache; `step()` is one
    decode step (what `generate` runs per token, without its logits processors)."""

    def __init__(self, model: str, prompts: list[list[int]]) -> None:
        from transformers import AutoModelForCausalLM, DynamicCache

        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.cache = DynamicCache(config=self.model.config)
        self.position = len(prompts[0])
        with torch.inference_mode():
            logits = self.model(
                torch.tensor(prompts), past_key_values=self.cache, logits_to_keep=1
            ).logits
        self.next_tokens = logits[:, -1].argmax(-1, keepdim=True)
        self.tokens = [[t] for t in self.next_tokens.flatten().tolist()]

    @torch.inference_mode()
    def step(self) -> None:
        logits = self.model(
            self.next_tokens,
            past_key_values=self.cache,
            cache_position=torch.tensor([self.position]),
        ).logits
        self.next_tokens = logits[:, -1].argmax(-1, keepdim=True)
        self.position += 1
        for row, token in zip(self.tokens, self.next_tokens.flatten().tolist()):
            row.append(token)


def take_turns(
    sides: dict[str, Callable[[], None]], rounds: int, steps: int
) -> dict[str, list[float]]:
    """Seconds of every step of each side, `steps` at a time, side after side, `rounds` times."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, step in sides.items():
            for _ in range(steps):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    return times


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark cpu-versus", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per request")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="decode steps per side per round")
    parser.add_argument("--warmup", type=int, default=2, help="steps per side before timing")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", type=Path, help="also append the figures as a JSON line here")
    parser.add_argument(
        "--row-major", action="store_true", help="a third side: the engine's weights row-major"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    total_steps = args.warmup + args.rounds * args.steps
    spec = WorkloadSpec(args.batch, (args.context, args.context), (total_steps, total_steps))
    prompts = make_workload(spec, seed=0).prompts
    engines = {"engine": EngineSide(args.model, prompts, total_steps)}
    if args.row_major:
        with mock.patch.dict(os.environ, {"MINISGL_CPU_LAYOUT": "row"}):
            engines["row_major"] = EngineSide(args.model, prompts, total_steps)
    transformers = TransformersSide(args.model, prompts)
    sides = {name: side.step for name, side in engines.items()} | {
        "transformers": transformers.step
    }
    take_turns(sides, 1, args.warmup)
    times = take_turns(sides, args.rounds, args.steps)

    for name, side in engines.items():
        engine_tokens = side.finish()
        if engine_tokens != transformers.tokens:
            differing = sum(a != b for a, b in zip(engine_tokens, transformers.tokens))
            print(
                f"{name} and transformers decoded different tokens for {differing} of "
                f"{len(engine_tokens)} requests",
                file=sys.stderr,
            )
            return 1
    median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    fastest = {name: min(t) * 1e3 for name, t in times.items()}
    ratio = median["transformers"] / median["engine"]
    print(
        f"decode step of {Path(args.model).name}, float32, {args.threads} threads, batch "
        f"{args.batch}, {args.context}-token prompts, {args.rounds} rounds of {args.steps} "
        f"steps each; the same {len(engine_tokens[0])} tokens per request on every side"
    )
    print(f"{'side':<14}{'median ms':>10}{'fastest ms':>11}")
    for name in times:
        print(f"{name:<14}{median[name]:>10.1f}{fastest[name]:>11.1f}")
    print(f"transformers' median step / the engine's: {ratio:.2f}")
    if args.row_major:
        gain = median["row_major"] / median["engine"]
        print(f"row-major's median step / the engine's: {gain:.2f}")
    if args.json:
        shape = {"batch": args.batch, "context": args.context, "threads": args.threads}
        turns = {"rounds": args.rounds, "steps": args.steps}
        figures = {f"{name}_ms": median[name] for name in times}
        figures |= {f"{name}_fastest_ms": fastest[name] for name in times}
        figures["vs_transformers"] = ratio
        if args.row_major:
            figures["vs_row_major"] = gain
        append_result(args.json, {"benchmark": "cpu_versus", **shape, **turns, **figures})
    return 0
