"""Structured output (chapter 25): how often the answers are valid JSON, with and without the
grammar's mask, and what the mask costs per step with overlap scheduling on and off.

    python -m benchmark structured                         # SmolLM2, 50 prompts, on this machine
    python -m benchmark structured --model models/tiny-qwen3 --dtype bfloat16 --json FILE  # GPU

The same chat prompts ("Describe <subject> as JSON") run free and under a JSON Schema; each answer
is parsed and validated with jsonschema. The mask's time is what `GrammarSampler.sample` spends
accepting the last tokens and filling the bitmask (`mask_seconds`), per step with a constrained
row; a step's time is the generation's wall time over its scheduler steps. On a GPU, with overlap,
the mask is filled while the device runs the forward; on the CPU nothing overlaps.

Each of the three runs (free, constrained with overlap, constrained without) is a fresh engine
whose warm-up generates the whole prompt set once, so every batch size the timed run meets has
run before (kernels compiled, grammars compiled). With `--rounds N` the three runs are repeated
N times, each round in another order (rotated), so that a run's place in the sequence cannot
pass for its effect.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import torch

from minisgl.benchmark import append_result
from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.structured import StructuredParams

from .checkpoints import DEFAULT_MODEL
from .order import rotated

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
}
SUBJECTS = ["a cat", "a city", "a chef", "a river", "a robot", "a pilot", "a tree", "a ship"]


def valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def chat_prompt(tokenizer: Any, question: str) -> str:
    """The question in the model's chat template; as plain text where the tokenizer has none
    (the GPU machine rebuilds the tiny checkpoints from SmolLM2's tokenizer files, which carry
    no template)."""
    if tokenizer.chat_template is None:
        return question
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark structured", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--dtype", default=None, choices=[None, "bfloat16", "float32"])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="each round in another order")
    parser.add_argument("--json", type=Path, default=None, help="append result lines here")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    runs = [("none", True), ("json_schema", True), ("json_schema", False)]
    schedule = [
        (round_, position, run)
        for round_ in range(args.rounds)
        for position, run in enumerate(rotated(runs, round_))
    ]
    for round_, position, (constraint, overlap) in schedule:
        with LLM(args.model, dtype=dtype, enable_overlap=overlap, show_progress=False) as llm:
            prompts = [
                chat_prompt(llm.tokenizer, f"Describe {s} as JSON.")
                for s in (SUBJECTS * args.prompts)[: args.prompts]
            ]
            params = (
                SamplingParams(max_tokens=args.max_tokens)
                if constraint == "none"
                else StructuredParams(max_tokens=args.max_tokens, json_schema=SCHEMA)
            )
            llm.generate(prompts, params)  # warm-up: every batch size, every grammar
            sampler, stats = llm.scheduler.engine.sampler, llm.scheduler.stats
            mask_s, masked, steps = sampler.mask_seconds, sampler.masked_steps, len(stats.steps)
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            seconds = time.perf_counter() - start
            steps = len(stats.steps) - steps
            masked = sampler.masked_steps - masked
            record = {
                "benchmark": "structured",
                "model": Path(args.model).name,
                "constraint": constraint,
                "overlap": overlap,
                "round": round_ + 1,
                "position": position + 1,  # its place in the round's order, 1 to 3
                "prompts": len(prompts),
                "valid": sum(valid(o["text"]) for o in outputs),
                "steps": steps,
                "ms_per_step": seconds * 1000 / steps,
                "masked_steps": masked,
                "mask_ms_per_step": (sampler.mask_seconds - mask_s) * 1000 / masked
                if masked
                else None,
            }
        print(json.dumps(record))
        if args.json is not None:
            append_result(args.json, record)
    return 0
