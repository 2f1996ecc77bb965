"""User-facing errors of the given code: bad input gets one clear line, never a traceback.

Entry points wrap their body in `minisgl.utils.exit_on_error`, which turns a `MinisglError`
(a bad path, an unsupported checkpoint, a request that can never fit) into `error: ...` on
stderr and exit status 1. The examples are run as a user runs them, in a subprocess, against
the `minisgl` tree the tests import.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_MODELS

import minisgl
from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.utils import (
    ConfigError,
    InvalidRequestError,
    MinisglError,
    ModelNotFoundError,
    RequestTooLongError,
    UnsupportedModelError,
    exit_on_error,
)
from stage1_milestone import generate_hand_batched

TREE = Path(minisgl.__file__).resolve().parent.parent  # the tree under test
ENGINE_EXAMPLES = ["stage1_milestone.py", "ch04_kvcache.py", "ch05_attention.py", "ch06_engine.py"]
SUPPORTED = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]


def run_example(name: str, model_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(TREE), "MINISGL_MODEL": str(model_dir)}
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"stderr must be one line, got:\n{result.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert result.returncode == 1
    return lines[0]


def edited_copy(src: Path, dest: Path, **changes) -> Path:
    """A copy of a model directory whose config.json has `changes` applied."""
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(changes)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


# --- the examples, as a user runs them -------------------------------------------------------


@pytest.mark.slow  # a fresh interpreter per example (imports torch and transformers)
@pytest.mark.parametrize("example", ENGINE_EXAMPLES)
def test_example_with_a_missing_model_dir_names_the_path_and_the_provision_command(
    example, tmp_path
):
    missing = tmp_path / "no-such-model"
    line = assert_one_error_line(run_example(example, missing))
    assert str(missing) in line
    assert "tools/provision.py" in line


@pytest.mark.slow
def test_unsupported_architecture_gives_one_line_listing_the_supported_ones(tmp_path):
    model = edited_copy(TINY_MODELS["llama"], tmp_path / "gpt2", architectures=["GPT2LMHeadModel"])
    line = assert_one_error_line(run_example("stage1_milestone.py", model))
    assert "GPT2LMHeadModel" in line
    assert all(name in line for name in SUPPORTED), line


@pytest.mark.slow
def test_unsupported_rope_type_gives_one_line_naming_it(tmp_path):
    config = json.loads((TINY_MODELS["llama"] / "config.json").read_text())
    rope = {**config["rope_parameters"], "rope_type": "yarn"}
    model = edited_copy(TINY_MODELS["llama"], tmp_path / "yarn", rope_parameters=rope)
    line = assert_one_error_line(run_example("stage1_milestone.py", model))
    assert "yarn" in line and "llama3" in line


# --- errors raised in-process ----------------------------------------------------------------


def test_model_dir_without_weights_is_named(tmp_path):
    model = tmp_path / "config-only"
    model.mkdir()
    shutil.copy(TINY_MODELS["llama"] / "config.json", model / "config.json")
    with pytest.raises(ModelNotFoundError, match="safetensors") as error:
        Engine(EngineConfig(str(model), num_pages=16, device="cpu", show_progress=False))
    assert str(model) in str(error.value)


def test_dir_without_config_json_is_named(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json") as error:
        Engine(EngineConfig(str(tmp_path), num_pages=16, device="cpu", show_progress=False))
    assert str(tmp_path) in str(error.value)


def test_unknown_attention_backend_lists_the_available_ones():
    config = EngineConfig(
        str(TINY_MODELS["llama"]),
        attention_backend="flashinfer-typo",
        num_pages=16,
        device="cpu",
        show_progress=False,
    )
    with pytest.raises(ConfigError, match="flashinfer-typo") as error:
        Engine(config)
    assert "torch" in str(error.value) and "flashinfer" in str(error.value)


def test_scheduler_options_of_chapter_23_are_checked_where_they_are_set():
    from minisgl.scheduler import SchedulerConfig

    model = str(TINY_MODELS["llama"])
    with pytest.raises(ConfigError, match="'optimistc'"):
        SchedulerConfig(model, admission="optimistc")
    with pytest.raises(ConfigError, match="max_extend_tokens >= max_running_req"):
        SchedulerConfig(model, mixed_batches=True, max_extend_tokens=8, max_running_req=16)
    SchedulerConfig(model, mixed_batches=True, max_extend_tokens=16, max_running_req=16)


@pytest.mark.parametrize(
    "setting, value, words",
    [
        ("speculative_tokens", 2.5, "speculative_tokens must be of type int, got 2.5 (float)"),
        ("speculative_tokens", "2", "speculative_tokens must be of type int, got '2' (str)"),
        ("speculative_tokens", -1, "speculative_tokens must be >= 0"),
        ("page_size", True, "page_size must be of type int, got True (bool)"),
        ("page_size", 0, "page_size must be >= 1"),
        ("num_pages", 64.0, "num_pages must be of type int or None"),
        ("num_pages", 0, "num_pages must be >= 1"),
        ("kv_cache_gib", 0, "kv_cache_gib must be > 0"),
        ("kv_cache_gib", "1", "kv_cache_gib must be of type float"),
        ("gpu_memory_fraction", 1.5, "gpu_memory_fraction must be <= 1"),
        ("max_running_req", 0, "max_running_req must be >= 1"),
        ("max_seq_len", 0, "max_seq_len must be >= 1"),
        ("cuda_graph_max_bs", -1, "cuda_graph_max_bs must be >= 0"),
        ("seed", 1.5, "seed must be of type int"),
        ("tp_size", 0, "tp_size must be >= 1"),
        ("show_progress", "no", "show_progress must be of type bool"),
        ("max_extend_tokens", 0, "max_extend_tokens must be >= 1"),
        ("max_extend_tokens", 8.0, "max_extend_tokens must be of type int"),
        ("enable_overlap", "yes", "enable_overlap must be of type bool or None"),
        ("mixed_batches", 1, "mixed_batches must be of type bool"),
        ("ngram_max", 0, "ngram_max must be >= 1"),
        ("ngram_min", 2.0, "ngram_min must be of type int"),
    ],
)
def test_every_numeric_setting_is_checked_for_type_and_range_where_it_is_set(
    setting: str, value: object, words: str
) -> None:
    from minisgl.scheduler import SchedulerConfig

    with pytest.raises(ConfigError, match=re.escape(words)):
        SchedulerConfig(str(TINY_MODELS["llama"]), **{setting: value})


def test_triton_kernels_on_a_cpu_without_the_interpreter_are_refused_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CPU Triton runs kernels only in its interpreter: without TRITON_INTERPRET=1 the
    backend (and chapter 19's kernels) would fail in the first step with "0 active drivers"."""
    from minisgl.llm import LLM

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = str(TINY_MODELS["llama"])
    small = dict(device="cpu", num_pages=64, show_progress=False)
    with pytest.raises(ConfigError, match="set TRITON_INTERPRET=1 .*attention_backend='torch'"):
        LLM(model, attention_backend="triton", **small)
    monkeypatch.setenv("MINISGL_KERNELS", "triton")
    with pytest.raises(ConfigError, match="MINISGL_KERNELS=triton on a CPU .*TRITON_INTERPRET=1"):
        LLM(model, **small)


@pytest.fixture(scope="module")
def small_engine() -> Engine:
    """A tiny model with a 40-slot pool."""
    return Engine(
        EngineConfig(
            str(TINY_MODELS["llama"]),
            num_pages=40,
            max_running_req=4,
            device="cpu",
            show_progress=False,
        )
    )


def test_prompt_longer_than_the_pool_is_one_clear_line_and_exit_status_1(small_engine, capsys):
    prompt = list(range(1, 61))  # 60 tokens for a 40-slot pool
    with pytest.raises(SystemExit) as exit_info, exit_on_error():
        generate_hand_batched(small_engine, [prompt], SamplingParams(max_tokens=4))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "60" in err[0] and "40" in err[0], "name the prompt length and the pool size"


def test_requests_that_fit_alone_but_not_together_are_refused_by_the_milestone(small_engine):
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    prompt = list(range(1, 21))  # 24 slots with its output: fits the 40-slot pool alone
    assert len(generate_hand_batched(small_engine, [prompt], params)[0][0]) == 4
    with pytest.raises(RequestTooLongError, match="40 slots"):
        generate_hand_batched(small_engine, [prompt, prompt], params)


# --- exit_on_error itself --------------------------------------------------------------------


def test_exit_on_error_turns_a_minisgl_error_into_one_line_and_status_1(capsys):
    with pytest.raises(SystemExit) as exit_info, exit_on_error():
        raise RequestTooLongError("prompt (9000 tokens) exceeds max_seq_len=8192")
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert captured.err == "error: prompt (9000 tokens) exceeds max_seq_len=8192\n"
    assert captured.out == ""


def test_exit_on_error_lets_a_bug_surface_with_its_traceback():
    """Only user errors are shortened; anything else is a bug and keeps its traceback."""
    with pytest.raises(KeyError), exit_on_error():
        raise KeyError("a bug")
    with pytest.raises(IndexError), exit_on_error():
        torch.empty(2)[5]  # nor is an error from torch
    with exit_on_error():
        pass  # no error: nothing printed, no exit


def test_every_user_error_is_a_minisgl_error_and_keeps_its_builtin_type():
    """Callers may catch the builtin type (FileNotFoundError, ValueError) or MinisglError."""
    for error in (
        ModelNotFoundError,
        UnsupportedModelError,
        InvalidRequestError,
        RequestTooLongError,
    ):
        assert issubclass(error, MinisglError)
    assert issubclass(ModelNotFoundError, FileNotFoundError)
    assert issubclass(UnsupportedModelError, ValueError)
    assert issubclass(RequestTooLongError, InvalidRequestError)
    assert issubclass(InvalidRequestError, ValueError)
