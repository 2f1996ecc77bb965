# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 7: the scheduler and continuous batching
#
# `LLM.generate` puts every prompt into the scheduler's queue at once. Each step the
# scheduler picks a batch: a prefill of newly admitted requests, or one decode step of every
# running request. Requests with different `max_tokens` leave the batch at different steps,
# and waiting requests join as soon as a table row frees up: that is continuous batching.
# (This chapter runs without a prefix cache and without overlap; both come later.)

# %%
from __future__ import annotations

import os
import time
from pathlib import Path

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.utils import exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))

PROMPTS = [
    "The capital of France is",
    "List three fruits:",
    "def add(a, b):",
    "The sun is a",
    "Water boils at",
    "My favourite book is",
    "The opposite of hot is",
    "In 1969, astronauts",
]
MAX_TOKENS = [4, 8, 12, 16, 6, 10, 14, 18]


def main() -> None:
    # Four table rows for eight requests: the last four wait until rows free up.
    with LLM(
        MODEL, cache_type="naive", enable_overlap=False, max_running_req=4, show_progress=False
    ) as llm:
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
        start = time.perf_counter()
        outputs = llm.generate(PROMPTS, params)
        elapsed = time.perf_counter() - start
        steps = llm.scheduler.stats.steps

    print("step  phase    requests  tokens")
    for i, (phase, reqs, tokens) in enumerate(steps):
        print(f"{i:>4}  {phase:<7}  {reqs:>8}  {tokens:>6}")
    print()
    for prompt, out in zip(PROMPTS, outputs):
        print(f"{prompt!r:<28} {len(out['token_ids']):>2} tokens -> {out['text']!r}")
    total = sum(len(o["token_ids"]) for o in outputs)
    print(
        f"\n{len(PROMPTS)} requests, {total} tokens, {len(steps)} steps, "
        f"{total / elapsed:.1f} tokens/s"
    )


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
