# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 16: one model, two processes
#
# SmolLM2 has 9 query heads and 3 KV heads, which two ranks cannot split evenly. We print how
# the partition rules share them out, with the MLP and the vocabulary, then run the model with
# `tp_size=2`: this process is rank 0 and starts rank 1 as a second process, over gloo on the
# CPU. Rank 0 holds about half of the weights and caches the keys and values of its own KV
# heads only, and the two ranks generate exactly the tokens one process does. Last, we count
# the collectives rank 0 runs per forward: two all-reduces per layer, one for the embedding,
# and one all-gather for the logits. Then the same engine on two H200s over NCCL: the committed
# results of `python -m benchmark tp`, a Qwen3-8B-shaped model at TP=1 and TP=2.

# %%
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Callable

from minisgl.benchmark import read_results_dir
from minisgl.core import SamplingParams
from minisgl.distributed import DistributedInfo, head_shard, split_range, vocab_block
from minisgl.layers import parallel as parallel_layers
from minisgl.llm import LLM
from minisgl.models import ModelConfig

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
PROMPTS = ["The capital of France is", "Three primary colors are"]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)
TP = 2


def count_calls(counts: Counter, name: str, fn: Callable) -> Callable:
    """`fn`, counting its calls in counts[name]."""

    def counted(*args: object, **kwargs: object) -> object:
        counts[name] += 1
        return fn(*args, **kwargs)

    return counted


def main() -> None:
    c = ModelConfig.from_dir(MODEL)
    print(
        f"{Path(MODEL).name}: {c.num_heads} query heads, {c.num_kv_heads} KV heads, "
        f"intermediate {c.intermediate_size}, vocabulary {c.vocab_size}, over {TP} ranks"
    )
    for rank in range(TP):
        tp = DistributedInfo(rank, TP)
        heads = head_shard(c.num_heads, c.num_kv_heads, tp)
        mlp = split_range(c.intermediate_size, TP, rank)
        start, end, padded = vocab_block(c.vocab_size, tp)
        print(
            f"  rank {rank}: query heads {heads.q_start}..{heads.q_end - 1}, "
            f"KV heads {heads.kv_start}..{heads.kv_end - 1}, MLP columns {mlp[0]}..{mlp[1] - 1}, "
            f"vocabulary {start}..{end - 1} (padded to {padded} rows)"
        )

    config = dict(show_progress=False, num_pages=512)
    with LLM(MODEL, **config) as llm:
        whole = llm.generate(PROMPTS, PARAMS)
        whole_params = sum(p.numel() for p in llm.scheduler.engine.model.parameters())
        whole_kv = llm.scheduler.engine.kv_bytes_per_token

    with LLM(MODEL, tp_size=TP, **config) as llm:
        engine = llm.scheduler.engine
        rank0_params = sum(p.numel() for p in engine.model.parameters())
        print(
            f"\nrank 0 holds {rank0_params / 1e6:.1f}M of the {whole_params / 1e6:.1f}M "
            f"parameters; its KV pool stores {engine.num_kv_heads} of {c.num_kv_heads} KV heads: "
            f"{engine.kv_bytes_per_token} of {whole_kv} bytes per token"
        )
        sharded = llm.generate(PROMPTS, PARAMS)
        for one, two in zip(whole, sharded):
            print(f"\ntp=1: {one['text']!r}")
            print(f"tp={TP}: {two['text']!r}")
            print(f"same tokens: {one['token_ids'] == two['token_ids']}")

        counts: Counter = Counter()
        for name in ("all_reduce", "all_gather"):
            setattr(
                parallel_layers, name, count_calls(counts, name, getattr(parallel_layers, name))
            )
        forwards = 4
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=forwards, ignore_eos=True))
        print(
            f"\n{forwards} forwards (a prefill, then decode steps) on rank 0: "
            f"{counts['all_reduce']} all-reduces = {forwards} x ({c.num_layers} layers x 2 + 1 "
            f"for the embedding), {counts['all_gather']} all-gathers of the logits"
        )
    h200_results()


def h200_results() -> None:
    """The committed two-H200 runs of python -m benchmark tp, and the page's figure of them."""
    runs = read_results_dir(ROOT / "benchmark" / "results", on="H200", benchmark="tp")
    one = next(r for r in runs if r["tp"] == 1)
    print(f"\non two H200s (benchmark/results/): $ {one['command']}\n  {one['machine']}")
    for r in runs:
        print(
            f"  TP={r['tp']}: {r['seconds']:.1f} s, {r['tokens_per_s']:,.0f} output tok/s "
            f"({r['tokens_per_s'] / one['tokens_per_s']:.2f}x TP=1), decode step at batch 64 "
            f"{r['step_ms']:.2f} ms, of which all-reduce {r['all_reduce_ms']:.3f} ms and "
            f"all-gather {r['all_gather_ms']:.3f} ms"
        )
    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the page's figure
        figure = {
            "unit": "output tok/s",
            "bars": [
                {"label": f"TP={r['tp']}", "value": r["tokens_per_s"], "peer": r["tp"] == 1}
                for r in runs
            ],
            "caption": (
                "Output tokens per second of the official workload (256 requests, lengths "
                "uniform in [100, 1024]) on a Qwen3-8B-shaped model with random bf16 weights, "
                "on one H200 (TP=1) and split over two (TP=2, NCCL), CUDA graphs on; from "
                "benchmark/results/."
            ),
        }
        out = Path(os.environ["MINISGL_CAPTURE_DIR"]) / "ch16_tp.h200.json"
        out.write_text(json.dumps(figure, indent=1))


if __name__ == "__main__":
    main()
