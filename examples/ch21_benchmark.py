# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 21: the engine and transformers, side by side
#
# One seeded workload, two systems, one run. We draw 16 requests with prompt and output
# lengths uniform in a range, run them through the engine's `LLM.generate` and through
# transformers' `generate` in static batches of 8, on tiny-qwen3 on this CPU, and check that
# both did the same work (every request got exactly the tokens it asked for) before comparing
# their throughput. Then the same command on the official workload, as it ran on an H200: the
# figures come from the committed results file, each with the command that made it.

# %%
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch

from minisgl.benchmark import (
    WORKLOADS,
    WorkloadSpec,
    make_workload,
    read_results_dir,
    run_engine,
    run_transformers,
)

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = Path(os.environ.get("MINISGL_MODEL", ROOT / "models" / "tiny-qwen3"))
SPEC = WorkloadSpec(num_requests=16, input_lens=(16, 128), output_lens=(8, 64))
HF_BATCH = 8

# %%
work = make_workload(SPEC, seed=0)
print(
    f"workload: {len(work.prompts)} requests, prompts {min(map(len, work.prompts))}-"
    f"{max(map(len, work.prompts))} ids ({work.input_tokens} in all), outputs "
    f"{min(work.output_lens)}-{max(work.output_lens)} tokens ({work.output_tokens} in all), seed 0"
)
print(f"the same seed again gives the same workload: {make_workload(SPEC, 0) == work}")

engine = run_engine(MODEL, work, torch.float32, {}, "minisgl")
hf = run_transformers(MODEL, work, torch.float32, batch_size=HF_BATCH)
for result in (hf, engine):
    print(
        f"{result.variant:<13} {result.output_tokens} output tokens in {result.seconds:.3f} s: "
        f"{result.tokens_per_s:.1f} tokens/s"
    )
same = [len(t) for t in engine.tokens] == [len(t) for t in hf.tokens] == work.output_lens
print(f"same work: every request got exactly its tokens from both: {same}")
batches = [work.output_lens[i : i + HF_BATCH] for i in range(0, len(work.output_lens), HF_BATCH)]
generated = sum(max(b) * len(b) for b in batches)
print(
    f"transformers' static batches generated {generated} tokens for those "
    f"{work.output_tokens}: each batch runs until its longest request is done"
)

# %% [markdown]
# On a tiny model on a CPU both sides spend most of their time in Python, so their ratio
# says little. The official workload on a GPU is where the engine's design pays: these are the
# committed H200 results, grouped by the command that produced them.

# %%
official = read_results_dir(
    ROOT / "benchmark" / "results", on="H200", benchmark="offline", workload="official"
)
spec = WORKLOADS["official"]
print(
    f"\nofficial workload: {spec.num_requests} requests, input and output lengths uniform in "
    f"{list(spec.input_lens)}, {official[0]['input_tokens']} input and "
    f"{official[0]['output_tokens']} output tokens"
)
for command in dict.fromkeys(r["command"] for r in official):
    rows = [r for r in official if r["command"] == command]
    print(f"$ {command}\n  {rows[0]['machine']}, {rows[0]['date']}")
    base = None  # transformers' row of the run at hand: a run times transformers first
    for r in rows:
        rate = r["output_tokens"] / r["seconds"]
        if r["variant"] == "transformers":
            base = r
        ratio = (
            f", {rate * base['seconds'] / base['output_tokens']:.2f}x transformers" if base else ""
        )
        tree = f" ({r['tree']})" if "tree" in r else ""  # an A/B of engine versions
        print(f"  {r['variant']:<13} {r['seconds']:.2f} s, {rate:,.0f} tok/s{ratio}{tree}")

if os.environ.get("MINISGL_CAPTURE_DIR"):  # the page's figure: the H200 rows, a bar per day
    by_day: dict[tuple[str, str], list[float]] = {}  # (day, variant) -> its runs' tok/s
    for r in official:
        by_day.setdefault((r["date"][:10], r["variant"]), []).append(
            r["output_tokens"] / r["seconds"]
        )
    bars = []
    for (day, variant), rates in by_day.items():
        spread = f"median of {len(rates)}, {min(rates):,.0f} to {max(rates):,.0f}"
        bars.append(
            {
                "label": f"{variant} ({day})",
                "value": statistics.median(rates),
                "peer": variant == "transformers",
                "note": spread if len(rates) > 1 else "",
            }
        )
    figure = {
        "unit": "output tok/s",
        "bars": bars,
        "caption": (
            "Output tokens per second on the official workload (256 requests, lengths uniform "
            "in [100, 1024]) on one H200, from benchmark/results/: a bar per day and variant, "
            "the median of that day's runs (with their number and range where there were "
            "several): the engine with everything on, with one feature off or another kernel, "
            "and transformers' generate in the same run as the engine it is compared with."
        ),
    }
    out = Path(os.environ["MINISGL_CAPTURE_DIR"]) / "ch21_benchmark.h200.json"
    out.write_text(json.dumps(figure, indent=1))
