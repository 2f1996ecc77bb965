# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 4: the KV cache, a pool of slots and a page table
#
# The KV pool is one big tensor allocated up front; a **slot** index addresses one token's
# keys and values in every layer. The page table maps (request row, position) to a slot, so a
# request's tokens can live anywhere in the pool. Here we size the pool for SmolLM2, give three
# requests scattered slots, and watch `TableManager.prepare_inputs` turn their ledgers into
# the three tensors a forward reads: `positions`, `input_ids` and `out_loc`.

# %%
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVCache, NaivePrefixCache
from minisgl.models import ModelConfig
from minisgl.scheduler.table import TableManager
from minisgl.utils import exit_on_error

ROOT = (
    Path(__file__).resolve().parent.parent
    if "__file__" in globals()  # a script
    else Path.cwd().parent
    if Path.cwd().name == "examples"
    else Path.cwd()
)  # a notebook
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
GIB = 2**30


# %% [markdown]
# ## How big is one token?
#
# Each token stores a key and a value of `kv_heads * head_dim` numbers in every layer. We build
# a small pool with the model's shape and measure one slot across all layers, then scale up.


# %%
def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
    """Measured on a real pool: the bytes of one slot's K and V, summed over all layers."""
    pool = MHAKVCache(
        4, config.num_layers, config.num_kv_heads, config.head_dim, dtype, torch.device("cpu")
    )
    return sum(
        pool.k_cache(i)[0].nbytes + pool.v_cache(i)[0].nbytes for i in range(config.num_layers)
    )


def show_sizes(config: ModelConfig) -> None:
    print(
        f"{Path(MODEL).name}: {config.num_layers} layers x {config.num_kv_heads} KV heads x "
        f"head_dim {config.head_dim} (and {config.num_heads} query heads: GQA "
        f"{config.num_heads // config.num_kv_heads}:1)"
    )
    for dtype in (torch.float32, torch.bfloat16):
        per_token = kv_bytes_per_token(config, dtype)
        formula = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize
        assert per_token == formula
        print(
            f"  {str(dtype):>14}: {per_token:,} bytes per token = 2 (K, V) x layers x "
            f"kv_heads x head_dim x {dtype.itemsize} B; 1 GiB holds {GIB // per_token:,} tokens"
        )
    mha = 2 * config.num_layers * config.num_heads * config.head_dim * 4
    print(
        f"  without GQA (one KV head per query head) a token would take {mha:,} bytes: "
        f"{GIB // mha:,} tokens per GiB"
    )


# %% [markdown]
# ## Scattered slots in the page table
#
# Three requests: `A` had 4 of its 10 prompt tokens found in a prefix cache (so only 6 are
# computed), `B` and `C` are decoding (one new token each). Their slots come from a shuffled
# pool, as they would after requests come and go. `store_kv` then writes one layer's new K/V
# exactly at `out_loc`.


# %%
def show_tables() -> None:
    torch.manual_seed(0)
    pool = MHAKVCache(
        48,
        num_layers=2,
        num_kv_heads=1,
        head_dim=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    page_table = torch.zeros(4, 16, dtype=torch.int32)
    table = TableManager(4, page_table)
    free_slots = torch.randperm(pool.num_slots).tolist()
    ledgers = {"A": (10, 4), "B": (7, 6), "C": (3, 2)}  # name: (device_len, cached_len)
    reqs = []
    for uid, (name, (seq_len, cached)) in enumerate(ledgers.items()):
        ids = torch.randint(100, 999, (seq_len,), dtype=torch.int32)
        req = Req(
            ids,
            table.allocate(),
            cached_len=cached,
            output_len=4,
            uid=uid,
            sampling_params=SamplingParams(),
        )
        page_table[req.table_idx, :seq_len] = torch.tensor(free_slots[:seq_len])
        free_slots = free_slots[seq_len:]
        table.write_prompt(req)
        reqs.append(req)
        print(
            f"{name}: row {req.table_idx}, cached_len={req.cached_len}, "
            f"device_len={req.device_len}, extend_len={req.extend_len}"
        )
        print(f"   token ids  {table.token_pool[req.table_idx, :seq_len].tolist()}")
        print(f"   KV slots   {page_table[req.table_idx, :seq_len].tolist()}")

    if os.environ.get("MINISGL_CAPTURE_DIR"):  # the site draws the table and pool from this
        rows = [
            {
                "name": name,
                "cached_len": req.cached_len,
                "device_len": req.device_len,
                "slots": page_table[req.table_idx, : req.device_len].tolist(),
            }
            for name, req in zip(ledgers, reqs)
        ]
        Path(os.environ["MINISGL_CAPTURE_DIR"], "ch04_kvcache.page_table.json").write_text(
            json.dumps({"num_slots": pool.num_slots, "reqs": rows})
        )

    batch = Batch(reqs, "prefill")  # the scheduler never mixes phases; prepare_inputs can
    table.prepare_inputs(batch)
    print(f"\nprepare_inputs over the batch ({len(batch.positions)} tokens):")
    print(f"   positions  {batch.positions.tolist()}")
    print(f"   input_ids  {batch.input_ids.tolist()}")
    print(f"   out_loc    {batch.out_loc.tolist()}")

    k = torch.randn(len(batch.out_loc), 1, 4)
    pool.store_kv(k, -k, batch.out_loc, layer_id=1)
    written = pool.k_cache(1).abs().sum(dim=(1, 2)).nonzero().flatten().tolist()
    print(
        f"\nstore_kv(layer 1) wrote slots {written}; layer 0 still has "
        f"{pool.k_cache(0).count_nonzero().item()} nonzero numbers"
    )
    assert sorted(batch.out_loc.tolist()) == written

    next_tokens = torch.tensor([7, 8, 9])
    table.write_next_tokens(batch, next_tokens)
    for name, req in zip(ledgers, reqs):
        print(
            f"next token of {name} lands at position {req.device_len}: "
            f"{table.token_pool[req.table_idx, req.device_len].item()}"
        )

    naive = NaivePrefixCache(torch.device("cpu"))
    match = naive.match_prefix(reqs[0].input_ids)
    print(
        f"\nthe naive prefix cache matches {match.handle.cached_len} tokens, holds "
        f"{naive.size_info.total_size}: every prompt is computed in full"
    )


# %%
if __name__ == "__main__":
    with exit_on_error():
        show_sizes(ModelConfig.from_dir(MODEL))
        print()
        show_tables()
