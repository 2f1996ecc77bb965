# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 18: decode steps as CUDA graphs
#
# The engine captures one decode graph per batch size of a ladder, largest first, and a batch
# replays the smallest graph that holds it, padded. We look at the ladder, capture the graphs,
# then serve 13 requests that finish at different steps, with graphs and without: the tokens
# must be the same.
#
# On a machine with CUDA and flashinfer this captures real CUDA graphs over FlashInfer's
# kernels. On the CPU two **test doubles** stand in (tests/test_ch18_cuda_graph.py):
# `FakeGraph`, whose replay re-runs the recorded forward on the same fixed tensors (all a real
# replay can see), and chapter 17's `FakeFlashInfer`. Capture time and memory below are then
# the stand-in's: its time, and the bytes of the graphs' output tensors.

# %%
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

from minisgl.core import SamplingParams
from minisgl.engine.graph import graph_batch_sizes
from minisgl.llm import LLM

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
ON_GPU = torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None
# FlashInfer compiles for head sizes 64, 128, 256 (SmolLM2: 64); on the CPU the tiny Qwen3
# keeps the stand-in's per-request attention fast.
DEFAULT_MODEL = "SmolLM2-135M-Instruct" if ON_GPU else "tiny-qwen3"
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / DEFAULT_MODEL))
GRAPH_MAX_BS = 8
print(f"model: {Path(MODEL).name}")

if ON_GPU:
    print("CUDA and flashinfer found: real CUDA graphs over FlashInfer's kernels, bfloat16")
else:
    sys.path.insert(0, str(ROOT / "tests"))
    import pytest
    from test_ch17_gpu_attention import FakeFlashInfer
    from test_ch18_cuda_graph import fake_gpu

    print("no GPU: graphs are the CPU test double FakeGraph, FlashInfer is FakeFlashInfer")
    fake_gpu(pytest.MonkeyPatch(), FakeFlashInfer())  # engines capture FakeGraphs from here

# %% [markdown]
# ## The ladder
#
# 1, 2, 4, then every multiple of 8, then the maximum: a batch never pads by more than 7 rows
# (or doubles, below 8), and 256 rows need only 35 graphs.

# %%
for max_bs in (GRAPH_MAX_BS, 64, 256):
    sizes = graph_batch_sizes(max_bs)
    shown = sizes if len(sizes) <= 12 else sizes[:6] + ["..."] + sizes[-2:]
    print(f"max {max_bs:>3}: {len(sizes):>2} graphs {shown}")

# %% [markdown]
# ## Capture, then serve
#
# 13 prompts, each asking for 2 more tokens than the one before, at most 12 running at once.
# The first decode batches (12 rows) are larger than the largest graph and run eagerly; as
# requests finish, the batch shrinks and replays graphs 8, 4, 2, 1, padded when it falls
# between two sizes.

# %%
PROMPTS = [f"Count from {i} to {i + 20}:" for i in range(13)]
PARAMS = [SamplingParams(max_tokens=4 + 2 * i, ignore_eos=True) for i in range(13)]


def serve(graph_max_bs: int) -> tuple[list[list[int]], list, object, float]:
    config = dict(num_pages=512, page_size=4, max_running_req=12, show_progress=False)
    with LLM(
        MODEL, attention_backend="flashinfer", cuda_graph_max_bs=graph_max_bs, **config
    ) as llm:
        start = time.perf_counter()
        outs = llm.generate(PROMPTS, PARAMS)
        seconds = time.perf_counter() - start
        return (
            [out["token_ids"] for out in outs],
            llm.scheduler.stats.steps,
            llm.scheduler.engine.runner,
            seconds,
        )


with_graphs, steps, runner, graph_seconds = serve(GRAPH_MAX_BS)
print(
    f"captured {len(runner.graphs)} graphs (batch {runner.batch_sizes}) in "
    f"{runner.capture_seconds:.2f} s, {runner.capture_bytes / 2**20:.1f} MiB"
)
print("\nstep  phase    batch  runs as")
replays = []
for i, (phase, batch_size, _) in enumerate(steps):
    if phase == "decode" and batch_size <= runner.max_batch_size:
        graph = runner.graph_size(batch_size)
        replays.append([batch_size, graph])
        padding = graph - batch_size
        how = f"graph {graph}" + (
            f", {padding} padding row{'s' * (padding > 1)}" if padding else ""
        )
    else:
        how = "eager"
    print(f"{i:>4}  {phase:<7}  {batch_size:>5}  {how}")

eager, _, _, eager_seconds = serve(0)
same = sum(a == b for x, y in zip(with_graphs, eager) for a, b in zip(x, y))
total = sum(len(ids) for ids in eager)
print(f"\ntokens with graphs equal to tokens without: {same} of {total}")
# On the CPU the stand-in re-runs every kernel, so it saves nothing: compare on a GPU.
print(f"generate: {graph_seconds:.2f} s with graphs, {eager_seconds:.2f} s without")
if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws the ladder and the replays
    Path(os.environ["MINISGL_CAPTURE_DIR"], "ch18_cuda_graph.ladder.json").write_text(
        json.dumps({"ladder": graph_batch_sizes(64), "replays": replays})
    )
