# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Stage 2 milestone: the scheduler at work
#
# The end state of stage 2, with everything on: continuous batching, admission control,
# the radix cache, chunked prefill and overlap scheduling. Three measurements on the
# embedded model:
#
# 1. throughput: many requests in one `generate` call;
# 2. the radix cache: prompt tokens computed vs total, for requests sharing a system prompt;
# 3. chunked prefill: how a long prompt is cut into steps under a token budget.

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

TOPICS = ["the ocean", "volcanoes", "honey bees", "the moon", "trains", "coffee", "chess",
          "rainbows", "penguins", "bicycles", "libraries", "thunderstorms", "bread",
          "satellites", "forests", "music"]
SYSTEM = ("You are a concise science teacher. Explain things to a curious twelve-year-old in "
          "two plain sentences, with one concrete example, and never invent facts.")
BUDGET = 64


def chat(tokenizer, question: str) -> list[int]:  # noqa: ANN001 - a transformers tokenizer
    return tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        add_generation_prompt=True, tokenize=True, return_dict=False)


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    with LLM(MODEL, max_extend_tokens=BUDGET, show_progress=False) as llm:
        stats = llm.scheduler.stats
        # 1. Throughput.
        prompts = [f"Here is a short fact about {topic}:" for topic in TOPICS]
        start = time.perf_counter()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True))
        elapsed = time.perf_counter() - start
        tokens = sum(len(o["token_ids"]) for o in outputs)
        print(f"1. {len(prompts)} requests, {tokens} tokens in {len(stats.steps)} steps, "
              f"{elapsed:.2f} s: {tokens / elapsed:.1f} tokens/s")
        for prompt, out in list(zip(prompts, outputs))[:3]:
            print(f"   {prompt!r} -> {out['text']!r}")

        # 2. Radix cache: one request first, then the rest share its system prompt.
        questions = [f"Why is {topic} interesting?" for topic in TOPICS[:8]]
        before = (stats.prompt_tokens, stats.computed_prompt_tokens)
        llm.generate([chat(tokenizer, questions[0])], SamplingParams(max_tokens=16))
        llm.generate([chat(tokenizer, q) for q in questions[1:]], SamplingParams(max_tokens=16))
        total = stats.prompt_tokens - before[0]
        computed = stats.computed_prompt_tokens - before[1]
        print(f"\n2. radix cache: {len(questions)} requests sharing a system prompt computed "
              f"{computed} of {total} prompt tokens ({1 - computed / total:.0%} reused)")

        # 3. Chunked prefill: a long prompt under a budget of BUDGET tokens per step.
        long_prompt = " ".join(f"Step {i}: add {i} to the total." for i in range(30))
        long_ids = tokenizer.encode(long_prompt + " The total is")
        first_step = len(stats.steps)
        llm.generate([long_ids], SamplingParams(max_tokens=4))
        chunks = [n for phase, _, n in stats.steps[first_step:] if phase == "prefill"]
        print(f"\n3. chunked prefill: a {len(long_ids)}-token prompt with "
              f"max_extend_tokens={BUDGET} ran as prefill chunks {chunks}")
        llm.scheduler.cache_manager.check_integrity()
        print("\nintegrity check passed: every KV page is free or cached")


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
