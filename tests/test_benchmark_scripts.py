"""`python -m benchmark SUBCOMMAND`: the benchmarks over minisgl.benchmark. Each subcommand runs
for real on tiny-qwen3 on the CPU (the GPU-only ones as far as a CPU lets them), and what they
append to a results file carries the command, the machine and the date. The package is imported
from the repository's root, which `python -m pytest` there puts on the path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_MODELS, require_model

from benchmark.__main__ import SUBCOMMANDS
from minisgl.benchmark import WORKLOADS, make_workload, read_results

MODEL = TINY_MODELS["qwen3"]


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in the repository's root, its output captured."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def run_benchmark(subcommand: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_python("-m", "benchmark", subcommand, *args)


QUICK_REQUESTS = 8  # the offline runs take each workload's first 8 requests (--requests)


def assert_provenance(record: dict, subcommand: str) -> None:
    assert record["command"].startswith(f"python -m benchmark {subcommand} "), record["command"]
    assert record["machine"] and "CPU cores" in record["machine"]
    assert record["date"][:4].isdigit() and "T" in record["date"]


@pytest.mark.slow
def test_offline_runs_both_cpu_workloads_and_records_each_ratio(tmp_path: Path) -> None:
    """The CPU workloads, small (tiny-qwen3, each workload's first 8 requests): each engine row
    and record carries its ratio to transformers from the same run (a record of the figure, not
    a timed assertion)."""
    results = tmp_path / "results.jsonl"
    model = str(require_model(MODEL))
    done = run_benchmark(
        "offline",
        *("--model", model, "--workload", "cpu", "--requests", str(QUICK_REQUESTS)),
        *("--threads", "1", "--tp", "1", "--json", str(results)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"--requests {QUICK_REQUESTS}" in read_results(results)[0]["command"]
    records = read_results(results)
    for name in ("uniform", "mixed"):
        work = make_workload(WORKLOADS[name], 0).first(QUICK_REQUESTS)
        assert len(work.prompts) == QUICK_REQUESTS
        rows = [line.split() for line in done.stdout.splitlines() if line.startswith(name)]
        assert [row[1] for row in rows] == ["transformers", "minisgl"]
        assert all(int(row[3]) == work.output_tokens for row in rows), done.stdout
        assert rows[0][-1] == "1.00", "transformers' own ratio"
        hf, engine = [r for r in records if r["workload"] == name]
        assert [hf["variant"], engine["variant"]] == ["transformers", "minisgl"]
        for record in (hf, engine):
            assert record["benchmark"] == "offline"
            assert record["output_tokens"] == work.output_tokens
            assert record["input_tokens"] == work.input_tokens
            assert_provenance(record, "offline")
        assert hf["vs_transformers"] == 1.0
        throughput = {r["variant"]: r["output_tokens"] / r["seconds"] for r in (hf, engine)}
        expected = throughput["minisgl"] / throughput["transformers"]
        assert engine["vs_transformers"] == pytest.approx(expected)
        assert rows[1][-1] == f"{expected:.2f}", "the printed ratio is the recorded one"


@pytest.mark.slow
def test_offline_repeat_compares_each_variants_median_run(tmp_path: Path) -> None:
    """--repeat 2: every variant runs in both rounds (each run recorded with its round and its
    ratio within the round), then each variant's median run and its ratio to transformers'.
    With --step-times, an engine variant other than the default one also records its steps
    (an ablation's steps say where its time went), and transformers none."""
    results = tmp_path / "results.jsonl"
    done = run_benchmark(
        "offline",
        *("--model", str(require_model(MODEL)), "--workload", "uniform"),
        *("--requests", str(QUICK_REQUESTS), "--step-times"),
        *("--variants", "no-overlap,transformers", "--threads", "1", "--repeat", "2"),
        *("--json", str(results)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_results(results)
    runs = [r for r in records if r["benchmark"] == "offline"]
    assert [(r["round"], r["position"], r["variant"]) for r in runs] == [
        (1, 1, "transformers"),
        (1, 2, "no-overlap"),
        (2, 1, "transformers"),
        (2, 2, "no-overlap"),
    ]
    medians = {r["variant"]: r for r in records if r["benchmark"] == "offline_median"}
    assert set(medians) == {"no-overlap", "transformers"}
    for variant, record in medians.items():
        seconds = sorted(r["seconds"] for r in runs if r["variant"] == variant)
        assert record["all_seconds"] == [r["seconds"] for r in runs if r["variant"] == variant]
        assert record["seconds"] == pytest.approx(sum(seconds) / 2)  # the median of two
        assert record["runs"] == 2 and record["output_tokens"] == 64 * QUICK_REQUESTS
        assert_provenance(record, "offline")
    ratio = medians["transformers"]["seconds"] / medians["no-overlap"]["seconds"]
    assert medians["no-overlap"]["vs_transformers"] == pytest.approx(ratio)
    assert medians["transformers"]["vs_transformers"] == 1.0
    line = next(x for x in done.stdout.splitlines() if "median no-overlap" in x)
    assert line.split()[-1] == f"{ratio:.2f}", "the printed ratio is the recorded one"
    steps = [r for r in records if r["benchmark"] == "offline_steps"]
    assert {r["variant"] for r in steps} == {"no-overlap"}
    # each request's 64 tokens: the first from its prefill, 63 from decode steps run together
    assert sum(r["steps"] for r in steps if r["phase"] == "decode") == 2 * 63
    assert sum(r["seconds"] for r in steps) < sum(r["seconds"] for r in runs)


@pytest.mark.slow
def test_cpu_step_splits_a_decode_step_into_parts_that_add_up(tmp_path: Path) -> None:
    """`cpu-step`: every part names a function that runs in a decode step (a part
    whose function was renamed would read 0 ms), the parts add up to the whole step, and the
    operators' table comes along; all of it appended with its provenance."""
    from benchmark.cpu_step import CPU_STEP_PARTS

    results = tmp_path / "results.jsonl"
    model = str(require_model(MODEL))
    done = run_benchmark(
        "cpu-step",
        *("--model", model, "--batch", "4", "--context", "8", "--warmup", "1"),
        *("--steps", "2", "--threads", "1", "--json", str(results)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_results(results)
    for record in records:
        assert record["batch"] == 4 and record["context"] == 8 and record["threads"] == 1
        assert_provenance(record, "cpu-step")
    (step,) = [r for r in records if r["benchmark"] == "cpu_step"]
    assert step["step_ms"] > 0
    parts = {r["part"]: r["ms"] for r in records if r["benchmark"] == "cpu_step_part"}
    assert list(parts) == [*CPU_STEP_PARTS, "the rest", "whole step"]
    assert all(parts[part] > 0 for part in CPU_STEP_PARTS), parts
    assert parts["the rest"] >= 0, "the parts overlap: one is counted inside another"
    whole = parts.pop("whole step")
    assert sum(parts.values()) == pytest.approx(whole)
    operators = [r for r in records if r["benchmark"] == "cpu_step_op"]
    assert operators and all(r["calls"] >= 1 for r in operators)
    times = [r["ms"] for r in operators]
    assert times == sorted(times, reverse=True), "the operators come most expensive first"
    assert "whole step" in done.stdout and "operator (torch.profiler)" in done.stdout


@pytest.mark.slow
def test_cpu_versus_times_both_sides_in_turn_on_the_same_tokens(tmp_path: Path) -> None:
    """`cpu-versus` on tiny-qwen3: both sides decode the same greedy tokens (it
    exits 1 otherwise), and the record's ratio is transformers' median step over the engine's,
    the one printed, with its provenance."""
    results = tmp_path / "results.jsonl"
    model = str(require_model(MODEL))
    done = run_benchmark(
        "cpu-versus",
        *("--model", model, "--batch", "4", "--context", "8", "--rounds", "2", "--steps", "2"),
        *("--warmup", "1", "--threads", "1", "--json", str(results)),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (record,) = read_results(results)
    assert record["benchmark"] == "cpu_versus"
    assert (record["batch"], record["context"], record["threads"]) == (4, 8, 1)
    assert (record["rounds"], record["steps"]) == (2, 2)
    assert_provenance(record, "cpu-versus")
    for side in ("engine", "transformers"):
        assert 0 < record[f"{side}_fastest_ms"] <= record[f"{side}_ms"]
    ratio = record["transformers_ms"] / record["engine_ms"]
    assert record["vs_transformers"] == pytest.approx(ratio)
    assert f"the engine's: {ratio:.2f}" in done.stdout
    assert "the same 6 tokens per request on every side" in done.stdout  # prefill + 1 + 2 * 2


def test_cpu_versus_takes_turns_side_after_side_in_every_round() -> None:
    from benchmark.cpu_versus import take_turns

    calls: list[str] = []
    sides = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = take_turns(sides, rounds=3, steps=2)
    assert calls == ["a", "a", "b", "b"] * 3
    assert {name: len(t) for name, t in times.items()} == {"a": 6, "b": 6}
    assert all(t >= 0 for t in times["a"] + times["b"])


def test_offline_refuses_an_unknown_variant() -> None:
    done = run_benchmark("offline", "--variants", "minisgl,warp-drive")
    assert done.returncode == 2 and "warp-drive" in done.stderr


@pytest.mark.slow
def test_online_launches_a_server_and_appends_its_figures(tmp_path: Path) -> None:
    results = tmp_path / "online.jsonl"
    done = run_benchmark(
        "online",
        "--launch",
        str(require_model(MODEL)),
        "--num-requests",
        "8",
        "--concurrency",
        "4",
        "--output-len",
        "8",
        "--json",
        str(results),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "minisgl: 8 requests, 0 errors, 0 streams without text, 64 output tokens" in done.stdout
    assert "integrity check passed" in done.stdout
    (record,) = read_results(results)
    assert record["benchmark"] == "online" and record["server"] == "minisgl"
    assert record["errors"] == 0 and record["streams_without_text"] == 0
    assert record["output_tokens"] == 64 and record["pages_in_use_after"] == 0
    assert record["ttft_p50_ms"] <= record["ttft_p99_ms"]
    assert 0 < record["tpot_p50_ms"] <= record["tpot_p99_ms"]
    assert_provenance(record, "online")


@pytest.mark.slow
def test_mixed_measures_both_admissions_and_both_schedules_on_tiny_qwen3(tmp_path: Path) -> None:
    """Chapter 23's benchmark, small: the tight part's two admissions (the same tokens, the
    optimistic one preempting) and the latency part's two schedules, one record each."""
    results = tmp_path / "results.jsonl"
    model = str(require_model(MODEL))
    small = ["--long-prompt", "200", "--budget", "64", "--output-len", "12", "--running", "4"]
    done = run_benchmark(
        "mixed", "--model", model, "--threads", "1", *small, "--json", str(results)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tight = [r for r in read_results(results) if r["benchmark"] == "mixed_tight"]
    itl = [r for r in read_results(results) if r["benchmark"] == "mixed_itl"]
    assert [r["admission"] for r in tight] == ["conservative", "optimistic"]
    assert tight[0]["preemptions"] == 0 and tight[1]["preemptions"] > 0
    assert tight[0]["output_tokens"] == tight[1]["output_tokens"]
    assert tight[1]["same_tokens_share"] == 1.0, "float32: preemption changes no token"
    assert tight[1]["computed_prompt_tokens"] > tight[0]["computed_prompt_tokens"], "recompute"
    assert [r["mixed"] for r in itl] == [False, True]
    for record in itl:
        assert 0 < record["itl_p50_ms"] <= record["itl_p99_ms"] <= record["itl_max_ms"]
        assert record["long_ttft_ms"] > 0
    for record in tight + itl:
        assert_provenance(record, "mixed")


@pytest.mark.slow
def test_speculative_measures_each_k_on_both_workloads_with_plain_tokens(tmp_path: Path) -> None:
    """Chapter 24's benchmark, small: one record per workload, batch size and k, every spec
    run giving the plain run's tokens, with drafts counted only where k > 0."""
    results = tmp_path / "results.jsonl"
    model = str(require_model(MODEL))
    small = ["--ks", "0,2", "--batch-sizes", "1,3", "--output-len", "12", "--prompt-len", "16"]
    done = run_benchmark(
        "speculative", "--model", model, "--threads", "1", *small,
        "--json", str(results),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_results(results)
    assert [(r["k"], r["workload"], r["batch_size"]) for r in records] == [
        (k, w, b) for k in (0, 2) for w in ("copy", "random") for b in (1, 3)
    ]
    for record in records:
        assert_provenance(record, "speculative")
        assert record["same_tokens_share"] == 1.0, "float32: drafts change no token"
        assert record["output_tokens"] > 0 and record["tokens_per_s"] > 0
        if record["k"] == 0:
            assert record["drafted"] == 0 and record["acceptance"] is None
        else:
            assert record["drafted"] > 0 and 0 <= record["acceptance"] <= 1
    random_plain = [r for r in records if r["workload"] == "random" and r["k"] == 0]
    assert all(r["tokens_per_step"] == 1.0 for r in random_plain), "one token per plain step"


@pytest.mark.slow
def test_structured_varies_the_order_of_its_runs_from_round_to_round(tmp_path: Path) -> None:
    """Chapter 25's benchmark, small: three runs a round (free; constrained, overlap on and
    off), the second round in another order, every constrained answer valid JSON."""
    results = tmp_path / "results.jsonl"
    model = str(require_model(MODEL))
    small = ["--prompts", "1", "--max-tokens", "96", "--rounds", "2"]
    done = run_benchmark("structured", "--model", model, *small, "--json", str(results))
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_results(results)
    runs = [(r["constraint"], r["overlap"]) for r in records]
    assert len(records) == 6 and len(set(runs)) == 3
    assert runs[:3] != runs[3:], "the second round in another order"
    for record in records:
        assert_provenance(record, "structured")
        assert 1 <= record["position"] <= 3 and 1 <= record["round"] <= 2
        if record["constraint"] == "json_schema":
            assert record["valid"] == record["prompts"] and record["masked_steps"] > 0


# Every subcommand's --help in one process: a process each cost CI about 30 s of imports.
HELP_OF_EVERY_SUBCOMMAND = """
import contextlib, io
from benchmark.__main__ import SUBCOMMANDS, main
for name in SUBCOMMANDS:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([name, "--help"])
        except SystemExit as stop:
            assert stop.code == 0, (name, stop.code)
    print(name, out.getvalue().splitlines()[0])
"""


def test_every_subcommand_imports_and_parses_its_flags() -> None:
    done = run_python("-c", HELP_OF_EVERY_SUBCOMMAND)
    assert done.returncode == 0, done.stderr[-2000:]
    first_lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    for name in SUBCOMMANDS:
        assert first_lines[name].startswith(f"usage: python -m benchmark {name} "), name


# Each `python3 -m benchmark ...` command of benchmark/run_gpu.sh, its shell variables given
# their defaults (a loop's variable, a placeholder), parsed by its subcommand's own parser and
# stopped there: a flag the subcommand does not know would otherwise be found on a GPU machine.
PARSE_EVERY_GPU_COMMAND = r"""
import argparse, importlib, re, shlex, sys
from pathlib import Path
from benchmark.__main__ import SUBCOMMANDS

class Parsed(Exception):
    pass

parse_args = argparse.ArgumentParser.parse_args
def parse_then_stop(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed

argparse.ArgumentParser.parse_args = parse_then_stop
script = Path("benchmark/run_gpu.sh").read_text().replace("\\\n", " ")
for line in script.splitlines():
    found = re.search(r"python3 -m benchmark (.*)", line)
    if not found:
        continue
    command = re.split(r" (?:2>&1|[|]|;)", found.group(1))[0]
    command = re.sub(r"[$][{]\w+:-([^}]*)[}]", r"\1", command)  # ${VAR:-default}
    command = re.sub(r"[$]\w+", "placeholder", command)  # $OUT, a loop's $backend
    name, *argv = shlex.split(command)
    module = importlib.import_module("benchmark." + SUBCOMMANDS[name][0])
    try:
        module.main(argv)
    except Parsed:
        print("parsed:", name, *argv)
    except SystemExit:
        sys.exit(f"run_gpu.sh: python -m benchmark {command}: its parser refused it")
"""


def test_every_benchmark_command_of_the_gpu_script_parses() -> None:
    done = run_python("-c", PARSE_EVERY_GPU_COMMAND)
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = [line for line in done.stdout.splitlines() if line.startswith("parsed: ")]
    script = (ROOT / "benchmark" / "run_gpu.sh").read_text()
    assert len(parsed) == script.count("python3 -m benchmark ") >= 20, done.stdout


def test_every_stage_of_the_gpu_script_expands_under_set_u(tmp_path: Path) -> None:
    """Every stage, run with python3 and nvidia-smi stubbed to do nothing, expands all its
    variables. An unbound one aborts only its own pipeline and the script goes on with status 0,
    so a stage would silently skip its run on the device: the output is what tells. tar is
    stubbed too: the verdict stage copies the checkout, .venv and all, to judge it."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for command in ("python3", "nvidia-smi", "tar"):
        (stubs / command).write_text("#!/bin/sh\nexit 0\n")
        (stubs / command).chmod(0o755)
    script = ROOT / "benchmark" / "run_gpu.sh"
    stages = re.findall(r"^    (\w+)\)", script.read_text(), flags=re.MULTILINE)
    assert len(stages) >= 20 and "l2_prefetch" in stages
    env = os.environ | {"PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(script), ",".join(stages)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-2000:]
    assert "unbound variable" not in output and "unknown stage" not in output, output[-2000:]


def test_the_entry_point_lists_its_subcommands_and_refuses_others() -> None:
    listed = run_benchmark("--help")
    assert listed.returncode == 0
    assert all(f"  {name} " in listed.stdout for name in SUBCOMMANDS), listed.stdout
    unknown = run_benchmark("warp-drive")
    assert unknown.returncode == 2 and "unknown subcommand 'warp-drive'" in unknown.stderr


def test_a_random_checkpoint_copies_its_tokenizer_or_refuses_before_building(
    tmp_path: Path,
) -> None:
    """A random checkpoint gets the tokenizer files of `tokenizer_dir`; where one is missing
    (a fresh GPU machine before provisioning) the error names it and the command that provides
    it, and nothing is left at the checkpoint's path for a later run to take as complete."""
    from transformers import AutoConfig

    from minisgl.benchmark.offline import TOKENIZER_FILES, save_random_checkpoint

    tokenizer = require_model(MODEL)
    config = AutoConfig.from_pretrained(tokenizer)  # tiny-qwen3's own shape: built in a second
    built = save_random_checkpoint(config, tmp_path / "random", tokenizer, init_device="cpu")
    for name in TOKENIZER_FILES:
        assert (built / name).read_bytes() == (tokenizer / name).read_bytes()
    assert (built / "config.json").is_file()

    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    (empty / "tokenizer.json").write_bytes((tokenizer / "tokenizer.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="tokenizer_config.json(.|\n)*provision.py tiny"):
        save_random_checkpoint(config, tmp_path / "half", empty, init_device="cpu")
    assert not (tmp_path / "half").exists()


def test_each_variant_is_measured_in_a_process_of_its_own() -> None:
    """`offline` measures each variant in a fresh process: its value comes back, and its
    failure comes back as an error that carries the measuring process's traceback."""
    from benchmark.throughput import in_own_process

    assert in_own_process(os.getpid) != os.getpid()
    assert in_own_process(divmod, 7, 2) == (3, 1)
    with pytest.raises(RuntimeError, match="the measuring process failed(.|\n)*ZeroDivisionError"):
        in_own_process(divmod, 1, 0)


def test_the_step_clock_splits_each_step_of_the_timed_run_into_its_parts() -> None:
    """Only the last generate's steps are kept (the warm-up's are dropped); every step that
    launched a batch has its phase and size, and its parts add up to at most its wall time."""
    from benchmark.scheduler_probes import StepClock

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    params = SamplingParams(max_tokens=5, ignore_eos=True)
    with StepClock() as clock, LLM(str(require_model(MODEL)), show_progress=False) as llm:
        llm.generate([[1, 2, 3]], params)  # a warm-up: forgotten by the next generate
        llm.generate([[4, 5, 6, 7], [8, 9]], params)
    launched = [(phase, size, kv) for phase, size, _, _, kv in clock.steps if phase != "idle"]
    # the KV tokens each batch's attention reads: the prompts, then one more a step each
    decode_steps = [("decode", 2, 4 + k + 2 + k) for k in range(1, 5)]
    assert launched == [("prefill", 2, 4 + 2)] + decode_steps
    for phase, _, seconds, parts, _ in clock.steps:
        assert set(parts) <= set(StepClock.PARTS) and sum(parts.values()) <= seconds
        if phase != "idle":
            assert {"schedule", "launch"} <= set(parts)
    prefill, decode = clock.table()
    assert prefill[:3] == ("prefill", "1-15", 1) and list(prefill[4]) == list(StepClock.PARTS)
    assert decode[:3] == ("decode", "1-15", 4) and decode[5] == sum(kv for *_, kv in decode_steps)


def test_the_decode_floor_is_the_weights_once_a_step_and_the_kv_each_token_reads() -> None:
    """Two steps reading 100 KV tokens on an H100: twice every parameter's bytes, plus 100 K
    and V rows of every layer, at 3.35 TB/s; no floor for a device of unknown bandwidth."""
    from benchmark.scheduler_probes import decode_floor_s
    from safetensors import safe_open

    model = require_model(MODEL)
    config = json.loads((model / "config.json").read_text())
    with safe_open(model / "model.safetensors", "pt") as tensors:
        params = sum(tensors.get_tensor(name).numel() for name in tensors.keys())
    kv_row = config["num_key_value_heads"] * config["head_dim"]
    expected = (2 * params * 2 + 100 * 2 * config["num_hidden_layers"] * kv_row * 2) / 3.35e12
    assert decode_floor_s(model, 2, "NVIDIA H100 80GB HBM3", 2, 100) == pytest.approx(expected)
    assert decode_floor_s(model, 2, "CPU", 2, 100) is None


def test_overlap_share_counts_kernel_time_under_a_later_cpu_step() -> None:
    from benchmark.overlap_timeline import merge, overlapped_share

    steps = [(0, 0.0, 10.0), (1, 10.0, 20.0)]
    # step 0's kernels: 6-14 (4 us of it while the CPU is in step 1); step 1's: 15-18
    kernels = merge([(0, 6.0, 9.0), (0, 9.5, 14.0), (1, 15.0, 18.0)])
    assert kernels == [(0, 6.0, 14.0), (1, 15.0, 18.0)]
    hidden, total = 14.0 - 10.0, (14.0 - 6.0) + (18.0 - 15.0)
    assert overlapped_share(steps, kernels) == pytest.approx(hidden / total)
