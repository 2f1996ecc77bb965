# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 8: pages, admission control and a 64-token pool
#
# The CacheManager hands out KV pages; admission control decides who may start. Here the
# pool has only 64 slots (page size 1) and five short requests each want up to 8 tokens.
# Each request reserves its worst case (uncached prompt + max_tokens + one page of slack):
# four fit at once, the fifth waits until they finish. We step the scheduler by hand and
# watch the pool: free pages never reach zero, and at the end all 64 are free again.

# %%
from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))

# Five to seven tokens each: four worst cases fit in 64 slots, five do not.
PROMPTS = [
    "The capital of France is",
    "Two plus two equals four and",
    "The color of the sky is",
    "Cats like to eat fish and",
    "A week has seven days and",
]


def main() -> None:
    config = SchedulerConfig(
        MODEL,
        cache_type="naive",
        enable_overlap=False,
        num_pages=64,
        page_size=1,
        max_running_req=8,
        show_progress=False,
    )
    scheduler = Scheduler(config)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        need = len(ids) + params.max_tokens + config.page_size
        print(
            f"request {scheduler.add_request(ids, params)}: {len(ids)} prompt tokens, "
            f"worst case {need} slots"
        )

    cache = scheduler.cache_manager
    print("\nstep  batch             running  waiting  free pages  reserved")
    step, min_free, trace = 0, cache.num_free_pages, []
    while scheduler.has_work:
        scheduler.step()
        phase, size, tokens = scheduler.stats.steps[-1]
        min_free = min(min_free, cache.num_free_pages)
        print(
            f"{step:>4}  {phase:<7} {size} reqs  {len(scheduler.decode_manager.running_reqs):>8}"
            f"  {len(scheduler.prefill_manager.pending_list):>7}  {cache.num_free_pages:>10}"
            f"  {scheduler.decode_manager.inflight_tokens:>8}"
        )
        trace.append(
            {
                "running": sorted(scheduler.decode_manager.running_reqs),  # uids
                "waiting": [r.uid for r in scheduler.prefill_manager.pending_list],
                "free": cache.num_free_pages,
                "reserved": scheduler.decode_manager.inflight_tokens,
            }
        )
        step += 1
    cache.check_integrity()
    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws this run's timeline from it
        Path(os.environ["MINISGL_CAPTURE_DIR"], "ch08_cache_manager.admission.json").write_text(
            json.dumps({"num_pages": cache.num_pages, "steps": trace})
        )
    print(f"\nfewest free pages at any step: {min_free}")
    print(
        f"at the end: {cache.num_free_pages} of {cache.num_pages} pages free, "
        "integrity check passed"
    )


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
