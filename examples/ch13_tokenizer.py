# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 13: from tokens to text, one token at a time
#
# The scheduler produces token ids; a client wants text, as soon as possible. We feed a
# multilingual sentence to the IncrementalDetokenizer token by token and print what it emits
# at each step: a character split over several byte-level tokens (an emoji, a kanji) is held
# back until it is whole. Then a stop string cut across pieces, and a chat prompt built by the
# tokenizer's chat template.

# %%
from __future__ import annotations

import os
from pathlib import Path

from transformers import AutoTokenizer

from minisgl.core import SamplingParams
from minisgl.message import TokenizeMsg
from minisgl.tokenizer import IncrementalDetokenizer, StopMatcher, TokenizeManager

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))

TEXT = "Tokyo 東京 👍🏽 done."


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    ids = tokenizer.encode(TEXT)
    detokenizer = IncrementalDetokenizer(tokenizer)
    print(f"{TEXT!r} is {len(ids)} tokens\n")
    print(" step  token  alone decodes to   emitted")
    pieces = []
    for step, token in enumerate(ids):
        piece = detokenizer.step(token)
        pieces.append(piece)
        alone = tokenizer.decode([token])
        print(f"{step:>5}  {token:>5}  {alone!r:<18} {piece!r}")
    pieces.append(detokenizer.flush())
    print(
        f"\njoined: {''.join(pieces)!r}, equal to the full decode: "
        f"{''.join(pieces) == tokenizer.decode(ids)}"
    )

    print("\nstop strings: the stream 'x = 1;' 'END' ... with stop=['END']")
    matcher = StopMatcher(["END"])
    for piece in ["x = 1; E", "N", "D more"]:
        text, stopped = matcher.push(piece)
        print(f"  push {piece!r:<12} -> emit {text!r:<10} stopped={stopped}")
        if stopped:
            break

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt_ids = TokenizeManager(tokenizer).tokenize(
        TokenizeMsg(0, SamplingParams(), messages=messages)
    )
    print(f"\nthe chat template turns one user message into {len(prompt_ids)} tokens:")
    print(tokenizer.decode(prompt_ids))


if __name__ == "__main__":
    main()
