# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 10: chunked prefill
#
# A prefill step computes at most `max_extend_tokens` prompt tokens. A longer prompt is cut
# into chunks, one per step, and between its chunks the requests already running get their
# decode steps: a long prompt no longer freezes everyone else's output. Here a ~300-token
# prompt arrives while a short request is decoding, with a budget of 96 tokens per step.

# %%
from __future__ import annotations

import os
from pathlib import Path

from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import exit_on_error, div_ceil

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
BUDGET = 96

LONG_PROMPT = (
    " ".join(
        f"Fact {i}: the {color} box holds {i * 7 % 13} marbles."
        for i, color in enumerate(
            ["red", "blue", "green", "yellow", "white", "black", "orange", "purple"] * 3
        )
    )
    + " Question: which box holds the most marbles? Answer:"
)


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    scheduler = Scheduler(
        SchedulerConfig(
            MODEL,
            cache_type="naive",
            enable_overlap=False,
            max_extend_tokens=BUDGET,
            show_progress=False,
        )
    )
    short = scheduler.add_request(
        tokenizer.encode("Once upon a time"), SamplingParams(max_tokens=10, ignore_eos=True)
    )
    scheduler.step()  # the short request is prefilled and starts decoding
    long_ids = tokenizer.encode(LONG_PROMPT)
    long = scheduler.add_request(long_ids, SamplingParams(max_tokens=8))
    print(
        f"long prompt: {len(long_ids)} tokens, budget {BUDGET} per step -> "
        f"{div_ceil(len(long_ids), BUDGET)} prefill chunks\n"
    )

    texts: dict[int, list[int]] = {short: [], long: []}
    print("step  phase    requests  tokens")
    while scheduler.has_work:
        for out in scheduler.step():
            texts[out.uid].append(out.token)
    for i, (phase, reqs, tokens) in enumerate(scheduler.stats.steps):
        print(f"{i:>4}  {phase:<7}  {reqs:>8}  {tokens:>6}")
    chunks = [tokens for phase, reqs, tokens in scheduler.stats.steps[1:] if phase == "prefill"]
    print(f"\nprefill chunks of the long prompt: {chunks}")
    print(f"long answer: {tokenizer.decode(texts[long])!r}")


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
