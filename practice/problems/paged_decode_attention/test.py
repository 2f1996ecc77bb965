"""Tests of problem 52 (decode_attention), against dense attention and inside the engine."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from minisgl.attention import TorchAttnBackend
from minisgl.core import SamplingParams
from submission import decode_attention

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

NUM_SLOTS, MAX_SEQ_LEN = 256, 64


def dense(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One request: q [heads, d], keys/values [n, kv_heads, d] -> [heads, d]."""
    group = q.shape[0] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("hd,nhd->hn", q, keys) / math.sqrt(q.shape[-1])
    return torch.einsum("hn,nhd->hd", scores.softmax(-1), values)


def check(
    seq_lens: list[int],
    rows: list[int],
    heads: int,
    kv_heads: int,
    head_dim: int = 16,
    seed: int = 0,
    poison: bool = False,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(NUM_SLOTS, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(NUM_SLOTS, kv_heads, head_dim, generator=gen)
    slots = torch.randperm(NUM_SLOTS, generator=gen).to(torch.int32)
    stale = int(slots[-1])  # what the rest of every row points at: no request's key
    page_table = torch.full((max(rows) + 1, MAX_SEQ_LEN), stale, dtype=torch.int32)
    for b, (row, n) in enumerate(zip(rows, seq_lens)):
        page_table[row, :n] = slots[b * MAX_SEQ_LEN : b * MAX_SEQ_LEN + n]
    if poison:  # huge values in the stale slot: reading past seq_lens shows at once
        k_cache[stale], v_cache[stale] = 1e4, 1e4
    q = torch.randn(len(rows), heads, head_dim, generator=gen)
    want = torch.stack(
        [
            dense(q[b], k_cache[page_table[row, :n].long()], v_cache[page_table[row, :n].long()])
            for b, (row, n) in enumerate(zip(rows, seq_lens))
        ]
    )
    got = decode_attention(q, k_cache, v_cache, page_table, list(rows), list(seq_lens))
    assert isinstance(got, torch.Tensor) and got.shape == want.shape, (
        f"decode_attention(rows={rows}, seq_lens={seq_lens}, heads {heads}/{kv_heads}): expected "
        f"shape {tuple(want.shape)}, got {getattr(got, 'shape', type(got).__name__)}"
    )
    diff = (got - want).abs().max().item()
    assert diff < 1e-4, (
        f"decode_attention(rows={rows}, seq_lens={seq_lens}, heads "
        f"{heads}/{kv_heads}{', stale slots past seq_lens' if poison else ''}): "
        f"differs from dense attention by up to {diff:.3g}"
    )


def test_example_two_requests():
    check([5, 17], [2, 0], heads=4, kv_heads=2)


def test_a_single_key():
    check([1], [0], heads=2, kv_heads=2)


def test_smollm2_head_grouping():
    check([9, 3, 30, 1], [1, 3, 0, 2], heads=9, kv_heads=3, head_dim=64)


def test_multi_query():
    check([12, 7], [0, 1], heads=8, kv_heads=1)


def test_reads_nothing_past_seq_len():
    check([4, 10, 2], [0, 1, 2], heads=4, kv_heads=2, poison=True)


def test_the_engine_decodes_with_your_attention(monkeypatch):
    from minisgl.llm import LLM

    llm = LLM(
        str(MODELS / "tiny-qwen3"),
        num_pages=256,
        max_running_req=4,
        max_seq_len=64,
        cache_type="naive",
        show_progress=False,
    )
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [40, 41, 42, 43]]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = [o["token_ids"] for o in llm.generate(prompts, params)]
    original, calls = TorchAttnBackend.forward, []

    def forward(self, q, k, v, layer_id, batch):
        if not batch.is_decode:
            return original(self, q, k, v, layer_id, batch)
        calls.append(batch.size)
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        return decode_attention(
            q,
            self.kv_cache.k_cache(layer_id),
            self.kv_cache.v_cache(layer_id),
            self.page_table,
            [r.table_idx for r in batch.reqs],
            [r.device_len for r in batch.reqs],
        )

    monkeypatch.setattr(TorchAttnBackend, "forward", forward)
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    assert calls, "the decode path was never used"
    assert got == want, (
        f"LLM.generate({prompts}) on tiny-qwen3, decoding with your "
        f"decode_attention:\nexpected {want}\ngot      {got}"
    )
