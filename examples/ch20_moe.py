# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 20: a mixture of experts
#
# A tiny random Qwen3-MoE (layer 0 dense, layer 1 with 8 experts, top 2) generates through
# `LLM`, like every model before it, and we check its greedy tokens against transformers.
# A hook on the router counts how many (token, expert) pairs each expert received. Then we
# take one prompt's routing apart: the top-2 experts and weights of each token, the sorted
# order that groups the pairs by expert, and the padded block layout the fused Triton kernel
# runs on, whose output we compare with the torch path (in Triton's interpreter, on the CPU).
# Last, the same kernel compiled for an H200 at Qwen3-30B-A3B's shapes: the committed results
# of `python -m benchmark moe`, per layer and for the official offline workload.

# %%
from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton kernel runs on CPU tensors here

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minisgl.benchmark import read_results_dir
from minisgl.core import SamplingParams
from minisgl.kernels.fused_moe import align_to_blocks, fused_moe
from minisgl.layers.moe import SparseMoeBlock, moe_forward_torch, route, sort_by_expert
from minisgl.llm import LLM

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = ROOT / "models" / "tiny-qwen3-moe"
PROMPTS = ["The capital of France is", "One, two, three,", "Water boils at"]
NEW_TOKENS = 12
BLOCK_M = 4  # the kernel uses 16 or 64; 4 keeps the printed layout short


def transformers_greedy(model: torch.nn.Module, ids: list[int]) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    with LLM(str(MODEL), max_running_req=4, show_progress=False) as llm:
        layers = llm.scheduler.engine.model.model.layers
        moe_layer = next(
            i for i, layer in enumerate(layers) if isinstance(layer.mlp, SparseMoeBlock)
        )
        block: SparseMoeBlock = layers[moe_layer].mlp
        num_experts = block.gate.weight.shape[0]
        logits_seen: list[torch.Tensor] = []
        block.gate.register_forward_hook(lambda _m, _i, out: logits_seen.append(out.detach()))
        outputs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))

    print(
        f"model: {MODEL.name}, MoE in layer {moe_layer}: {num_experts} experts, top {block.top_k}"
    )
    reference = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    for text, ids, out in zip(PROMPTS, prompts, outputs):
        same = out["token_ids"] == transformers_greedy(reference, ids)
        print(f"{text!r} -> {out['text']!r}  (same tokens as transformers: {same})")

    # Every forward through layer 1 (prefill chunks and decode steps) went past the hook.
    logits = torch.cat(logits_seen)
    weights, expert_ids = route(logits, block.top_k, block.renormalize)
    pairs = torch.bincount(expert_ids.flatten(), minlength=num_experts)
    print(f"\nrouting of all {logits.shape[0]} tokens that went through layer {moe_layer}:")
    print("expert  pairs  share  as first choice")
    first = torch.bincount(expert_ids[:, 0], minlength=num_experts)
    for e in range(num_experts):
        share = pairs[e].item() / pairs.sum().item()
        print(f"{e:>6}  {pairs[e].item():>5}  {share:>5.0%}  {first[e].item():>15}")
    means = weights.mean(dim=0).tolist()
    print(f"mean weight of the first choice: {means[0]:.3f} (second: {means[1]:.3f})")

    # The first prompt's prefill: its tokens, their experts, and the dispatch.
    n = len(prompts[0])
    weights, expert_ids = weights[:n], expert_ids[:n]
    print(f"\nthe first prompt's {n} tokens, their top-{block.top_k} experts and weights:")
    for t in range(n):
        chosen = ", ".join(
            f"{e} ({w:.2f})" for e, w in zip(expert_ids[t].tolist(), weights[t].tolist())
        )
        print(f"  token {t}: {chosen}")
    order, tokens_per_expert = sort_by_expert(expert_ids, num_experts)
    print(f"pairs sorted by expert (pair = token * {block.top_k} + slot): {order.tolist()}")
    print(f"tokens per expert: {tokens_per_expert.tolist()}")
    pair_ids, block_expert = align_to_blocks(expert_ids, num_experts, BLOCK_M)
    used = int((block_expert >= 0).sum())
    rows = pair_ids.view(-1, BLOCK_M)[:used].tolist()
    pad = expert_ids.numel()
    print(f"blocks of {BLOCK_M} rows for the kernel ({pad} = padding), {used} used:")
    for expert, row in zip(block_expert.tolist(), rows):
        print(f"  expert {expert}: {['-' if p == pad else p for p in row]}")

    hidden = torch.randn(n, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(0))
    gate_up = block.experts["gate_up_proj"].weight
    down = block.experts["down_proj"].weight
    torch_out = moe_forward_torch(hidden, gate_up, down, weights, expert_ids)
    fused_out = fused_moe(hidden, gate_up, down, weights, expert_ids)
    close = torch.allclose(fused_out, torch_out, atol=1e-5, rtol=1e-5)
    print(f"\nfused Triton kernel (interpreter) equals the torch path within 1e-5: {close}")
    h200_results()


def h200_results() -> None:
    """The committed H200 runs of `python -m benchmark moe`, and the page's layer-time figure."""
    results = ROOT / "benchmark" / "results"
    layers = read_results_dir(results, on="H200", benchmark="moe-layer")
    print(f"\none MoE layer's experts on an H200 (benchmark/results/): $ {layers[0]['command']}")
    for r in layers:
        print(
            f"  {r['tokens']:>5} tokens ({r['experts_touched']:>3} experts touched): fused "
            f"{r['fused_ms']:.3f} ms, torch {r['torch_ms']:.3f} ms, "
            f"{r['torch_ms'] / r['fused_ms']:.1f}x; weight-read floor "
            f"{r['weight_read_floor_ms']:.3f} ms; relative error {r['relative_error']:.1e}"
        )
    offline = read_results_dir(results, on="H200", benchmark="moe-offline")
    for model in dict.fromkeys(r["model"] for r in offline):  # each depth run, in file order
        runs = [r for r in offline if r["model"] == model]
        print(f"the offline workload, {model}: $ {runs[0]['command']}")
        for r in runs:
            print(
                f"  {r['variant']:<13} {r['requests']} requests, {r['output_tokens']:,} output "
                f"tokens in {r['seconds']:.1f} s: {r['output_tokens'] / r['seconds']:,.0f} tok/s"
            )
    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the page's figure
        figure = {
            "unit": "ms",
            "bars": [
                {
                    "label": f"batch of {r['tokens']}, {path}",
                    "value": r[f"{path}_ms"],
                    "peer": peer,
                }
                for r in layers
                for path, peer in (("fused", False), ("torch", True))
            ],
            "caption": (
                "Time of one Qwen3-30B-A3B-shaped MoE layer's experts (128 experts, top 8, "
                "bf16) on an H200 for a batch of N tokens: the fused Triton kernel against the "
                "torch path (a loop over experts); from benchmark/results/."
            ),
        }
        out = Path(os.environ["MINISGL_CAPTURE_DIR"]) / "ch20_moe.h200.json"
        out.write_text(json.dumps(figure, indent=1))


if __name__ == "__main__":
    main()
