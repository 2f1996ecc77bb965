# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 25: structured output
#
# The same questions twice on SmolLM2: once free, once with a JSON Schema that every answer
# must follow, and once with a regex. The grammar's mask leaves the model only the tokens
# that keep the output valid, so every constrained answer parses and validates; the free
# answers are whatever the model likes to write. Then one answer is replayed through a fresh
# matcher to count, at each step, how many of the vocabulary's tokens the grammar allowed.

# %%
from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import torch
import xgrammar

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.structured import StructuredParams
from minisgl.utils import exit_on_error

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "job": {"enum": ["chef", "pilot", "doctor", "farmer"]},
    },
    "required": ["name", "age", "job"],
}
QUESTIONS = ["Describe a chef as JSON.", "Describe an old pilot as JSON.", "Invent a person."]
PHONE = r"\+1-[0-9]{3}-[0-9]{3}-[0-9]{4}"


def valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def allowed_per_step(llm: LLM, params: StructuredParams, token_ids: list[int]) -> list[int]:
    """How many tokens the grammar allowed before each token of an answer (a fresh matcher
    of the engine's compiler, fed the answer's tokens one by one)."""
    sampler = llm.scheduler.engine.sampler
    matcher = sampler.matcher(params)
    counts = []
    for token in token_ids:
        mask = xgrammar.allocate_token_bitmask(1, sampler.vocab_size)
        matcher.fill_next_token_bitmask(mask, 0)
        logits = torch.zeros(1, sampler.vocab_size)
        xgrammar.apply_token_bitmask_inplace(logits, mask)
        counts.append(int((logits == 0).sum()))
        matcher.accept_token(token)
    return counts


def main() -> None:
    with LLM(MODEL, show_progress=False) as llm:
        prompts = [
            llm.tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            )
            for q in QUESTIONS
        ]
        free = llm.generate(prompts, SamplingParams(max_tokens=48))
        constrained_params = StructuredParams(max_tokens=48, json_schema=SCHEMA)
        constrained = llm.generate(prompts, constrained_params)
        for question, a, b in zip(QUESTIONS, free, constrained):
            print(f"{question}\n  free:        {a['text']!r} (valid: {valid(a['text'])})")
            print(f"  json_schema: {b['text']!r} (valid: {valid(b['text'])})")
        phone_prompt = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the phone number of the White House?"}],
            add_generation_prompt=True,
            tokenize=False,
        )
        [phone] = llm.generate([phone_prompt], StructuredParams(max_tokens=24, regex=PHONE))
        print(f"regex {PHONE}: {phone['text']!r} ({phone['finish_reason']})")
        sampler = llm.scheduler.engine.sampler
        print(
            f"masked steps: {sampler.masked_steps}, mask time per masked step: "
            f"{sampler.mask_seconds / sampler.masked_steps * 1000:.2f} ms"
        )
        answer = constrained[0]
        counts = allowed_per_step(llm, constrained_params, answer["token_ids"])
        pieces = [llm.tokenizer.decode([t]) for t in answer["token_ids"]]
        vocab = sampler.vocab_size
    forced = sum(1 for c in counts if c == 1)
    print(
        f"\n{len(counts)} tokens in the first JSON answer; the grammar allowed exactly one "
        f"token at {forced} steps (the fixed parts: keys, quotes, separators, EOS)"
    )
    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws the mask's width per step
        Path(os.environ["MINISGL_CAPTURE_DIR"], "ch25_structured.allowed.json").write_text(
            json.dumps(
                {
                    "vocab": vocab,
                    "tokens": pieces,
                    "allowed": counts,
                }
            )
        )


# %%
if __name__ == "__main__":
    with exit_on_error():
        main()
