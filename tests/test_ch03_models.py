"""Chapter 3 tests: model config, the Llama/Qwen2/Qwen3 decoder, the registry, weight loading.

Expected values come from transformers at test time: its parsed configs, its modules (which
projections carry a bias, whether q/k are normalized, whether the head is tied), its parameter
count, the checkpoint's own tensors, and its logits on the same prompt. Batches are assembled by
hand, as the engine will do later: each request gets a page-table row whose slots are contiguous
in an `MHAKVCache`, and the (early) `TorchAttnBackend` attends over them.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from conftest import load_hf_model, load_tokenizer
from course.differential import (
    EXACT,
    Tolerance,
    assert_same_call,
    differences,
    use_reference_stubs,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention

from minisgl.attention.torch_backend import TorchAttnBackend
from minisgl.core import Batch, Context, Req, SamplingParams
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.models import MODEL_REGISTRY, ModelConfig, create_model, load_weights
from minisgl.models.llama import LlamaForCausalLM, LlamaMLP
from minisgl.models.weight import map_weight_name
from minisgl.utils import ModelNotFoundError, UnsupportedModelError

# Logits are O(10) and pass through up to 30 float32 layers; ours and transformers' differ only
# in summation order (measured: below 1e-5). A wrong RoPE base or a skipped norm is far above.
LOGITS_ATOL, LOGITS_RTOL = 1e-3, 1e-4

MODELS = Path(__file__).resolve().parents[1] / "models"
SMOLLM2 = "SmolLM2-135M-Instruct"
TINY = ["tiny-llama", "tiny-qwen2", "tiny-qwen3"]
# Loading SmolLM2's 135M weights (ours and transformers') can take seconds on a cold disk.
ALL_MODELS = [*TINY, pytest.param(SMOLLM2, marks=pytest.mark.slow)]
CONFIGS = [*TINY, SMOLLM2]  # tests that read only config.json
PROMPT = "The capital of France is"
CPU = torch.device("cpu")
# Load failures must name the tensor; a student may raise either type.
LOAD_ERRORS = (ValueError, KeyError)


def model_dir(name: str) -> Path:
    path = MODELS / name
    assert (path / "config.json").is_file(), (
        f"{path} is missing: run `.venv/bin/python tools/provision.py`"
    )
    return path


def config_json(name: str) -> dict:
    return json.loads((model_dir(name) / "config.json").read_text())


def checkpoint(name: str) -> dict[str, torch.Tensor]:
    return load_file(model_dir(name) / "model.safetensors")


def build(config: ModelConfig, name: str) -> torch.nn.Module:
    model = create_model(config, CPU, torch.float32)
    load_weights(model, model_dir(name), progress=False)
    return model


@lru_cache(maxsize=None)
def our_model(name: str) -> torch.nn.Module:
    """Our model of a provisioned directory, loaded once per session (inside the first test
    that needs it, so a broken chapter fails tests instead of erroring a fixture)."""
    return build(ModelConfig.from_dir(model_dir(name)), name)


def prompt_ids(name: str, text: str = PROMPT) -> list[int]:
    return load_tokenizer(model_dir(name)).encode(text)


def hf_last_logits(name: str, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return load_hf_model(model_dir(name))(torch.tensor([ids])).logits[0, -1]


class HandBatches:
    """Requests with a page-table row each, whose KV slots are contiguous in the pool (the
    scheduler's job from chapter 7 on); `forward` runs one prefill or decode batch of them."""

    def __init__(self, config: ModelConfig, prompts: list[list[int]], max_tokens: int = 4) -> None:
        row_len = max(map(len, prompts)) + max_tokens
        self.kv_cache = MHAKVCache(
            len(prompts) * row_len,
            config.num_layers,
            config.num_kv_heads,
            config.head_dim,
            torch.float32,
            CPU,
        )
        self.page_table = torch.arange(len(prompts) * row_len, dtype=torch.int32).view(-1, row_len)
        self.backend = TorchAttnBackend(self.kv_cache, self.page_table)
        self.ctx = Context(1, self.kv_cache, self.page_table, self.backend)
        params = SamplingParams(max_tokens=max_tokens)
        self.reqs = [
            Req(
                torch.tensor(ids, dtype=torch.int32),
                table_idx=i,
                cached_len=0,
                output_len=max_tokens,
                uid=i,
                sampling_params=params,
            )
            for i, ids in enumerate(prompts)
        ]

    def forward(self, model: torch.nn.Module) -> torch.Tensor:
        """Logits [requests, vocab]: compute positions [cached_len, device_len) of every request."""
        batch = Batch(self.reqs, "prefill" if self.reqs[0].cached_len == 0 else "decode")
        spans = [(r, torch.arange(r.cached_len, r.device_len)) for r in self.reqs]
        batch.input_ids = torch.cat([r.input_ids[pos] for r, pos in spans])
        batch.positions = torch.cat([pos for _, pos in spans])
        batch.out_loc = torch.cat([self.page_table[r.table_idx, pos] for r, pos in spans])
        self.backend.prepare_metadata(batch)
        with torch.inference_mode(), self.ctx.forward_batch(batch):
            return model()

    def append(self, tokens: list[int]) -> None:
        for req, token in zip(self.reqs, tokens):
            req.complete_one()
            req.append_host(token)


def our_last_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return HandBatches(model.config, [ids]).forward(model)[0]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def assert_no_scaling(config: ModelConfig) -> None:
    """Plain RoPE: no scaling dict (or one that says so)."""
    assert config.rope_scaling is None or config.rope_scaling.get("rope_type") == "default"


def assert_scaling(config: ModelConfig, expected: dict) -> None:
    """config.rope_scaling carries every entry of `expected` (rope_type included)."""
    assert config.rope_scaling is not None
    assert {key: config.rope_scaling.get(key) for key in expected} == expected


# --- ModelConfig.from_hf -------------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_from_hf_reads_the_shape_transformers_reads(name):
    config = ModelConfig.from_hf(config_json(name))
    hf = AutoConfig.from_pretrained(model_dir(name))
    assert config.architecture == hf.architectures[0]
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (
        hf.vocab_size,
        hf.hidden_size,
        hf.intermediate_size,
    )
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (
        hf.num_hidden_layers,
        hf.num_attention_heads,
        hf.num_key_value_heads,
        hf.head_dim,
    )
    assert config.rms_norm_eps == hf.rms_norm_eps
    assert config.rope_theta == hf.rope_parameters["rope_theta"]
    assert config.max_position_embeddings == hf.max_position_embeddings
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    eos = hf.eos_token_id
    assert tuple(config.eos_token_ids) == (tuple(eos) if isinstance(eos, list) else (eos,))


@pytest.mark.parametrize("name", ALL_MODELS)
def test_from_hf_switches_match_the_transformers_modules(name):
    config = ModelConfig.from_hf(config_json(name))
    hf = load_hf_model(model_dir(name))
    attn = hf.model.layers[0].self_attn
    assert config.qkv_bias == (attn.q_proj.bias is not None)  # Qwen2 only
    assert config.qkv_bias == (attn.k_proj.bias is not None) == (attn.v_proj.bias is not None)
    assert config.o_bias == (attn.o_proj.bias is not None)  # never for Qwen2
    assert config.qk_norm == hasattr(attn, "q_norm")  # Qwen3 only
    assert config.tie_word_embeddings == (hf.lm_head.weight is hf.model.embed_tokens.weight)


def test_from_hf_llama_attention_bias_puts_a_bias_on_qkv_and_o_like_transformers():
    raw = config_json("tiny-llama") | {"attention_bias": True}
    hf_attn = LlamaAttention(AutoConfig.for_model(**raw), layer_idx=0)
    config = ModelConfig.from_hf(raw)
    assert hf_attn.q_proj.bias is not None and hf_attn.o_proj.bias is not None
    assert config.qkv_bias and config.o_bias
    assert not config.qk_norm


@pytest.mark.parametrize("name", CONFIGS)
def test_from_hf_keeps_rope_scaling_only_for_non_default_rope(name):
    config = ModelConfig.from_hf(config_json(name))
    params = dict(AutoConfig.from_pretrained(model_dir(name)).rope_parameters)
    params.pop("rope_theta")
    if params["rope_type"] == "default":
        assert_no_scaling(config)
    else:  # tiny-llama: Llama-3 scaling, with every parameter the frequencies need
        assert_scaling(config, params)


@pytest.mark.parametrize("name", CONFIGS)
def test_from_hf_reads_old_style_top_level_rope_theta_and_rope_scaling(name):
    """transformers < 5 wrote `rope_theta` (and `rope_scaling`) at the top level of config.json."""
    old = config_json(name)
    rope = dict(old.pop("rope_parameters"))
    old["rope_theta"] = rope.pop("rope_theta")
    if rope["rope_type"] != "default":
        old["rope_scaling"] = rope
    hf = AutoConfig.for_model(
        old["model_type"], **{k: v for k, v in old.items() if k != "model_type"}
    )
    config = ModelConfig.from_hf(old)
    assert config.rope_theta == hf.rope_parameters["rope_theta"]
    expected = {k: v for k, v in hf.rope_parameters.items() if k != "rope_theta"}
    if expected["rope_type"] == "default":
        assert_no_scaling(config)
    else:
        assert_scaling(config, expected)
    # Same model, either spelling.
    new = ModelConfig.from_hf(config_json(name))
    assert dataclasses.replace(config, rope_scaling=None) == dataclasses.replace(
        new, rope_scaling=None
    )


def test_from_hf_fills_what_a_minimal_config_leaves_out_like_transformers():
    minimal = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "rms_norm_eps": 1e-5,
    }
    hf = LlamaConfig(**{k: v for k, v in minimal.items() if k != "architectures"})
    config = ModelConfig.from_hf(minimal)
    assert config.num_kv_heads == hf.num_key_value_heads  # no GQA: one KV head per query head
    assert config.head_dim == hf.head_dim  # hidden_size // num_heads
    assert config.rope_theta == hf.rope_parameters["rope_theta"]
    assert_no_scaling(config)
    assert not (config.qkv_bias or config.o_bias or config.qk_norm)


def test_from_dir_reads_config_json_and_names_what_is_missing(tmp_path):
    name = "tiny-qwen2"
    assert ModelConfig.from_dir(model_dir(name)) == ModelConfig.from_hf(config_json(name))
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="provision.py") as err:
        ModelConfig.from_dir(missing)
    assert str(missing) in str(err.value)
    with pytest.raises(ModelNotFoundError, match="config.json"):
        ModelConfig.from_dir(tmp_path)  # a directory, but not a model


# --- the registry --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_MODELS)
def test_create_model_has_exactly_the_parameters_of_the_transformers_model(name):
    config = ModelConfig.from_hf(config_json(name))
    model = create_model(config, CPU, torch.float32)
    assert isinstance(model, MODEL_REGISTRY[config.architecture])
    hf = load_hf_model(model_dir(name))
    # Merged qkv / gate_up hold the same numbers; a tied head adds no parameter on either side.
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in hf.parameters())
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_create_model_builds_on_the_device_in_the_dtype_and_restores_the_default_dtype():
    config = ModelConfig.from_hf(config_json("tiny-qwen3"))
    default = torch.get_default_dtype()
    model = create_model(config, torch.device("meta"), torch.bfloat16)  # meta: shapes, no memory
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert torch.get_default_dtype() == default


def test_create_model_rejects_an_unsupported_architecture_listing_the_supported_ones():
    config = dataclasses.replace(
        ModelConfig.from_hf(config_json("tiny-llama")), architecture="MistralForCausalLM"
    )
    with pytest.raises(UnsupportedModelError, match="MistralForCausalLM") as err:
        create_model(config, CPU, torch.float32)
    for supported in MODEL_REGISTRY:
        assert supported in str(err.value)


# --- map_weight_name -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoint_name", "ours", "shard"),
    [
        pytest.param(
            "model.layers.7.self_attn.q_proj.weight",
            "model.layers.7.self_attn.qkv_proj.weight",
            0,
            id="q_proj",
        ),
        pytest.param(
            "model.layers.7.self_attn.k_proj.weight",
            "model.layers.7.self_attn.qkv_proj.weight",
            1,
            id="k_proj",
        ),
        pytest.param(
            "model.layers.7.self_attn.v_proj.bias",
            "model.layers.7.self_attn.qkv_proj.bias",
            2,
            id="v_proj_bias",
        ),
        pytest.param(
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.gate_up_proj.weight",
            0,
            id="gate_proj",
        ),
        pytest.param(
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.gate_up_proj.weight",
            1,
            id="up_proj",
        ),
        pytest.param(
            "model.layers.2.self_attn.q_norm.weight",
            "model.layers.2.self_attn.attn.q_norm.weight",
            None,
            id="q_norm",
        ),
        pytest.param(
            "model.layers.2.self_attn.o_proj.weight",
            "model.layers.2.self_attn.o_proj.weight",
            None,
            id="o_proj_unchanged",
        ),
        pytest.param(
            "model.embed_tokens.weight", "model.embed_tokens.weight", None, id="embed_unchanged"
        ),
        pytest.param("lm_head.weight", "lm_head.weight", None, id="lm_head_unchanged"),
    ],
)
def test_map_weight_name_with_the_llama_map(checkpoint_name, ours, shard):
    assert map_weight_name(checkpoint_name, LlamaForCausalLM.WEIGHT_NAME_MAP) == (ours, shard)


def test_map_weight_name_uses_whatever_map_it_is_given():
    name_map = {".w1.": (".w13.", 0), ".w3.": (".w13.", 1)}
    assert map_weight_name("experts.4.w3.weight", name_map) == ("experts.4.w13.weight", 1)
    assert map_weight_name("experts.4.w2.weight", name_map) == ("experts.4.w2.weight", None)
    assert map_weight_name("layers.0.q_proj.weight", {}) == ("layers.0.q_proj.weight", None)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_checkpoint_tensor_maps_to_a_model_parameter(name):
    model = create_model(
        ModelConfig.from_hf(config_json(name)), torch.device("meta"), torch.float32
    )
    params = dict(model.named_parameters())
    with safe_open(model_dir(name) / "model.safetensors", framework="pt") as f:
        for key in f.keys():
            ours, shard = map_weight_name(key, model.WEIGHT_NAME_MAP)
            assert ours in params, key
            sizes = getattr(model.get_submodule(ours.rpartition(".")[0]), "output_sizes", [None])
            assert (shard is not None) == (len(sizes) > 1), f"{key}: shard {shard}"


# --- load_weights --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_MODELS)
def test_load_weights_fills_every_parameter_from_the_checkpoint(name):
    config = ModelConfig.from_hf(config_json(name))
    model = create_model(config, CPU, torch.float32)
    for param in model.parameters():
        param.data.fill_(float("nan"))  # anything left unloaded stays NaN
    load_weights(model, model_dir(name), progress=False)
    unloaded = [n for n, p in model.named_parameters() if p.isnan().any()]
    assert not unloaded, f"never loaded: {unloaded[:3]}"

    ckpt = safe_open(model_dir(name) / "model.safetensors", framework="pt")  # reads on demand
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    for i in (0, config.num_layers - 1):
        layer, pre = model.model.layers[i], f"model.layers.{i}."
        qkv = layer.self_attn.qkv_proj
        assert qkv.weight.shape == (q + 2 * kv, config.hidden_size)
        for part, rows in (("q", slice(0, q)), ("k", slice(q, q + kv)), ("v", slice(q + kv, None))):
            assert torch.equal(
                qkv.weight[rows], ckpt.get_tensor(f"{pre}self_attn.{part}_proj.weight")
            )
            if config.qkv_bias:
                assert torch.equal(
                    qkv.bias[rows], ckpt.get_tensor(f"{pre}self_attn.{part}_proj.bias")
                )
        inter = config.intermediate_size
        gate_up = layer.mlp.gate_up_proj.weight
        assert torch.equal(gate_up[:inter], ckpt.get_tensor(f"{pre}mlp.gate_proj.weight"))
        assert torch.equal(gate_up[inter:], ckpt.get_tensor(f"{pre}mlp.up_proj.weight"))
        assert torch.equal(
            layer.self_attn.o_proj.weight, ckpt.get_tensor(f"{pre}self_attn.o_proj.weight")
        )
        assert torch.equal(
            layer.post_attention_layernorm.weight,
            ckpt.get_tensor(f"{pre}post_attention_layernorm.weight"),
        )
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                assert torch.equal(
                    getattr(layer.self_attn.attn, norm).weight,
                    ckpt.get_tensor(f"{pre}self_attn.{norm}.weight"),
                )
    assert torch.equal(
        model.model.embed_tokens.weight, ckpt.get_tensor("model.embed_tokens.weight")
    )
    if not config.tie_word_embeddings:
        assert torch.equal(model.lm_head.weight, ckpt.get_tensor("lm_head.weight"))


def save_variant(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path


def fresh_tiny_llama() -> torch.nn.Module:
    return create_model(ModelConfig.from_hf(config_json("tiny-llama")), CPU, torch.float32)


def test_load_weights_reads_every_file_of_a_sharded_checkpoint(tmp_path):
    tensors = checkpoint("tiny-llama")
    keys = sorted(tensors)
    # Some checkpoints also carry RoPE's inv_freq buffer, which we recompute instead of loading.
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    save_file(
        {k: tensors[k] for k in keys[::2]} | extra, tmp_path / "model-00001-of-00002.safetensors"
    )
    save_file({k: tensors[k] for k in keys[1::2]}, tmp_path / "model-00002-of-00002.safetensors")
    model = fresh_tiny_llama()
    load_weights(model, tmp_path, progress=False)
    reference = our_model("tiny-llama")
    for (name, param), ref in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(param, ref), name


# The error must name the tensor: the checkpoint's name or ours (in the merged matrix).
@pytest.mark.parametrize(
    ("dropped", "named"),
    [
        pytest.param(
            "model.layers.1.self_attn.v_proj.weight",
            r"layers\.1\.self_attn\.(v|qkv)_proj",
            id="merged_shard",
        ),
        pytest.param("model.norm.weight", r"model\.norm", id="plain_tensor"),
    ],
)
def test_load_weights_names_a_missing_tensor(tmp_path, dropped, named):
    tensors = checkpoint("tiny-llama")
    del tensors[dropped]
    with pytest.raises(LOAD_ERRORS, match=named):
        load_weights(fresh_tiny_llama(), save_variant(tmp_path, tensors), progress=False)


@pytest.mark.parametrize(
    ("key", "shape", "named"),
    [
        # A merged shard with one column too many.
        pytest.param(
            "model.layers.0.self_attn.k_proj.weight",
            (32, 65),
            r"layers\.0\.self_attn\.(k|qkv)_proj",
            id="merged_shard",
        ),
        # A shape that copy_ would silently broadcast.
        pytest.param("model.norm.weight", (1,), r"model\.norm", id="broadcastable"),
    ],
)
def test_load_weights_rejects_a_misshapen_tensor_naming_it(tmp_path, key, shape, named):
    tensors = checkpoint("tiny-llama")
    tensors[key] = torch.ones(shape)
    with pytest.raises(LOAD_ERRORS, match=named):
        load_weights(fresh_tiny_llama(), save_variant(tmp_path, tensors), progress=False)


def test_load_weights_rejects_a_tensor_the_model_has_no_place_for(tmp_path):
    tensors = checkpoint("tiny-llama") | {"model.layers.0.mlp.extra_proj.weight": torch.ones(4, 4)}
    with pytest.raises(LOAD_ERRORS, match="extra_proj"):
        load_weights(fresh_tiny_llama(), save_variant(tmp_path, tensors), progress=False)


def test_load_weights_without_safetensors_files_raises_model_not_found(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config_json("tiny-llama")))
    with pytest.raises(ModelNotFoundError):
        load_weights(fresh_tiny_llama(), tmp_path, progress=False)


# --- the forward pass ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_MODELS)
def test_prefill_logits_of_the_last_token_match_transformers(name):
    ids = prompt_ids(name)
    logits = our_last_logits(our_model(name), ids)
    assert logits.shape == (our_model(name).config.vocab_size,)
    torch.testing.assert_close(
        logits, hf_last_logits(name, ids), atol=LOGITS_ATOL, rtol=LOGITS_RTOL
    )


@pytest.mark.parametrize("name", TINY)
def test_a_batch_of_two_prompts_gives_each_its_own_last_token_logits(name):
    prompts = [
        prompt_ids(name),
        prompt_ids(name, "Once upon a time, in a small village by the sea,"),
    ]
    logits = HandBatches(our_model(name).config, prompts).forward(our_model(name))
    assert logits.shape == (2, our_model(name).config.vocab_size)
    for row, ids in zip(logits, prompts):
        torch.testing.assert_close(
            row, hf_last_logits(name, ids), atol=LOGITS_ATOL, rtol=LOGITS_RTOL
        )


@pytest.mark.parametrize("name", TINY)
def test_a_decode_step_after_prefill_matches_transformers_on_the_longer_sequence(name):
    ids = prompt_ids(name, PROMPT + " Paris")
    run = HandBatches(our_model(name).config, [ids[:-1]])
    run.forward(our_model(name))  # prefill: fills the KV cache of the prompt
    run.append([ids[-1]])  # as if " Paris" had been sampled
    logits = run.forward(our_model(name))  # decode: one token at position len(prompt)
    torch.testing.assert_close(
        logits[0], hf_last_logits(name, ids), atol=LOGITS_ATOL, rtol=LOGITS_RTOL
    )


def skip_qk_norm(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.attn.q_norm = layer.self_attn.attn.k_norm = None


# Mistakes a student could make in the config or the layers. The logits check above must catch
# each: the correct model is within the tolerance, the broken one far outside it.
MISTAKES = [  # model, change to the config, change to the loaded model
    pytest.param(
        "tiny-llama",
        lambda c: dataclasses.replace(c, rope_theta=2 * c.rope_theta),
        None,
        id="rope_theta_doubled",
    ),
    pytest.param(
        "tiny-qwen2",
        lambda c: dataclasses.replace(c, rope_theta=10000.0),
        None,
        id="rope_theta_default",
    ),
    pytest.param(
        "tiny-llama",
        lambda c: dataclasses.replace(c, rope_scaling=None),
        None,
        id="llama3_scaling_ignored",
    ),
    pytest.param("tiny-qwen3", lambda c: c, skip_qk_norm, id="qk_norm_skipped"),
    pytest.param(
        SMOLLM2,
        lambda c: dataclasses.replace(c, rope_theta=10000.0),
        None,
        id="smollm2_rope_theta_default",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("name", "change_config", "break_model"), MISTAKES)
def test_logits_check_catches_a_wrong_rope_or_a_skipped_qk_norm(name, change_config, break_model):
    # A longer prompt: RoPE mistakes grow with the distance between positions.
    ids = prompt_ids(name, "The capital of France is Paris, and the capital of Italy is")
    expected = hf_last_logits(name, ids)
    good = max_diff(our_last_logits(our_model(name), ids), expected)
    broken = build(change_config(our_model(name).config), name)
    if break_model is not None:
        break_model(broken)
    bad = max_diff(our_last_logits(broken, ids), expected)
    tolerance = LOGITS_ATOL + LOGITS_RTOL * expected.abs().max().item()
    assert good <= tolerance < bad, f"correct model off by {good:.2e}, broken one by {bad:.2e}"


def test_from_hf_keeps_an_explicit_head_dim_that_is_not_hidden_size_over_heads():
    # Like Qwen3-0.6B (hidden 1024, 16 heads, head_dim 128): the projections are wider than
    # hidden_size, so a model built with hidden_size // heads would not fit the checkpoint.
    from transformers import AutoModelForCausalLM  # only this test builds a model from a config

    raw = config_json("tiny-qwen3")
    raw["head_dim"] = 2 * raw["hidden_size"] // raw["num_attention_heads"]
    hf_config = AutoConfig.for_model(**raw)
    config = ModelConfig.from_hf(raw)
    assert config.head_dim == hf_config.head_dim
    model = create_model(config, torch.device("meta"), torch.float32)
    hf = AutoModelForCausalLM.from_config(hf_config)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in hf.parameters())


def test_from_hf_keeps_every_id_of_a_list_of_eos_ids():
    # Llama 3 Instruct ends a turn at either of two tokens: both must stop generation.
    raw = config_json("tiny-llama") | {"eos_token_id": [2, 3]}
    hf_config = AutoConfig.for_model(**raw)
    assert ModelConfig.from_hf(raw).eos_token_ids == tuple(hf_config.eos_token_id)


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. The decoder's stubs run inside a forward (the context's
# batch and its KV cache), so they are compared as runs: a forward with your code, and the
# same forward with the reference's body of that one stub in its place. So are create_model
# (which must leave the default dtype as it found it) and load_weights (which fills a model).

HIDDEN_TOLERANCE = Tolerance(rtol=1e-4, atol=1e-4)  # float32, O(1) values: summation order
SEEDS = st.integers(0, 2**16)
NAME_MAP = LlamaForCausalLM.WEIGHT_NAME_MAP


def assert_same_run(stub: str, run, what: str, tolerance: Tolerance = EXACT) -> None:  # noqa: ANN001
    """`run()` with your code, then with the reference's body of `stub` ("path:Symbol") alone
    in its place: their results (an exception as the text `run` makes of it) must match."""

    def outcome() -> object:
        try:
            return run()
        except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
            return f"raised {type(error).__name__}"

    yours = outcome()
    with use_reference_stubs(3, only={stub}):
        reference = outcome()
    assert reference != "raised NotImplementedError", f"{what}: it calls code not written yet"
    found = differences(yours, reference, "result", tolerance)
    assert not found, f"{stub} differs from the reference on {what}:\n  " + "\n  ".join(found)


# Llama-3 RoPE on a small model (head_dim 8, base 10000): one frequency interpolated, the
# slower ones divided by factor.
LLAMA3_SCALING_FOR_TESTS = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
LLAMA3_SCALING_STRATEGY = st.fixed_dictionaries(
    {
        "rope_type": st.just("llama3"),
        "factor": st.sampled_from([8.0, 32.0]),
        "low_freq_factor": st.sampled_from([1.0, 0.5]),
        "high_freq_factor": st.sampled_from([4.0]),
        "original_max_position_embeddings": st.sampled_from([8192, 64]),
    }
)
# A small decoder of each kind: Llama with Llama-3 RoPE (and with attention_bias: q/k/v and o
# biases), Qwen2 (q/k/v bias), Qwen3 (q/k norm, tied head, head_dim wider than hidden / heads).
VARIANTS = {
    "llama": dict(architecture="LlamaForCausalLM", rope_scaling=LLAMA3_SCALING_FOR_TESTS),
    "llama-bias": dict(architecture="LlamaForCausalLM", qkv_bias=True, o_bias=True),
    "qwen2": dict(architecture="Qwen2ForCausalLM", qkv_bias=True),
    "qwen3": dict(
        architecture="Qwen3ForCausalLM", qk_norm=True, tie_word_embeddings=True, head_dim=16
    ),
}


def small_config(variant: str, num_layers: int = 2) -> ModelConfig:
    base = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        qkv_bias=False,
        o_bias=False,
        qk_norm=False,
        eos_token_ids=(2,),
    )
    return ModelConfig(**(base | VARIANTS[variant]))


def seeded(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn from `seed`: norm weights around 1, biases around 0, matrices
    scaled by 1/sqrt(fan-in), so activations stay O(1) through every layer."""
    for i, (name, param) in enumerate(module.named_parameters()):
        values = torch.randn(param.shape, generator=torch.Generator().manual_seed(seed + i))
        if param.dim() == 2:
            values = values / param.shape[-1] ** 0.5
        else:
            values = (1.0 if name.endswith("norm.weight") else 0.0) + 0.2 * values
        param.data.copy_(values)
    return module


@lru_cache(maxsize=None)
def small_model(variant: str, num_layers: int) -> LlamaForCausalLM:
    """A seeded small model of `variant` (built directly: create_model is compared below)."""
    return seeded(LlamaForCausalLM(small_config(variant, num_layers)).eval(), num_layers)


class RandomCacheBatch:
    """A batch of requests whose earlier tokens' K/V sit in the pool already (random values,
    as earlier steps left them): each request (cached_len, extend_len) computes extend_len new
    tokens on top of cached_len cached ones, in slots of a page-table row of its own."""

    def __init__(self, config: ModelConfig, spans: list[tuple[int, int]], seed: int) -> None:
        row_len = max(c + e for c, e in spans)
        generator = torch.Generator().manual_seed(seed)
        self.kv_cache = MHAKVCache(
            len(spans) * row_len, config.num_layers, config.num_kv_heads, config.head_dim,
            torch.float32, CPU,
        )  # fmt: skip
        for layer in range(config.num_layers):
            for cache in (self.kv_cache.k_cache(layer), self.kv_cache.v_cache(layer)):
                cache.copy_(torch.randn(cache.shape, generator=generator))
        page_table = torch.arange(len(spans) * row_len, dtype=torch.int32).view(-1, row_len)
        self.backend = TorchAttnBackend(self.kv_cache, page_table)
        self.ctx = Context(1, self.kv_cache, page_table, self.backend)
        reqs = []
        for i, (cached, extend) in enumerate(spans):
            ids = torch.randint(0, config.vocab_size, (cached + extend,), generator=generator)
            reqs.append(Req(ids.int(), i, cached, 4, i, SamplingParams(max_tokens=4)))
        decode = all(c > 0 and e == 1 for c, e in spans)
        self.batch = Batch(reqs, "decode" if decode else "prefill")
        positions = [torch.arange(r.cached_len, r.device_len) for r in reqs]
        self.batch.input_ids = torch.cat([r.input_ids[p] for r, p in zip(reqs, positions)])
        self.batch.positions = torch.cat(positions)
        self.batch.out_loc = torch.cat(
            [page_table[r.table_idx, p] for r, p in zip(reqs, positions)]
        )
        self.backend.prepare_metadata(self.batch)
        self.tokens = len(self.batch.input_ids)

    def hidden(self, config: ModelConfig, seed: int) -> torch.Tensor:
        """Hidden states [tokens, hidden_size] for a layer's input."""
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(self.tokens, config.hidden_size, generator=generator)


SPANS = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 5)), min_size=1, max_size=3)
DECODE_SPANS = st.lists(st.tuples(st.integers(1, 6), st.just(1)), min_size=1, max_size=3)
FORWARD_INPUTS = dict(
    variant=st.sampled_from(sorted(VARIANTS)),
    num_layers=st.integers(1, 2),
    spans=SPANS | DECODE_SPANS,
    seed=SEEDS,
)


@given(**FORWARD_INPUTS)
@settings(max_examples=12)
def test_llama_attention_forward_matches_the_reference(variant, num_layers, spans, seed):
    """Prefill from an empty cache, chunks on top of cached tokens, decode batches; GQA,
    biases, q/k norm, Llama-3 RoPE. Compared: the output, and the K/V the layer stored."""
    model = small_model(variant, num_layers)
    layer = num_layers - 1

    def run() -> tuple:
        forward = RandomCacheBatch(model.config, spans, seed)
        with forward.ctx.forward_batch(forward.batch):
            out = model.model.layers[layer].self_attn(forward.hidden(model.config, seed))
        return out, forward.kv_cache.k_cache(layer), forward.kv_cache.v_cache(layer)

    assert_same_run("models/llama.py:LlamaAttention.forward", run, "a forward", HIDDEN_TOLERANCE)


@given(
    variant=st.sampled_from(sorted(VARIANTS)),
    leading=st.sampled_from([(0,), (1,), (5,), (2, 3)]),
    seed=SEEDS,
)
@settings(max_examples=12)
def test_llama_mlp_forward_matches_the_reference(variant, leading, seed):
    """Zero tokens up, with any leading shape."""
    mlp = small_model(variant, 1).model.layers[0].mlp
    hidden = torch.randn(*leading, 32, generator=torch.Generator().manual_seed(seed))
    assert_same_call(LlamaMLP.forward, mlp, hidden, tolerance=HIDDEN_TOLERANCE)


@given(**FORWARD_INPUTS, first=st.booleans())
@settings(max_examples=12)
def test_decoder_layer_forward_matches_the_reference(variant, num_layers, spans, seed, first):
    """The first layer (no residual yet) and a later one (the residual stream passed along).
    Compared: the returned (output, residual) pair and the K/V stored; whether the inputs may
    be overwritten in place the contract leaves open (the caller passes them on, never reads
    them again)."""
    model = small_model(variant, num_layers)
    layer = model.model.layers[num_layers - 1]

    def run() -> tuple:
        forward = RandomCacheBatch(model.config, spans, seed)
        hidden = forward.hidden(model.config, seed)
        residual = None if first else forward.hidden(model.config, seed + 1)
        with forward.ctx.forward_batch(forward.batch):
            out = layer(hidden, residual)
        return out, forward.kv_cache.k_cache(num_layers - 1)

    assert_same_run("models/llama.py:LlamaDecoderLayer.forward", run, "a forward", HIDDEN_TOLERANCE)


@given(**FORWARD_INPUTS)
@settings(max_examples=12)
def test_llama_model_forward_matches_the_reference(variant, num_layers, spans, seed):
    """Embedding, every layer with the residual passed along, the final norm: its hidden
    states, and the K/V of every layer."""
    model = small_model(variant, num_layers)

    def run() -> tuple:
        forward = RandomCacheBatch(model.config, spans, seed)
        with forward.ctx.forward_batch(forward.batch):
            out = model.model(forward.batch.input_ids)
        return out, forward.kv_cache._buffer

    assert_same_run("models/llama.py:LlamaModel.forward", run, "a forward", HIDDEN_TOLERANCE)


@given(**FORWARD_INPUTS)
@settings(max_examples=12)
def test_causal_lm_forward_matches_the_reference(variant, num_layers, spans, seed):
    """Logits of the last token of each request: one request or several, prefill, chunked
    prefill and decode batches, with its own LM head or the embedding's (qwen3)."""
    model = small_model(variant, num_layers)

    def run() -> torch.Tensor:
        forward = RandomCacheBatch(model.config, spans, seed)
        with forward.ctx.forward_batch(forward.batch):
            return model()

    assert_same_run(
        "models/llama.py:LlamaForCausalLM.forward",
        run,
        "a forward",
        Tolerance(LOGITS_RTOL, LOGITS_ATOL),
    )


@st.composite
def hf_configs(draw) -> dict:  # noqa: ANN001
    """config.json dicts as transformers 4 and 5 write them for Llama, Qwen2 and Qwen3 (and an
    architecture nobody registered), with the optional keys present, null or absent (where
    transformers' own default is what the reference falls back to)."""
    arch = draw(st.sampled_from(["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]))
    arch = draw(st.sampled_from([arch, arch, "MistralForCausalLM"]))
    heads = draw(st.sampled_from([1, 4, 16]))
    hf = {
        "architectures": [arch],
        "model_type": arch.removesuffix("ForCausalLM").lower(),
        "vocab_size": draw(st.integers(8, 200_000)),
        "hidden_size": heads * draw(st.sampled_from([8, 64])),
        "intermediate_size": draw(st.integers(8, 10_000)),
        "num_hidden_layers": draw(st.integers(1, 64)),
        "num_attention_heads": heads,
        "rms_norm_eps": draw(st.sampled_from([1e-5, 1e-6])),
        # Always there: the fallback when it is not is the contract's free choice.
        "max_position_embeddings": draw(st.sampled_from([2048, 40960, 131072])),
    }
    head_dims = [64, 128, hf["hidden_size"] // heads]
    if arch == "Qwen3ForCausalLM":  # Qwen3's own default head_dim (128) is not hidden / heads
        hf["head_dim"] = draw(st.sampled_from(head_dims))
    optional = {
        "num_key_value_heads": st.sampled_from([1, heads]),
        "head_dim": st.sampled_from([None, *head_dims]),
        "tie_word_embeddings": st.booleans(),
        "attention_bias": st.booleans(),
        "eos_token_id": st.none() | st.integers(0, 10) | st.lists(st.integers(0, 10), max_size=3),
    }
    for key, values in optional.items():
        if draw(st.booleans()):
            hf[key] = draw(values, label=key)
    rope = draw(
        st.sampled_from([{}, {"rope_type": "default"}, {"type": "linear", "factor": 2.0}])
        | LLAMA3_SCALING_STRATEGY
    )
    theta = draw(st.sampled_from([None, 10000.0, 500000.0, 1000000]))
    if draw(st.booleans()):  # transformers >= 5: rope_parameters, theta inside
        hf["rope_parameters"] = rope | ({"rope_theta": theta} if theta is not None else {})
    else:  # older: rope_theta and rope_scaling at the top level
        if theta is not None:
            hf["rope_theta"] = theta
        if rope or draw(st.booleans()):
            hf["rope_scaling"] = rope or None
    return hf


def comparable_config(config: object) -> object:
    """A ModelConfig as its contract fixes it: rope_theta a number (10000 == 10000.0), the
    flags truthy or not, and rope_scaling None for plain RoPE, else its entries (any order;
    a leftover `type` or `rope_theta` in it is no difference)."""
    if not isinstance(config, ModelConfig):
        return config
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    fields["rope_theta"] = float(fields["rope_theta"])
    for flag in ("tie_word_embeddings", "qkv_bias", "o_bias", "qk_norm"):
        fields[flag] = bool(fields[flag])
    scaling = fields["rope_scaling"]
    if scaling is not None and scaling.get("rope_type", "default") != "default":
        fields["rope_scaling"] = {
            key: scaling[key] for key in sorted(scaling) if key not in ("type", "rope_theta")
        }
    else:
        fields["rope_scaling"] = None
    return fields


@given(hf=hf_configs())
@settings(max_examples=60)
def test_from_hf_matches_the_reference(hf):
    """Every key present, null or absent, RoPE settings in either spelling (and old
    `type`-keyed scaling), one EOS id, a list, or none, attention_bias on Llama and Qwen2.
    Compared: the config as its contract fixes it (see comparable_config), and the dict
    passed in, which must be left as it was."""

    def observe(config, cls, hf) -> tuple:  # noqa: ANN001
        return comparable_config(config), hf

    assert_same_call(ModelConfig.from_hf.__func__, ModelConfig, hf, observe=observe)


def model_summary(model: torch.nn.Module) -> dict:
    """What create_model's contract fixes of a model: its class, and every parameter's and
    buffer's name, shape, dtype and device (the weights are uninitialised)."""

    def described(tensors) -> list:  # noqa: ANN001
        return [(n, tuple(t.shape), str(t.dtype), t.device.type) for n, t in tensors]

    return {
        "class": type(model).__name__,
        "parameters": described(model.named_parameters()),
        "buffers": described(model.named_buffers()),
    }


@given(
    variant=st.sampled_from([*sorted(VARIANTS), "MistralForCausalLM", "GPT2LMHeadModel"]),
    device=st.sampled_from(["cpu", "meta"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    default_dtype=st.sampled_from([torch.float32, torch.float64]),
)
@settings(max_examples=20)
def test_create_model_matches_the_reference(variant, device, dtype, default_dtype):
    """Each architecture (and two nobody registered), on the CPU and on meta, in three dtypes,
    whatever the default dtype was. Compared: the model (see model_summary), the default
    dtype after the call, and an unsupported architecture's error with the names it gives."""
    import minisgl.models.registry as registry  # the run swaps create_model there

    if variant in VARIANTS:
        config = small_config(variant)
    else:
        config = dataclasses.replace(small_config("llama"), architecture=variant)

    def run() -> tuple:
        torch.set_default_dtype(default_dtype)
        try:
            model = registry.create_model(config, torch.device(device), dtype)
            made = model_summary(model)
        except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
            message = str(error)
            names = [config.architecture, *MODEL_REGISTRY]
            made = f"raised {type(error).__name__} naming {[n in message for n in names]}"
        finally:
            after = torch.get_default_dtype()
            torch.set_default_dtype(torch.float32)
        return made, str(after)

    assert_same_run("models/registry.py:create_model", run, "building a model")


CHECKPOINT_NAMES = [
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    *(
        f"model.layers.{i}.{part}.{kind}"
        for i in (0, 7, 12)
        for part in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "self_attn.q_norm",
            "self_attn.k_norm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
            "mlp.experts.3.w1",
            "mlp.experts.3.w3",
        )
        for kind in ("weight", "bias")
    ),
]
OTHER_MAPS = [
    {},
    {".w1.": (".w13.", 0), ".w3.": (".w13.", 1)},
    {".gate_proj.": (".gate_up_proj.", 0), ".q_norm.": (".attn.q_norm.", None)},
]


@given(
    name=st.sampled_from(CHECKPOINT_NAMES)
    | st.sampled_from(CHECKPOINT_NAMES).map(lambda n: n.rpartition(".")[0]),  # no suffix
    name_map=st.sampled_from([NAME_MAP, *OTHER_MAPS]),
)
@settings(max_examples=50)
def test_map_weight_name_matches_the_reference(name, name_map):
    """Checkpoint names of every kind (merged shards, renamed norms, names left as they are,
    names without a .weight/.bias suffix), with the Llama map and other maps."""
    assert_same_call(map_weight_name, name, name_map)


def checkpoint_of(model: torch.nn.Module, seed: int, dtype: torch.dtype) -> dict:
    """The tensors a Hugging Face checkpoint of `model` holds, under its names (q/k/v and
    gate/up apart, the norms of q and k under self_attn): random values of `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, param in model.named_parameters():
        parts = [(name, param.shape)]
        for theirs, (ours, shard) in NAME_MAP.items():
            if ours in name:
                module = model.get_submodule(name.rpartition(".")[0])
                sizes = module.output_sizes if shard is not None else [param.shape[0]]
                mine = [k for k, (o, _) in NAME_MAP.items() if o == ours]
                parts = [
                    (name.replace(ours, frag), (size, *param.shape[1:]))
                    for frag, size in zip(mine, sizes)
                ]
                break
        for key, shape in parts:
            tensors[key] = torch.randn(shape, generator=generator).to(dtype)
    return tensors


DEFECTS = st.sampled_from([None, None, "missing", "misshapen", "unexpected", "no files"])


@given(
    variant=st.sampled_from(sorted(VARIANTS)),
    files=st.integers(1, 3),
    extras=st.booleans(),
    defect=DEFECTS,
    which=st.integers(0, 10**6),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=SEEDS,
)
@settings(max_examples=15)
def test_load_weights_matches_the_reference(variant, files, extras, defect, which, dtype, seed):
    """Checkpoints of one to three files, in float32 or bfloat16, with the RoPE buffers and a
    tied model's copy of the embedding as lm_head (extras), and with one tensor missing,
    misshapen or unexpected, or no file at all. Compared: every parameter after a load; for a
    failed one, the error's type (ValueError or KeyError may stand for each other) and
    whether it names the tensor (by its checkpoint name or ours)."""
    import minisgl.models.weight as weight  # the run swaps load_weights there

    config = small_config(variant)
    tensors = checkpoint_of(LlamaForCausalLM(config), seed, dtype)
    if extras:
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
        if config.tie_word_embeddings:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    keys = sorted(tensors)
    key = keys[which % len(keys)]
    named = {key.rpartition(".")[0], map_weight_name(key, NAME_MAP)[0].rpartition(".")[0]}
    if defect == "missing":
        del tensors[key]
    elif defect == "misshapen":
        tensors[key] = torch.ones(1) if tensors[key].dim() == 2 else torch.ones(1, 1)
    elif defect == "unexpected":
        key = "model.layers.0.mlp.extra_proj.weight"
        tensors[key], named = torch.ones(4, 4), {"model.layers.0.mlp.extra_proj"}

    with tempfile.TemporaryDirectory() as folder:
        if defect != "no files":
            for i in range(files):
                part = {k: t for j, (k, t) in enumerate(sorted(tensors.items())) if j % files == i}
                save_file(part, f"{folder}/model-{i + 1:05d}-of-{files:05d}.safetensors")

        def run() -> object:
            model = LlamaForCausalLM(config)
            for param in model.parameters():
                param.data.fill_(float("nan"))  # what is never loaded stays NaN
            try:
                weight.load_weights(model, folder, progress=False)
            except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
                kind = "ValueError" if isinstance(error, KeyError) else type(error).__name__
                return f"raised {kind}, naming the tensor: {any(n in str(error) for n in named)}"
            return dict(model.named_parameters())

        assert_same_run("models/weight.py:load_weights", run, f"a checkpoint ({defect or 'whole'})")
