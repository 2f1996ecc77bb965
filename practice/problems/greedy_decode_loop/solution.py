"""Problem 2: the tiny engine's greedy loop: prefill once, then decode with the KV cache."""

from __future__ import annotations

import torch

from minisgl.tiny_engine import KVCache, TinyEngine


def generate_ids(
    engine: TinyEngine, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False
) -> list[int]:
    """Greedy decoding: prefill the whole prompt once, then feed back one token per step,
    reusing the KV cache. Stops after max_new_tokens or at EOS (which is included)."""
    kv = KVCache(engine.model.config)
    out: list[int] = []
    new_ids = list(prompt_ids)  # first step: the whole prompt (prefill)
    while len(out) < max_new_tokens:
        positions = torch.arange(len(kv), len(kv) + len(new_ids))
        logits = engine.model.forward(torch.tensor(new_ids, dtype=torch.long), positions, kv)
        token = int(logits.argmax())
        out.append(token)
        if token in engine.model.config.eos_token_ids and not ignore_eos:
            break
        new_ids = [token]  # every later step: only the newest token (decode)
    return out
