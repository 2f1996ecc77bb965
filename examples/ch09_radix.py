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

import json
import math
import os
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.kvcache.radix_cache import RadixTreeNode
from minisgl.llm import LLM
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))

SYSTEM = (
    "You are a meticulous assistant for a geography class. Answer every question in one "
    "short sentence, name the country or city you mean, avoid speculation, and if a "
    "question has no single answer, say so plainly instead of guessing. "
)
QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Japan?",
    "Which river flows through Cairo?",
    "What is the largest ocean?",
]


def capture(name: str, data: dict) -> None:
    """With MINISGL_CAPTURE_DIR set, save what the site's figure `name` draws of this run."""
    if folder := os.environ.get("MINISGL_CAPTURE_DIR"):
        Path(folder, f"ch09_radix.{name}.json").write_text(json.dumps(data))


def tree_shape(node: RadixTreeNode, tokenizer: AutoTokenizer) -> dict:
    """A radix node's edge (its text) and subtrees, for the site's figure of the tree."""
    return {
        "tokens": len(node.key),
        "text": tokenizer.decode(node.key),
        "children": [tree_shape(child, tokenizer) for child in node.children.values()],
    }


def run(
    cache_type: str, prompts: list[list[int]], tokenizer: AutoTokenizer
) -> tuple[list[str], int, int, float]:
    with LLM(MODEL, cache_type=cache_type, enable_overlap=False, show_progress=False) as llm:
        params = SamplingParams(max_tokens=12)
        cache = llm.scheduler.cache_manager.prefix_cache
        start = time.perf_counter()
        first = llm.generate(prompts[:1], params)  # runs alone, fills the cache
        before = tree_shape(cache.root, tokenizer) if cache_type == "radix" else None
        rest = llm.generate(prompts[1:], params)  # three together
        elapsed = time.perf_counter() - start
        stats = llm.scheduler.stats
        llm.scheduler.cache_manager.check_integrity()
        if before:
            capture("tree", {"before": before, "after": tree_shape(cache.root, tokenizer)})
        return (
            [o["text"] for o in first + rest],
            stats.prompt_tokens,
            stats.computed_prompt_tokens,
            elapsed,
        )


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for q in QUESTIONS
    ]
    shared = len(os.path.commonprefix(prompts))
    print(f"4 prompts of {[len(p) for p in prompts]} tokens; the first {shared} are shared\n")
    results = {}
    for cache_type in ("naive", "radix"):
        texts, total, computed, elapsed = run(cache_type, prompts, tokenizer)
        results[cache_type] = texts
        print(
            f"{cache_type:>5}: computed {computed} of {total} prompt tokens "
            f"({total - computed} reused from the cache), {elapsed:.2f} s"
        )
    same = results["naive"] == results["radix"]
    print(f"\nsame outputs with and without the cache: {same}")
    for question, text in zip(QUESTIONS, results["radix"]):
        print(f"{question!r} -> {text!r}")
    print()
    four_regions(prompts[0][:14])


# %% [markdown]
# ## cache_req's four regions of a row
#
# Page size 4. A first request leaves one page of a prompt in the tree. Then requests A and B,
# with the same 14-token prompt, are prefilled in one step: both match that page at admission.
# A's `cache_req` inserts 12 tokens (14 rounded down to a page); B's finds those 12 cached, frees
# its own copies of positions 4 to 11, and points its row at A's slots. Both keep their tail.


# %%
def four_regions(prompt: list[int]) -> None:
    config = SchedulerConfig(
        MODEL,
        cache_type="radix",
        enable_overlap=False,
        num_pages=32,
        page_size=4,
        max_running_req=4,
        show_progress=False,
    )
    scheduler = Scheduler(config)
    cache = scheduler.cache_manager
    scheduler.add_request(prompt[:5], SamplingParams(max_tokens=1))  # caches one page
    while scheduler.has_work:
        scheduler.step()
    old = cache.prefix_cache.match_prefix(torch.tensor(prompt)).handle.cached_len
    uids = [scheduler.add_request(prompt, SamplingParams(max_tokens=4)) for _ in "AB"]
    free_before = cache.num_free_pages
    scheduler.step()  # one prefill of A and B, then cache_req for each
    rows = {
        name: cache.page_table[
            scheduler.decode_manager.running_reqs[uid].table_idx, : len(prompt)
        ].tolist()
        for name, uid in zip("AB", uids)
    }
    print(
        f"page size 4; the tree holds the first {old} tokens; A and B: the same "
        f"{len(prompt)}-token prompt, prefilled together"
    )
    for name, row in rows.items():
        print(f"  {name}'s row after its cache_req: {row}")
    pages_taken = 2 * (math.ceil(len(prompt) / 4) - old // 4)  # A's and B's new pages
    print(
        f"  the prefill took {pages_taken} pages; after it, "
        f"{free_before - cache.num_free_pages} fewer are free: B's duplicates went back"
    )
    capture("regions", {"page_size": 4, "old": old, "rows": rows})
    while scheduler.has_work:
        scheduler.step()
    cache.check_integrity()


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
