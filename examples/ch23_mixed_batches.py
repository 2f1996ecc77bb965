# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 23: mixed batches, optimistic admission and preemption
#
# Two experiments on SmolLM2, each run twice.
#
# 1. Two requests are decoding when a ~300-token prompt arrives; the budget is 96 tokens per
#    step. Without mixed batches (chapter 10's scheduler) a decode step and a prefill chunk
#    take turns: the running requests get a token every other step. With mixed batches every
#    step carries their tokens first and a chunk in the rest of the budget.
# 2. Eight requests share a pool of 64 one-token pages, far less than their worst cases.
#    Conservative admission (chapter 8) runs two at a time; optimistic admission starts all
#    of them and preempts the newest when a decode step finds no free page. Each run's
#    tokens are the same.

# %%
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
BUDGET = 96

# A long prompt: a timetable of 20 trains, then a question about it.
LONG_PROMPT = (
    "Timetable. "
    + " ".join(
        f"Train {n} leaves platform {n % 7 + 1} at {8 + n // 3}:{n * 11 % 60:02d}."
        for n in range(20)
    )
    + " Question: which train leaves first from platform 3? Answer: Train"
)
SHORT_PROMPTS = ["Once upon a time", "The best way to learn is"]
TIGHT_PROMPTS = [
    "The capital of France is",
    "Two plus two equals four and",
    "The color of the sky is",
    "Cats like to eat fish and",
    "A week has seven days and",
    "Water boils at a temperature of",
    "The largest planet is",
    "Bread is made from flour and",
]


def config(**overrides: Any) -> SchedulerConfig:
    return SchedulerConfig(
        MODEL, cache_type="naive", enable_overlap=False, show_progress=False, **overrides
    )


def long_prompt_arrives(tokenizer: Any, mixed: bool) -> tuple[list[dict], dict[int, list[int]]]:
    """Two requests decode; after their first step the long prompt arrives. Returns each
    step's prompt tokens and who got a token, and every request's tokens."""
    # 1,024 pages hold all three requests; the default pool, sized from free memory, would
    # take about a gigabyte here for nothing.
    scheduler = Scheduler(config(max_extend_tokens=BUDGET, mixed_batches=mixed, num_pages=1024))
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    tokens: dict[int, list[int]] = {}
    for prompt in SHORT_PROMPTS:
        tokens[scheduler.add_request(tokenizer.encode(prompt), params)] = []
    steps = []
    while scheduler.has_work:
        if len(steps) == 1:
            long_ids = tokenizer.encode(LONG_PROMPT)
            tokens[scheduler.add_request(long_ids, SamplingParams(max_tokens=4))] = []
        before = scheduler.stats.computed_prompt_tokens
        outputs = scheduler.step()
        for out in outputs:
            tokens[out.uid].append(out.token)
        steps.append(
            {
                "prompt_tokens": scheduler.stats.computed_prompt_tokens - before,
                "tokens_to": sorted(out.uid for out in outputs),
            }
        )
    return steps, tokens


def kv_tight(tokenizer: Any, admission: str) -> tuple[list[dict], dict[int, list[int]], int]:
    """Eight requests on 64 pages; returns each step's running, waiting, free pages and
    preemptions so far, every request's tokens, and how many preemptions there were."""
    scheduler = Scheduler(config(num_pages=64, max_running_req=8, admission=admission))
    preemptor = getattr(scheduler.policy, "preemptor", None)  # optimistic admission's
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    tokens = {scheduler.add_request(tokenizer.encode(p), params): [] for p in TIGHT_PROMPTS}
    steps = []
    while scheduler.has_work:
        for out in scheduler.step():
            tokens[out.uid].append(out.token)
        steps.append(
            {
                "running": sorted(scheduler.decode_manager.running_reqs),
                "waiting": [p.uid for p in scheduler.prefill_manager.pending_list],
                "free": scheduler.cache_manager.num_free_pages,
                "preemptions": preemptor.preemptions if preemptor else 0,
            }
        )
    scheduler.cache_manager.check_integrity()
    return steps, tokens, steps[-1]["preemptions"]


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    long_len = len(tokenizer.encode(LONG_PROMPT))
    print(f"1. a {long_len}-token prompt arrives while requests 0 and 1 decode (budget {BUDGET})")
    itl_figure: dict[str, Any] = {"budget": BUDGET, "long_prompt": long_len}
    results = {}
    for mixed in (False, True):
        steps, tokens = long_prompt_arrives(tokenizer, mixed)
        results[mixed] = tokens
        name = "mixed batches" if mixed else "prefill or decode"
        itl_figure["mixed" if mixed else "separate"] = steps
        print(f"\n{name}: step, prompt tokens computed, requests that got a token")
        for i, step in enumerate(steps[:8]):
            print(f"{i:>4}  {step['prompt_tokens']:>4}  {step['tokens_to']}")
        gaps = [i for i, s in enumerate(steps) if 0 not in s["tokens_to"] and i < 12]
        print(f"  steps: {len(steps)}; steps in which request 0 got no token: {gaps}")
    print(f"\nsame tokens with and without mixed batches: {results[False] == results[True]}")
    print(f"long answer: {tokenizer.decode(results[True][2])!r}")

    print("\n2. eight requests, 64 pages of KV, max_tokens=16 each")
    runs = {}
    admission_figure: dict[str, Any] = {"num_pages": 64}
    for admission in ("conservative", "optimistic"):
        steps, tokens, preemptions = kv_tight(tokenizer, admission)
        runs[admission] = tokens
        admission_figure[admission] = steps
        most = max(len(s["running"]) for s in steps)
        print(
            f"{admission:<12}  steps {len(steps):>3}  most running at once {most}  "
            f"preemptions {preemptions}  integrity check passed"
        )
    print(f"same tokens: {runs['conservative'] == runs['optimistic']}")
    print(f"request 0: {tokenizer.decode(runs['optimistic'][0])!r}")
    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws both experiments from these
        capture = Path(os.environ["MINISGL_CAPTURE_DIR"])
        (capture / "ch23_mixed_batches.steps.json").write_text(json.dumps(itl_figure))
        (capture / "ch23_mixed_batches.admission.json").write_text(json.dumps(admission_figure))


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
