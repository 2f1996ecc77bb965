"""The command lines under benchmark/: thin scripts over minisgl.benchmark. Each runs for real on
tiny-qwen3 on the CPU (the GPU-only ones as far as a CPU lets them), and what they append to a
results file carries the command, the machine and the date."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_MODELS, require_model

from minisgl.benchmark import WORKLOADS, make_workload, read_results

MODEL = TINY_MODELS["qwen3"]
sys.path.insert(0, str(ROOT / "benchmark"))


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def assert_provenance(record: dict, script: str) -> None:
    assert record["command"].startswith(f"python {script}"), record["command"]
    assert record["machine"] and "CPU cores" in record["machine"]
    assert record["date"][:4].isdigit() and "T" in record["date"]


@pytest.mark.slow
def test_offline_compares_the_engine_with_transformers_and_appends_json_lines(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results.jsonl"
    model = str(require_model(MODEL))
    done = run_script(
        "benchmark/offline.py",
        "--model",
        model,
        "--workload",
        "uniform",
        "--threads",
        "1",
        "--tp",
        "1",
        "--json",
        str(results),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    work = make_workload(WORKLOADS["uniform"], 0)
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("uniform")]
    assert [row[1] for row in rows] == ["transformers", "minisgl"]
    assert all(int(row[3]) == work.output_tokens for row in rows), done.stdout
    assert rows[0][-1] == "1.00", "transformers' own ratio"
    records = read_results(results)
    assert [r["variant"] for r in records] == ["transformers", "minisgl"]
    for record in records:
        assert record["benchmark"] == "offline" and record["workload"] == "uniform"
        assert record["output_tokens"] == work.output_tokens
        assert record["input_tokens"] == work.input_tokens
        assert_provenance(record, "benchmark/offline.py")


def test_offline_refuses_an_unknown_variant() -> None:
    done = run_script("benchmark/offline.py", "--variants", "minisgl,warp-drive")
    assert done.returncode == 2 and "warp-drive" in done.stderr


@pytest.mark.slow
def test_online_launches_a_server_and_appends_its_figures(tmp_path: Path) -> None:
    results = tmp_path / "online.jsonl"
    done = run_script(
        "benchmark/online.py",
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
    assert_provenance(record, "benchmark/online.py")


@pytest.mark.parametrize("script", ["decode_step.py", "overlap_timeline.py"])
def test_gpu_scripts_import_and_parse_their_flags(script: str) -> None:
    done = run_script(f"benchmark/{script}", "--help")
    assert done.returncode == 0 and "--model" in done.stdout, done.stderr[-2000:]


def test_overlap_share_counts_kernel_time_under_a_later_cpu_step() -> None:
    from overlap_timeline import merge, overlapped_share

    steps = [(0, 0.0, 10.0), (1, 10.0, 20.0)]
    # step 0's kernels: 6-14 (4 us of it while the CPU is in step 1); step 1's: 15-18
    kernels = merge([(0, 6.0, 9.0), (0, 9.5, 14.0), (1, 15.0, 18.0)])
    assert kernels == [(0, 6.0, 14.0), (1, 15.0, 18.0)]
    hidden, total = 14.0 - 10.0, (14.0 - 6.0) + (18.0 - 15.0)
    assert overlapped_share(steps, kernels) == pytest.approx(hidden / total)
