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
# embedded model, and the baselines of the first two in the same run:
#
# 1. throughput: many requests in one `generate` call;
# 2. the radix cache: prompt tokens computed vs total, for requests sharing a system prompt;
# 3. chunked prefill: how a long prompt is cut into steps under a token budget;
# 4. baselines: 1 again with overlap off and with stage 1's loop (one static batch, assembled
#    by hand, imported from `stage1_milestone.py`), 2 again with the naive cache.

# %%
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.llm import LLM
from minisgl.utils import exit_on_error, load_tokenizer

ROOT = (
    Path(__file__).resolve().parent.parent
    if "__file__" in globals()  # a script
    else Path.cwd().parent
    if Path.cwd().name == "examples"
    else Path.cwd()
)  # a notebook
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
sys.path.insert(0, str(ROOT / "examples"))
from stage1_milestone import generate_hand_batched  # noqa: E402  (stage 1's loop)

TOPICS = [
    "the ocean",
    "volcanoes",
    "honey bees",
    "the moon",
    "trains",
    "coffee",
    "chess",
    "rainbows",
    "penguins",
    "bicycles",
    "libraries",
    "thunderstorms",
    "bread",
    "satellites",
    "forests",
    "music",
]
SYSTEM = (
    "You are a concise science teacher. Explain things to a curious twelve-year-old in "
    "two plain sentences, with one concrete example, and never invent facts."
)
PROMPTS = [f"Here is a short fact about {topic}:" for topic in TOPICS]
FACTS = SamplingParams(max_tokens=16, ignore_eos=True)  # the throughput workload's parameters
BUDGET = 64


def chat(tokenizer, question: str) -> list[int]:  # noqa: ANN001 - a transformers tokenizer
    return tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


def throughput(llm: LLM) -> tuple[list[dict], float]:
    """Sixteen short prompts, 16 tokens each, in one call: the outputs and the seconds."""
    start = time.perf_counter()
    outputs = llm.generate(PROMPTS, FACTS)
    return outputs, time.perf_counter() - start


def hand_batched(tokenizer) -> tuple[list[list[int]], int, float]:  # noqa: ANN001
    """The throughput workload through stage 1's loop: no scheduler, one static batch of all
    sixteen prompts on a fresh engine. The generated ids, the steps and the seconds."""
    engine = Engine(
        EngineConfig(MODEL, max_running_req=len(PROMPTS), num_pages=1024, show_progress=False)
    )
    ids = [tokenizer.encode(p) for p in PROMPTS]
    start = time.perf_counter()
    outputs, log = generate_hand_batched(engine, ids, FACTS)
    return outputs, len(log), time.perf_counter() - start


def shared_prompt(llm: LLM, tokenizer) -> tuple[int, int, float]:  # noqa: ANN001
    """One chat request, then seven more with its system prompt: prompt tokens computed, prompt
    tokens in all, and the seconds."""
    questions = [f"Why is {topic} interesting?" for topic in TOPICS[:8]]
    stats = llm.scheduler.stats
    before = (stats.prompt_tokens, stats.computed_prompt_tokens)
    start = time.perf_counter()
    llm.generate([chat(tokenizer, questions[0])], SamplingParams(max_tokens=8))
    llm.generate([chat(tokenizer, q) for q in questions[1:]], SamplingParams(max_tokens=8))
    elapsed = time.perf_counter() - start
    return stats.computed_prompt_tokens - before[1], stats.prompt_tokens - before[0], elapsed


def main() -> None:
    tokenizer = load_tokenizer(MODEL)
    with LLM(MODEL, max_extend_tokens=BUDGET, show_progress=False) as llm:
        stats = llm.scheduler.stats
        # 1. Throughput.
        outputs, elapsed = throughput(llm)
        tokens, steps = sum(len(o["token_ids"]) for o in outputs), len(stats.steps)
        print(
            f"1. {len(outputs)} requests, {tokens} tokens in {steps} steps, "
            f"{elapsed:.2f} s: {tokens / elapsed:.1f} tokens/s"
        )
        for prompt, out in list(zip(PROMPTS, outputs))[:3]:
            print(f"   {prompt!r} -> {out['text']!r}")

        # 2. Radix cache: one request first, then the rest share its system prompt.
        computed, total, radix_time = shared_prompt(llm, tokenizer)
        print(
            f"\n2. radix cache: 8 requests sharing a system prompt computed "
            f"{computed} of {total} prompt tokens ({1 - computed / total:.0%} reused), "
            f"{radix_time:.2f} s"
        )

        # 3. Chunked prefill: a long prompt under a budget of BUDGET tokens per step.
        long_prompt = " ".join(f"Step {i}: add {i} to the total." for i in range(30))
        long_ids = tokenizer.encode(long_prompt + " The total is")
        first_step = len(stats.steps)
        llm.generate([long_ids], SamplingParams(max_tokens=4))
        chunks = [n for phase, _, n in stats.steps[first_step:] if phase == "prefill"]
        print(
            f"\n3. chunked prefill: a {len(long_ids)}-token prompt with "
            f"max_extend_tokens={BUDGET} ran as prefill chunks {chunks}"
        )
        llm.scheduler.cache_manager.check_integrity()
        print("\nintegrity check passed: every KV page is free or cached")

    # 4. Baselines, measured in this run: the same workloads with one mechanism switched off,
    # and the throughput workload with no scheduler at all (stage 1's hand-assembled batch).
    with LLM(MODEL, max_extend_tokens=BUDGET, enable_overlap=False, show_progress=False) as llm:
        outputs_off, elapsed_off = throughput(llm)
    outputs_static, steps_static, static_time = hand_batched(tokenizer)
    with LLM(MODEL, max_extend_tokens=BUDGET, cache_type="naive", show_progress=False) as llm:
        computed_naive, _, naive_time = shared_prompt(llm, tokenizer)
    tokens_static = sum(len(o) for o in outputs_static)
    same = [o["token_ids"] for o in outputs_off] == [o["token_ids"] for o in outputs]
    same_static = outputs_static == [o["token_ids"] for o in outputs]
    print(
        f"\n4. baselines: overlap off, {tokens / elapsed_off:.1f} tokens/s "
        f"(on: {tokens / elapsed:.1f} tokens/s), same tokens: {same}"
    )
    print(
        f"   stage 1 milestone (one static batch, hand-assembled): {tokens_static} output tokens "
        f"in {steps_static} steps, {static_time:.2f} s: {tokens_static / static_time:.1f} tokens/s "
        f"(scheduler: {tokens / elapsed:.1f} tokens/s in {steps} steps), same tokens: {same_static}"
    )
    print(
        f"   naive cache, {computed_naive} of {total} prompt tokens computed in "
        f"{naive_time:.2f} s (radix: {computed} in {radix_time:.2f} s)"
    )


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
