"""Problem 2: the tiny engine's greedy loop: prefill once, then decode with the KV cache."""

from __future__ import annotations

import torch

from minisgl.tiny_engine import KVCache, TinyEngine


def generate_ids(
    self: TinyEngine, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False
) -> list[int]:
    """Greedy decoding: prefill the whole prompt once, then feed back one token per step,
    reusing the KV cache. Stops after max_new_tokens or at EOS (which is included)."""
    raise NotImplementedError("prefill the prompt, then decode one token per forward")
