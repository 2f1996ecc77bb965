"""The committed transformers tokens (tests/transformers_greedy.json) are transformers' own.

The chapter tests compare the engine on SmolLM2 with greedy tokens that transformers generated
once (conftest.hf_greedy): here transformers generates them again, all prompts in one padded
batch, and every entry must come out token for token, far enough from a tie to hold on any CPU.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from conftest import (
    COMMITTED_GREEDY_MODELS,
    GREEDY_FILE,
    MIN_GREEDY_MARGIN,
    MODELS,
    committed_greedy,
    load_hf_model,
    load_tokenizer,
    require_model,
)


def test_the_file_was_recorded_with_the_installed_transformers() -> None:
    assert json.loads(GREEDY_FILE.read_text())["transformers"] == transformers.__version__


@pytest.mark.slow  # two padded batches of the committed SmolLM2 prompts: seconds on 2 cores
@pytest.mark.parametrize("model", sorted(COMMITTED_GREEDY_MODELS))
def test_every_committed_entry_is_what_transformers_generates_now(model: str) -> None:
    entries = [e for (name, _), e in committed_greedy().items() if name == model]
    assert entries, f"no committed tokens for {model}"
    assert all(e["margin"] >= MIN_GREEDY_MARGIN for e in entries)
    path = require_model(MODELS / model)
    hf, pad = load_hf_model(path), load_tokenizer(path).pad_token_id or 0
    # Prompts of up to 100 tokens in one batch, longer ones in another: padding every prompt to
    # the longest (300) multiplied the work.
    short = [e for e in entries if len(e["prompt"]) <= 100]
    for batch in (short, [e for e in entries if len(e["prompt"]) > 100]):
        if batch:
            assert_generates(hf, pad, batch)


def assert_generates(hf: object, pad: int, entries: list[dict]) -> None:
    """transformers' greedy generation of `entries` in one left-padded batch gives each
    entry's committed tokens."""
    width = max(len(e["prompt"]) for e in entries)
    longest = max(len(e["tokens"]) for e in entries)
    # Left padding: every prompt ends at the same column, where generation starts.
    ids = torch.tensor([[pad] * (width - len(e["prompt"])) + e["prompt"] for e in entries])
    mask = (
        torch.arange(width) >= torch.tensor([width - len(e["prompt"]) for e in entries])[:, None]
    ).long()
    with torch.inference_mode():
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=longest,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad,
        )
    for row, entry in zip(out[:, width:].tolist(), entries):
        assert row[: len(entry["tokens"])] == entry["tokens"], f"prompt {entry['prompt'][:8]}..."
