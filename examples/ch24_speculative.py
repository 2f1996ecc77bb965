# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 24: speculative decoding by prompt lookup
#
# SmolLM2 is asked to repeat a passage word for word, once with plain decoding and once with
# up to four n-gram drafts per step. The drafts come from the request's own sequence (the
# passage is in the prompt), one forward verifies them, and each step keeps the drafts the
# model agrees with plus the model's own next token. The main prints, step by step, the
# ledger of that request through each verify step and its rollback, and checks that both runs
# give the same tokens. Then a question whose answer does not quote the prompt shows what
# drafts are worth when the text does not repeat.

# %%
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

import torch

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.speculative.policy import SpeculativeDecoder
from minisgl.utils import div_ceil, exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
K, PAGE = 4, 4
PASSAGE = (
    "The river rises in the hills above the town and runs east for forty miles before it "
    "meets the sea. In spring the water is high and brown."
)
COPY = f"Repeat the following text exactly, word for word:\n\n{PASSAGE}"
FREE = "Give me three ideas for a birthday party."


def chat(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False).input_ids


def generate(prompt: list[int], k: int, max_tokens: int) -> tuple[list[int], list[dict], Any]:
    """One request, stepped by hand; its tokens, each decode step's ledger, the scheduler."""
    scheduler = Scheduler(
        SchedulerConfig(
            MODEL, speculative_tokens=k, page_size=PAGE, enable_overlap=False, show_progress=False
        )
    )
    uid = scheduler.add_request(prompt, SamplingParams(max_tokens=max_tokens))
    policy = scheduler.policy
    spec = policy.stats if isinstance(policy, SpeculativeDecoder) else None  # its counters
    if spec is not None:
        spec.trace_uid = uid
    tokens: list[int] = []
    steps: list[dict] = []
    while scheduler.has_work:
        req = scheduler.decode_manager.running_reqs.get(uid)
        before = (req.cached_len, req.device_len) if req else None
        free = scheduler.cache_manager.num_free_pages
        traced = len(spec.trace) if spec else 0
        outputs = scheduler.step()
        tokens += [out.token for out in outputs]
        if before is None:  # the prefill
            continue
        drafted, accepted = spec.trace[traced] if spec and len(spec.trace) > traced else (0, 0)
        after = (req.cached_len, req.device_len)
        steps.append(
            {
                "before": before,
                "verified": (before[0], before[1] + drafted),
                "after": after,
                "drafted": drafted,
                "accepted": accepted,
                "emitted": len(outputs),
                "pages_during": div_ceil(before[1] + drafted, PAGE) - div_ceil(before[0], PAGE),
                "pages_kept": free - scheduler.cache_manager.num_free_pages,
                "finished": bool(outputs and outputs[-1].finished),
            }
        )
    scheduler.cache_manager.check_integrity()
    return tokens, steps, scheduler


def print_steps(steps: list[dict]) -> None:
    print("step  ledger before  verified   after       drafts  accepted  tokens  pages kept")
    for i, s in enumerate(steps):
        print(
            f"{i:>4}  {str(s['before']):<13}  {str(s['verified']):<10} {str(s['after']):<11} "
            f"{s['drafted']:>6}  {s['accepted']:>8}  {s['emitted']:>6}  "
            + ("finished" if s["finished"] else f"{s['pages_kept']} of {s['pages_during']}")
        )


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    figure: dict[str, Any] = {"k": K, "page_size": PAGE}
    for name, question, max_tokens in (("copy", COPY, 64), ("free", FREE, 40)):
        prompt = chat(tokenizer, question)
        print(f"{name}: {question.splitlines()[0]!r}, {len(prompt)} prompt tokens")
        plain, plain_steps, _ = generate(prompt, 0, max_tokens)
        tokens, steps, scheduler = generate(prompt, K, max_tokens)
        stats = scheduler.policy.stats
        print(f"  plain decoding: {len(plain)} tokens in {len(plain_steps)} decode steps")
        print(f"  k = {K} drafts:   {len(tokens)} tokens in {len(steps)} decode steps")
        print(f"  same tokens: {plain == tokens}")
        print(f"  answer: {tokenizer.decode(tokens, skip_special_tokens=True)!r}")
        print(
            f"  drafted {stats.drafted}, accepted {stats.accepted}: acceptance "
            f"{stats.acceptance_rate:.2f}, {(len(tokens) - 1) / len(steps):.2f} tokens per "
            "decode step"
        )
        tree = scheduler.cache_manager.prefix_cache
        cached = tree.size_info.total_size
        match = tree.match_prefix(torch.tensor(prompt + tokens, dtype=torch.int32))
        print(
            f"  radix tree: {cached} tokens cached, all of them the sequence's own: "
            f"{len(match.indices) == cached}\n"
        )
        print_steps(steps if name == "copy" else steps[:12])
        print()
        figure[name] = {"prompt_len": len(prompt), "steps": steps}
    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws both requests' steps
        capture = Path(os.environ["MINISGL_CAPTURE_DIR"])
        (capture / "ch24_speculative.steps.json").write_text(json.dumps(figure))


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
