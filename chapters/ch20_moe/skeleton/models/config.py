"""The model's shape, read from a Hugging Face config.json.

Llama, Qwen2 and Qwen3 share one decoder; they differ in a few switches, which this module
derives from the architecture name so the decoder code never asks "which model am I?".
A mixture-of-experts model (Qwen3-MoE) is the same decoder with some MLPs replaced by experts:
`MoeConfig` says which layers and how many experts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from minisgl.utils import ModelNotFoundError


@dataclass(frozen=True)
class MoeConfig:
    """The mixture-of-experts block of the layers in `sparse_layers` (the others stay dense)."""

    num_experts: int
    top_k: int  # experts each token is sent to
    intermediate_size: int  # of each expert's gated MLP
    renormalize: bool  # rescale the top-k router probabilities to sum to 1 (norm_topk_prob)
    sparse_layers: tuple[int, ...]

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> MoeConfig | None:
        """The MoE settings of a config.json dict; None for a dense model."""
        num_experts = hf.get("num_experts", hf.get("num_local_experts", 0))
        if not num_experts:
            return None
        # Qwen3-MoE's rule: layer i is sparse unless listed in mlp_only_layers, and only every
        # decoder_sparse_step-th layer is (step 1: all of them).
        dense = set(hf.get("mlp_only_layers", []))
        step = hf.get("decoder_sparse_step", 1)
        return cls(
            num_experts=num_experts,
            top_k=hf["num_experts_per_tok"],
            intermediate_size=hf["moe_intermediate_size"],
            renormalize=bool(hf.get("norm_topk_prob", False)),
            sparse_layers=tuple(
                i for i in range(hf["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0
            ),
        )


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2: bias on the q, k and v projections
    o_bias: bool  # Llama with attention_bias: bias on the output projection too
    qk_norm: bool  # Qwen3: RMSNorm on each head of q and k before RoPE
    eos_token_ids: tuple[int, ...]
    moe: MoeConfig | None = None  # None: every MLP is dense

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not Path(model_dir).is_dir():
            raise ModelNotFoundError(
                f"model directory {model_dir} does not exist "
                "(provision the course models with `.venv/bin/python tools/provision.py`)"
            )
        if not path.is_file():
            raise ModelNotFoundError(
                f"{path} is missing: is {model_dir} a Hugging Face model directory?"
            )
        hf = json.loads(path.read_text())
        # The expert settings sit beside the decoder's shape, read by their own parser.
        return replace(cls.from_hf(hf), moe=MoeConfig.from_hf(hf))

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Read a config.json dict; derive qkv_bias, o_bias and qk_norm from the architecture."""
        architecture = (hf.get("architectures") or [hf.get("model_type", "unknown")])[0]
        # transformers >= 5 writes RoPE settings as `rope_parameters`; older files use
        # `rope_theta` and `rope_scaling` at the top level.
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
        attention_bias = bool(hf.get("attention_bias", False))
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=architecture,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            rms_norm_eps=hf["rms_norm_eps"],
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=architecture == "Qwen2ForCausalLM" or attention_bias,
            o_bias=architecture != "Qwen2ForCausalLM" and attention_bias,
            qk_norm=architecture == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
        )
