"""Upstream mini-sglang beside this engine, on the same GPU in one run.

    python -m benchmark peer --parts offline,single,online --rounds 2 --json results.jsonl

The peer is sgl-project/mini-sglang at PEER_COMMIT, its tree unpacked under .peer/ (git
ignores it; it travels to a GPU machine like the wheels, since nothing is fetched there):

    git clone https://github.com/sgl-project/mini-sglang /tmp/upstream
    mkdir -p .peer/mini-sglang
    git -C /tmp/upstream archive 20fcd7f python benchmark | tar -x -C .peer/mini-sglang

Every run is a fresh process, the two engines alternating (upstream first in odd rounds, this
engine first in even ones), on the same random Qwen3-0.6B-shape checkpoint (bf16):

- offline: upstream's own benchmark/offline/bench.py, unchanged but for the model path and
  `attention_backend="fi"`, against `python -m benchmark offline --workload official` (the
  same 256 requests, 133,966 output tokens);
- single: one request, a 512-token prompt and 512 new tokens (`benchmark/one_request.py`,
  the same script for both);
- online: each server under the chapter 21 client at 64 and at 256 concurrent streams, over
  /v1/chat/completions (upstream serves no /v1/completions).
  Each server with its defaults, which on a GPU run 256 requests at once on both sides.
  Beside the client's TTFT and ITL, TPOT (time per output token after the first), which
  does not depend on how a server groups tokens into chunks.

Upstream's default prefill backend on an H200 is FA3 from sgl_kernel, whose wheel is far over
what a device call carries: it runs FlashInfer for both phases. Each line recorded has the
engine, the command that ran it and the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from minisgl.benchmark import append_result, run_load, summarize

from .checkpoints import RANDOM_MODEL, ROOT, resolve_model
from .online import free_port, launch, print_summary, stop, time_per_output_token, warm_up
from .order import rotated

PEER_COMMIT = "20fcd7f"  # sgl-project/mini-sglang, 2025: "Fix race condition in flashinfer backend"
PEER_TREE = ROOT / ".peer" / "mini-sglang"
RUN_TIMEOUT_S = 600
THROUGHPUT = re.compile(r"Total: (\d+)tok, Time: ([\d.]+)s, Throughput: ([\d.]+)tok/s")


def environment(engine: str, tree: Path) -> dict[str, str]:
    """The environment of a run: this engine's solutions/ on the path, or upstream's python/
    in its place (everything else on the path, the wheels, stays)."""
    ours = str(ROOT / "solutions")
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ours]
    first = ours if engine == "minisgl" else str(tree / "python")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([first, *kept]))


def run(engine: str, tree: Path, cmd: list[str]) -> str:
    """Run a command in a fresh process; its output (printed as it comes), or exit on failure."""
    print(f"$ {' '.join(cmd)}   [{engine}]", flush=True)
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        env=environment(engine, tree),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    print(done.stdout[-4000:], done.stderr[-2000:] if done.returncode else "", flush=True)
    if done.returncode:
        sys.exit(f"{engine}: {' '.join(cmd)} exited with status {done.returncode}")
    return done.stdout


def offline(engine: str, tree: Path, model: Path) -> dict[str, Any]:
    """The official workload's output tokens per second, by the engine's own benchmark."""
    if engine == "upstream":
        bench = (tree / "benchmark" / "offline" / "bench.py").read_text()
        changed = bench.replace('"Qwen/Qwen3-0.6B",', f'{str(model)!r}, attention_backend="fi",')
        assert changed != bench, "upstream's bench.py no longer names Qwen/Qwen3-0.6B"
        script = Path(tempfile.mkdtemp()) / "bench.py"
        script.write_text(changed)
        found = THROUGHPUT.search(run(engine, tree, [sys.executable, str(script)]))
        if found is None:
            sys.exit("upstream's bench.py printed no throughput line")
        tokens, seconds, rate = int(found[1]), float(found[2]), float(found[3])
        change = "the model path and attention_backend='fi'"
        return dict(output_tokens=tokens, seconds=seconds, tokens_per_s=rate, changed=change)
    with tempfile.TemporaryDirectory() as folder:
        lines = Path(folder) / "offline.jsonl"
        cmd = [sys.executable, "-m", "benchmark", "offline", "--workload", "official"]
        cmd += ["--model", RANDOM_MODEL, "--dtype", "bfloat16", "--variants", "minisgl"]
        run(engine, tree, [*cmd, "--json", str(lines)])
        record = json.loads(lines.read_text().splitlines()[-1])
    tokens, seconds = record["output_tokens"], record["seconds"]
    return dict(output_tokens=tokens, seconds=seconds, tokens_per_s=tokens / seconds)


def single(engine: str, tree: Path, model: Path) -> dict[str, Any]:
    """One request's milliseconds per output token (`one_request.py`)."""
    script = ROOT / "benchmark" / "one_request.py"
    cmd = [sys.executable, str(script), "--engine", engine, "--model", str(model)]
    return json.loads(run(engine, tree, cmd).strip().splitlines()[-1])


def online(engine: str, tree: Path, model: Path, loads: list[tuple[int, int]]) -> list[dict]:
    """One server of the engine under each load (streams, requests): the client's summary."""
    port = free_port()
    if engine == "upstream":
        cmd = [sys.executable, "-m", "minisgl", "--model", str(model), "--attention-backend"]
        cmd += ["fi", "--port", str(port)]
        health = "/v1/models"  # upstream has no /health
    else:
        cmd = [sys.executable, "-m", "minisgl", "--model", str(model), "--port", str(port)]
        health = "/health"
    server = launch(engine, cmd, port, env=environment(engine, tree), health=health)
    url = f"http://127.0.0.1:{port}"
    summaries = []
    try:
        warm_up(url, str(model), None, chat=True)
        for streams, requests in loads:
            results, seconds = asyncio.run(
                run_load(url, str(model), requests, None, math.inf, streams, 32, 256, 0, chat=True)
            )
            summary = summarize(results, seconds) | time_per_output_token(results)
            print_summary(f"{engine}, {streams} streams", summary)
            summaries.append(dict(summary, streams=streams, server_command=" ".join(cmd[1:])))
    finally:
        stop(server)
    return summaries


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark peer", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--parts", default="offline,single,online")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each engine per part")
    parser.add_argument(
        "--first-round", type=int, default=1, help="number of the first round (its order)"
    )
    parser.add_argument("--tree", type=Path, default=PEER_TREE, help="upstream's unpacked tree")
    parser.add_argument(
        "--loads", default="64:256,256:1024", help="online: streams:requests, comma-separated"
    )
    parser.add_argument("--json", type=Path, default=None, help="append each figure here")
    args = parser.parse_args(argv)
    if not (args.tree / "python" / "minisgl").is_dir():
        sys.exit(f"no upstream tree at {args.tree}: see `python -m benchmark peer --help`'s module")
    model = resolve_model(RANDOM_MODEL, torch.bfloat16)
    loads = [tuple(map(int, load.split(":"))) for load in args.loads.split(",")]
    parts = args.parts.split(",")
    figures: dict[tuple[str, str], list[float]] = {}
    for part in parts:
        for round_ in range(args.first_round, args.first_round + args.rounds):
            order = rotated(["upstream", "minisgl"], round_ - 1)  # upstream first in odd rounds
            for engine in order:
                if part == "offline":
                    records = [offline(engine, args.tree, model)]
                    figure = records[0]["tokens_per_s"]
                elif part == "single":
                    records = [single(engine, args.tree, model)]
                    figure = records[0]["ms_per_token"]
                elif part == "online":
                    if round_ > args.first_round:
                        continue  # a server per engine: the loads are its rounds
                    records = online(engine, args.tree, model, loads)
                    figure = records[0]["token_throughput"]
                else:
                    parser.error(f"unknown part {part!r}")
                figures.setdefault((part, engine), []).append(figure)
                for record in records:
                    line = dict(benchmark="peer", part=part, engine=engine, round=round_)
                    line.update(record, peer_commit=PEER_COMMIT)
                    if args.json is not None:
                        append_result(args.json, line)
    for (part, engine), values in figures.items():
        print(f"{part:<8} {engine:<9} " + "  ".join(f"{v:.2f}" for v in values))
    return 0
