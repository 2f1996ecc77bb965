# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 0: the whole engine in one file
#
# `minisgl.tiny_engine` loads a Hugging Face model directory into a dict of tensors, runs the
# decoder layer by layer with a contiguous KV cache, and decodes greedily: one **prefill** of
# the whole prompt, then one **decode** step per new token. Here we run it on the embedded
# SmolLM2-135M-Instruct and time both phases.

# %%
import os
import sys
import time
from pathlib import Path


def repo_root() -> Path:
    """The repository root: next to this script, or the notebook's working directory."""
    if "__file__" in globals():
        return Path(__file__).resolve().parent.parent
    cwd = Path.cwd()
    return cwd.parent if cwd.name == "examples" else cwd


ROOT = repo_root()
try:
    import minisgl  # noqa: F401  (the tree under test, or the installed package)
except ImportError:  # a plain checkout: use the reference engine next to this script
    sys.path.insert(0, str(ROOT / "solutions"))

from minisgl.tiny_engine import TinyEngine

MODEL = Path(os.environ.get("MINISGL_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct"))
MAX_NEW_TOKENS = 32

# %%
t0 = time.perf_counter()
engine = TinyEngine(MODEL)
cfg = engine.model.config
print(
    f"loaded {MODEL.name} in {time.perf_counter() - t0:.1f} s: {cfg.model_type}, "
    f"{cfg.num_layers} layers, hidden {cfg.hidden_size}, "
    f"{cfg.num_heads} query / {cfg.num_kv_heads} KV heads"
)


# %% [markdown]
# Prefill time is the time to the first token (one forward over the whole prompt). Decode speed
# is measured on the remaining tokens, each a forward over a single token that reuses the cache.


# %%
def run(prompt_ids: list[int]) -> tuple[list[int], float, float]:
    """Generate greedily; return (new token ids, prefill seconds, decode tokens/s)."""
    t0 = time.perf_counter()
    engine.generate_ids(prompt_ids, 1)  # prefill only: the first token comes from it
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = engine.generate_ids(prompt_ids, MAX_NEW_TOKENS)
    decode_s = time.perf_counter() - t0 - prefill_s
    return out, prefill_s, (len(out) - 1) / max(decode_s, 1e-9)


tok = engine.tokenizer
prompts = {
    "The capital of France is": tok.encode("The capital of France is"),
    "The three primary colors are": tok.encode("The three primary colors are"),
    "(chat) What is 2+2?": tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_dict=True
    )["input_ids"],
}
results = {}
for name, ids in prompts.items():
    out, prefill_s, decode_tps = run(ids)
    results[name] = tok.decode(out, skip_special_tokens=True)
    print(f"\n>>> {name}\n{results[name]!r}")
    print(
        f"    {len(ids)} prompt tokens, {len(out)} new tokens, "
        f"prefill {prefill_s * 1000:.0f} ms, decode {decode_tps:.1f} tokens/s"
    )

# %% [markdown]
# Greedy decoding is deterministic, so with the default model the first prompt must continue
# with " Paris".

# %%
if MODEL.name == "SmolLM2-135M-Instruct":
    paris = results["The capital of France is"]
    assert paris.startswith(" Paris"), f"expected ' Paris...', got {paris!r}"
    print("\nOK: the capital of France is Paris")
