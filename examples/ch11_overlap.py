# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 11: overlap scheduling
#
# With overlap on, each loop iteration launches batch N+1 *before* processing the results
# of batch N. On a GPU the CPU's bookkeeping (appending tokens, finishing requests, freeing
# pages, building the next batch) then hides behind the device's work. On this CPU the
# forward is synchronous, so nothing overlaps in time, but the structure, and its two
# hazards, are the same: the outputs must not change. We run one workload both ways, with
# requests that stop at EOS (their extra in-flight token must be dropped) and requests that
# stop at max_tokens.

# %%
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.utils import exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))

PROMPTS = [
    "What is 2 + 2? Answer with a number only.",
    "Name a primary color.",
    "The capital of France is",
    "Write one word that rhymes with cat.",
]


def run(
    overlap: bool, prompts: list[list[int]]
) -> tuple[list[dict], float, list[tuple[str, int, int]]]:
    """The outputs, the seconds they took, and every step's (phase, requests, tokens)."""
    with LLM(MODEL, enable_overlap=overlap, show_progress=False) as llm:
        start = time.perf_counter()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=24))
        elapsed = time.perf_counter() - start
        llm.scheduler.cache_manager.check_integrity()
        return outputs, elapsed, llm.scheduler.stats.steps


def main() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for p in PROMPTS
    ]
    runs = {overlap: run(overlap, prompts) for overlap in (False, True)}
    # Request-steps: how many request rows all forwards computed, dropped ones included.
    rows = {overlap: sum(reqs for _, reqs, _ in steps) for overlap, (_, _, steps) in runs.items()}
    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws both timelines from this
        Path(os.environ["MINISGL_CAPTURE_DIR"], "ch11_overlap.timeline.json").write_text(
            json.dumps({"off": runs[False][2], "on": runs[True][2]})
        )
    for overlap, (outputs, elapsed, _) in runs.items():
        generated = sum(len(o["token_ids"]) for o in outputs)
        print(
            f"overlap {'on ' if overlap else 'off'}: {rows[overlap]} request rows computed, "
            f"{generated} tokens kept, {elapsed:.2f} s"
        )
    same = [o["token_ids"] for o in runs[False][0]] == [o["token_ids"] for o in runs[True][0]]
    print(f"identical outputs: {same}")
    print(
        f"rows computed and dropped with overlap (requests that hit EOS were already in "
        f"the next batch): {rows[True] - rows[False]}\n"
    )
    for prompt, out in zip(PROMPTS, runs[True][0]):
        print(
            f"{prompt!r} -> {out['text']!r} ({out['finish_reason']}, "
            f"{len(out['token_ids'])} tokens)"
        )


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
