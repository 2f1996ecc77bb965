"""Chapter 0: a whole LLM inference engine in one file.

Everything later chapters take apart is here in its simplest form: a config read from
config.json, weights as a plain dict of tensors, a decoder forward pass written out layer by
layer, a contiguous KV cache (one growing tensor per layer, no paging), and a greedy loop that
runs one prefill of the prompt and then one decode step per new token. One request at a time,
float32 on CPU. It runs Llama (incl. Llama-3 RoPE scaling), Qwen2 and Qwen3 checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# The parameters of Llama-3 RoPE scaling (see rope_inv_freq).
LLAMA3_ROPE_KEYS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
PROVISION_HINT = "run `.venv/bin/python tools/provision.py` to create the course models"


@dataclass
class TinyConfig:
    """The few numbers of a Hugging Face config.json that the forward pass needs."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (fewer than query heads: grouped-query attention)
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # Llama-3 scaling parameters, or None for plain RoPE
    tie_word_embeddings: bool  # the LM head reuses the embedding matrix
    qkv_bias: bool  # Qwen2 adds a bias to the q/k/v projections
    qk_norm: bool  # Qwen3 RMS-normalizes every query and key head
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> TinyConfig:
        """Read `model_dir/config.json`; accepts old (`rope_theta`, `rope_scaling`) and new
        (`rope_parameters`) RoPE keys."""
        if not Path(model_dir).is_dir():
            raise FileNotFoundError(f"model directory {model_dir} does not exist: {PROVISION_HINT}")
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {model_dir}: {PROVISION_HINT}")
        c = json.loads(path.read_text())
        if c.get("model_type") not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {c.get('model_type')!r} in {path} is not supported; "
                f"tiny_engine runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if c.get("attention_bias") or c.get("mlp_bias"):
            raise ValueError(f"{path}: attention_bias / mlp_bias checkpoints are not supported")
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_type {rope_type!r} is not supported (default, llama3)")
        eos = c.get("eos_token_id")  # an id, a list of ids, or absent
        return cls(
            model_type=c["model_type"],
            hidden_size=c["hidden_size"],
            num_layers=c["num_hidden_layers"],
            num_heads=c["num_attention_heads"],
            num_kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
            head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
            intermediate_size=c["intermediate_size"],
            rms_norm_eps=c["rms_norm_eps"],
            rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
            rope_scaling={k: rope[k] for k in LLAMA3_ROPE_KEYS} if rope_type == "llama3" else None,
            tie_word_embeddings=c.get("tie_word_embeddings", False),
            qkv_bias=c["model_type"] == "qwen2",
            qk_norm=c["model_type"] == "qwen3",
            eos_token_ids=tuple(eos) if isinstance(eos, list) else () if eos is None else (eos,),
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Scale each vector along the last dim to unit root-mean-square, then by `weight`:
    x / sqrt(mean(x**2) + eps) * weight."""
    raise NotImplementedError("ch00: Scale each vector along the last dim to unit root-mean-square, then by `weight`:")


def rope_inv_freq(config: TinyConfig) -> torch.Tensor:
    """The head_dim/2 rotation speeds theta**(-2i/head_dim) of RoPE, float32.

    With Llama-3 scaling, slow (long-wavelength) frequencies are divided by `factor`, fast ones
    are kept, and the band between low_freq_factor and high_freq_factor is interpolated
    smoothly."""
    raise NotImplementedError("ch00: The head_dim/2 rotation speeds theta**(-2i/head_dim) of RoPE, float32.")


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., seq, head_dim] by angle position * inv_freq, HF "rotate half" convention:
    dim i pairs with dim i + head_dim/2. Computed in float32, returned in x's dtype."""
    raise NotImplementedError("ch00: Rotate x [..., seq, head_dim] by angle position * inv_freq, HF \"rotate half\" convention:")


class KVCache:
    """The contiguous KV cache of one request: per layer, K and V of shape
    [num_kv_heads, tokens, head_dim], grown by torch.cat at every step (no paging)."""

    def __init__(self, config: TinyConfig) -> None:
        empty = torch.empty(config.num_kv_heads, 0, config.head_dim)
        self.k = [empty] * config.num_layers
        self.v = [empty] * config.num_layers

    def __len__(self) -> int:
        """Tokens cached so far, which is also the position of the next token."""
        return self.k[0].shape[1]

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add new keys/values of one layer; return all keys and values cached so far."""
        raise NotImplementedError("ch00: Add new keys/values of one layer; return all keys and values cached so far.")


class TinyModel:
    """A decoder-only transformer whose weights are a plain dict {HF name: tensor}."""

    def __init__(self, model_dir: str | Path) -> None:
        self.config = TinyConfig.from_dir(model_dir)
        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {model_dir}: {PROVISION_HINT}")
        self.w: dict[str, torch.Tensor] = {}
        for f in files:
            self.w.update({k: t.float() for k, t in load_file(f).items()})
        embed = self.w["model.embed_tokens.weight"]
        self.lm_head = embed if self.config.tie_word_embeddings else self.w["lm_head.weight"]
        self.inv_freq = rope_inv_freq(self.config)

    def _linear(self, x: torch.Tensor, name: str, bias: bool = False) -> torch.Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w[name + ".bias"] if bias else None)

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv: KVCache
    ) -> torch.Tensor:
        """Run new tokens through the model; return the logits [vocab] of the last position.

        input_ids [seq] sit at `positions` [seq]; their K/V are appended to `kv`. Prefill
        passes the whole prompt, decode passes one token: the same code serves both."""
        raise NotImplementedError("ch00: Run new tokens through the model; return the logits [vocab] of the last position.")


class TinyEngine:
    """Model + tokenizer + greedy decoding loop, one request at a time."""

    def __init__(self, model_dir: str | Path) -> None:
        # transformers is imported here: its AutoTokenizer costs ~2 s to import, which a test
        # of the model alone should not pay.
        from transformers import AutoTokenizer

        self.model = TinyModel(model_dir)  # raises FileNotFoundError for a missing directory
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def generate_ids(
        self, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False
    ) -> list[int]:
        """Greedy decoding: prefill the whole prompt once, then feed back one token per step.

        Every step reuses the KV cache. Stops after max_new_tokens or at EOS (which is
        included)."""
        raise NotImplementedError("ch00: Greedy decoding: prefill the whole prompt once, then feed back one token per step.")

    def generate(self, prompt: str, max_new_tokens: int) -> str:
        """Tokenize `prompt`, decode greedily, and return the new text."""
        raise NotImplementedError("ch00: Tokenize `prompt`, decode greedily, and return the new text.")
