"""Tests of problem 31 (map_weight_name), alone and inside load_weights on the tiny models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import minisgl.models.weight as weight
from minisgl.core import SamplingParams
from minisgl.models import ModelConfig, create_model
from minisgl.models.llama import LlamaForCausalLM
from submission import map_weight_name

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

LLAMA_MAP = dict(LlamaForCausalLM.WEIGHT_NAME_MAP)


def check(name: str, name_map: dict, expected: tuple) -> None:
    got = map_weight_name(name, dict(name_map))
    assert tuple(got) == expected, f"map_weight_name({name!r}, ...): expected {expected}, got {got}"


def test_example_k_proj():
    check(
        "model.layers.0.self_attn.k_proj.weight",
        LLAMA_MAP,
        ("model.layers.0.self_attn.qkv_proj.weight", 1),
    )


def test_example_unmapped_name():
    check("model.norm.weight", LLAMA_MAP, ("model.norm.weight", None))


@pytest.mark.parametrize(
    "name, expected",
    [
        ("model.layers.11.self_attn.q_proj.bias", ("model.layers.11.self_attn.qkv_proj.bias", 0)),
        ("model.layers.3.self_attn.v_proj.weight", ("model.layers.3.self_attn.qkv_proj.weight", 2)),
        ("model.layers.0.mlp.gate_proj.weight", ("model.layers.0.mlp.gate_up_proj.weight", 0)),
        ("model.layers.0.mlp.up_proj.weight", ("model.layers.0.mlp.gate_up_proj.weight", 1)),
        (
            "model.layers.1.self_attn.q_norm.weight",
            ("model.layers.1.self_attn.attn.q_norm.weight", None),
        ),
        (
            "model.layers.0.self_attn.o_proj.weight",
            ("model.layers.0.self_attn.o_proj.weight", None),
        ),
        ("model.layers.0.mlp.down_proj.weight", ("model.layers.0.mlp.down_proj.weight", None)),
        ("model.embed_tokens.weight", ("model.embed_tokens.weight", None)),
    ],
)
def test_llama_names(name, expected):
    check(name, LLAMA_MAP, expected)


def test_the_first_matching_fragment_wins_once():
    name_map = {".a.": (".b.", 0), ".b.": (".c.", 1)}
    check("x.a.w", name_map, ("x.b.w", 0))  # not mapped again to x.c.w
    check("x.b.w", name_map, ("x.c.w", 1))
    check("x.ab.w", name_map, ("x.ab.w", None))


def test_an_empty_map_changes_nothing():
    check("lm_head.weight", {}, ("lm_head.weight", None))


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_load_weights_with_your_mapping(model, monkeypatch):
    path = MODELS / model
    config = ModelConfig.from_dir(path)
    want = create_model(config, torch.device("cpu"), torch.float32)
    weight.load_weights(want, path, progress=False)
    monkeypatch.setattr(weight, "map_weight_name", map_weight_name)
    got = create_model(config, torch.device("cpu"), torch.float32)
    weight.load_weights(got, path, progress=False)
    want_params = dict(want.named_parameters())
    for name, param in got.named_parameters():
        assert torch.equal(param, want_params[name]), (
            f"{model} loaded with your map_weight_name: parameter {name} differs"
        )


def test_tiny_qwen3_generates_the_same_tokens(monkeypatch):
    from minisgl.llm import LLM

    path = str(MODELS / "tiny-qwen3")
    kwargs = dict(
        num_pages=256, max_running_req=2, max_seq_len=64, cache_type="naive", show_progress=False
    )
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = LLM(path, **kwargs).generate([[1, 2, 3, 4, 5]], params)[0]["token_ids"]
    monkeypatch.setattr(weight, "map_weight_name", map_weight_name)
    got = LLM(path, **kwargs).generate([[1, 2, 3, 4, 5]], params)[0]["token_ids"]
    assert got == want, (
        f"tiny-qwen3 loaded with your map_weight_name:\nexpected {want}\ngot      {got}"
    )
