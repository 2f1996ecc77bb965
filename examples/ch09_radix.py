# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 9: the radix cache shares a system prompt
#
# Four chat requests share a long system prompt. The first runs alone and leaves its prompt
# in the radix tree; the other three then arrive together and find the shared part cached:
# prefill computes only their own questions. We run the same workload with the naive cache
# (nothing shared) and with the radix cache, and count the prompt tokens actually computed.

# %%
from __future__ import annotations

import os
import time
from pathlib import Path

from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.utils import exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))

SYSTEM = ("You are a meticulous assistant for a geography class. Answer every question in one "
          "short sentence, name the country or city you mean, avoid speculation, and if a "
          "question has no single answer, say so plainly instead of guessing. ")
QUESTIONS = ["What is the capital of France?", "What is the capital of Japan?",
             "Which river flows through Cairo?", "What is the largest ocean?"]


def run(cache_type: str, prompts: list[list[int]]) -> tuple[list[str], int, int, float]:
    with LLM(MODEL, cache_type=cache_type, enable_overlap=False, show_progress=False) as llm:
        params = SamplingParams(max_tokens=12)
        start = time.perf_counter()
        first = llm.generate(prompts[:1], params)  # runs alone, fills the cache
        rest = llm.generate(prompts[1:], params)  # three together
        elapsed = time.perf_counter() - start
        stats = llm.scheduler.stats
        llm.scheduler.cache_manager.check_integrity()
        return ([o["text"] for o in first + rest], stats.prompt_tokens,
                stats.computed_prompt_tokens, elapsed)


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = [tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        add_generation_prompt=True, tokenize=True, return_dict=False) for q in QUESTIONS]
    shared = len(os.path.commonprefix(prompts))
    print(f"4 prompts of {[len(p) for p in prompts]} tokens; the first {shared} are shared\n")
    results = {}
    for cache_type in ("naive", "radix"):
        texts, total, computed, elapsed = run(cache_type, prompts)
        results[cache_type] = texts
        print(f"{cache_type:>5}: computed {computed} of {total} prompt tokens "
              f"({total - computed} reused from the cache), {elapsed:.2f} s")
    same = results["naive"] == results["radix"]
    print(f"\nsame outputs with and without the cache: {same}")
    for question, text in zip(QUESTIONS, results["radix"]):
        print(f"{question!r} -> {text!r}")


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
