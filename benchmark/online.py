"""Online serving benchmark: concurrent streaming clients against a running server.

    python -m minisgl --model models/SmolLM2-135M-Instruct --port 30000 &
    python -m benchmark online --url http://127.0.0.1:30000 --concurrency 64 --duration 30
    python -m benchmark online --launch models/SmolLM2-135M-Instruct --num-requests 64 --rate 4
    python -m benchmark online --launch models/SmolLM2-135M-Instruct --duration 30 \
        --peer-transformers          # then the same load against `transformers serve`

Requests arrive as a Poisson process at `--rate` requests per second (`inf`: all at once), at
most `--concurrency` in flight; with `--duration` new requests keep coming until that many
seconds have passed. Each one streams /v1/completions with `ignore_eos`, so it generates exactly
`--output-len` tokens (`transformers serve` refuses `ignore_eos`: its requests may stop early at
EOS). Tokens are counted from the server's `usage`, not from text: a model whose ids the
tokenizer cannot decode streams tokens without text. Reported: time to first token (TTFT),
inter-token latency (ITL, the gaps between streamed pieces, the chunks that carry tokens), the
time per output token after the first (TPOT, which does not depend on how a server groups tokens
into chunks) and end-to-end latency, p50 and p99, request and token throughput, errors (HTTP
errors, broken streams, streams that end before a finish_reason) and, apart from them, the
streams that ended normally without any text. Each server first answers one short request, timed
apart: `transformers serve` builds its continuous-batching manager on the first request it gets,
a one-off that would otherwise land in the first TTFTs. Against a minisgl server it then reads
/metrics once the server is idle: no request left running, no KV page still in use, and the
integrity check passed. The client and the metrics are minisgl.benchmark's (chapter 21); this
script starts and stops the servers.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from minisgl.benchmark import append_result, run_load, summarize
from minisgl.benchmark.metrics import PERCENTILES, RequestResult, percentile

from .checkpoints import ROOT

STARTUP_TIMEOUT_S = 300.0
IDLE_TIMEOUT_S = 60.0
GROUP_EXIT_S = 30.0  # how long a stopped server's children get to exit, per signal


def print_summary(name: str, summary: dict[str, float]) -> None:
    print(
        f"{name}: {summary['requests']:.0f} requests, {summary['errors']:.0f} errors, "
        f"{summary['streams_without_text']:.0f} streams without text, "
        f"{summary['output_tokens']:.0f} output tokens in {summary['seconds']:.1f} s"
    )
    print(
        f"  throughput  {summary['request_throughput']:.2f} req/s, "
        f"{summary['token_throughput']:.1f} tokens/s"
    )
    print(f"  TTFT        p50 {summary['ttft_p50_ms']:.0f} ms, p99 {summary['ttft_p99_ms']:.0f} ms")
    print(f"  ITL         p50 {summary['itl_p50_ms']:.1f} ms, p99 {summary['itl_p99_ms']:.1f} ms")
    if "tpot_p50_ms" in summary:
        tpot = f"p50 {summary['tpot_p50_ms']:.2f} ms, p99 {summary['tpot_p99_ms']:.2f} ms"
        print(f"  TPOT        {tpot}")
    print(
        f"  latency     p50 {summary['latency_p50_ms']:.0f} ms, "
        f"p99 {summary['latency_p99_ms']:.0f} ms"
    )


def time_per_output_token(results: list[RequestResult]) -> dict[str, float]:
    """TPOT percentiles in ms: each request's time from its first piece to its end over its
    tokens after the first. Unlike ITL it does not depend on how a server groups tokens into
    chunks (upstream sends the chunks that queued up one right after the other)."""
    tpot = [
        (r.latency_s - r.ttft_s) / (r.output_tokens - 1)
        for r in results
        if r.ok and r.piece_s and r.output_tokens > 1
    ]
    return {f"tpot_p{q}_ms": percentile(tpot, q) * 1e3 for q in PERCENTILES}


def idle_metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float] | None:
    """A minisgl server's /metrics once nothing runs (None for a server without them)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        response = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
        if response.status_code != 200 or "minisgl_" not in response.text:
            return None
        values = {
            line.split()[0]: float(line.split()[1])
            for line in response.text.splitlines()
            if line and not line.startswith("#")
        }
        busy = values["minisgl_running_requests"] + values["minisgl_waiting_requests"]
        if (busy == 0 and values["minisgl_integrity_ok"] != -1) or time.monotonic() > deadline:
            return values


def warm_up(url: str, model: str, headers: dict[str, str] | None, chat: bool = False) -> float:
    """One short completion (`chat`: chat completion) before the load, so that one-off setup
    stays out of the figures; returns its seconds."""
    body: dict = {"model": model, "max_tokens": 4}
    if chat:
        body["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        body["prompt"] = "Hello"
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    start = time.perf_counter()
    response = httpx.post(f"{url}{endpoint}", json=body, headers=headers, timeout=STARTUP_TIMEOUT_S)
    response.raise_for_status()
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(
    name: str,
    cmd: list[str],
    port: int,
    env: dict[str, str] | None = None,
    quiet: bool = False,
    health: str = "/health",
) -> subprocess.Popen:
    """Start a server and wait until `health` answers on `port` (`quiet`: drop its logs)."""
    server = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if quiet else None,
        env=dict(os.environ, **(env or {})),
        start_new_session=True,  # its own process group, which `stop` ends whole
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"{name} exited with status {server.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    sys.exit(f"{name} did not start in {STARTUP_TIMEOUT_S:.0f} s")


def launch_minisgl(model: str, port: int) -> subprocess.Popen:
    return launch(
        "minisgl", [sys.executable, "-m", "minisgl", "--model", model, "--port", str(port)], port
    )


def launch_transformers(model: str, port: int) -> subprocess.Popen:
    """`transformers serve` on the same local model (HF_HUB_OFFLINE: it must not look for it
    on the hub), with its continuous batching on, as the peer."""
    cli = Path(sys.executable).parent / "transformers"
    return launch(
        "transformers serve",
        [
            str(cli),
            "serve",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--continuous-batching",
        ],
        port,
        env={"HF_HUB_OFFLINE": "1"},
        quiet=True,
    )


def stop(server: subprocess.Popen) -> None:
    """Stop a server started by `launch`, and every process it started.

    A server's children can outlive it: upstream's scheduler once held 72 GiB of the GPU after
    its server had exited, and the next server ran out of memory at start. So the whole
    process group is ended, and this returns once none of it is left (or after a minute: an
    exited child that nobody reaps holds nothing)."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    deadline = time.monotonic() + GROUP_EXIT_S
    for sig in (signal.SIGTERM, signal.SIGKILL):
        while time.monotonic() < deadline:
            try:
                os.killpg(server.pid, sig)
            except ProcessLookupError:
                return  # no process of the group is left
            time.sleep(0.5)
        deadline = time.monotonic() + GROUP_EXIT_S


def run_one(
    name: str,
    url: str,
    model: str,
    args: argparse.Namespace,
    headers: dict[str, str] | None,
    extra: dict | None = None,
) -> dict[str, float]:
    """The load against one server: its summary, printed, and the idle check if it has one."""
    warm_up_s = warm_up(url, model, headers)
    results, seconds = asyncio.run(
        run_load(
            url,
            model,
            args.num_requests,
            args.duration,
            args.rate,
            args.concurrency,
            args.input_words,
            args.output_len,
            args.seed,
            headers,
            extra=extra,
        )
    )
    summary = summarize(results, seconds) | time_per_output_token(results)
    print_summary(name, summary)
    print(f"  warm-up     one request before the load: {warm_up_s:.1f} s")
    for error in sorted({r.error for r in results if not r.ok})[:5]:
        print(f"  error: {error}")
    metrics = idle_metrics(url, headers)
    if metrics is not None:
        print(
            f"  idle after the run: running {metrics['minisgl_running_requests']:.0f}, "
            f"KV pages in use {metrics['minisgl_kv_pages_used']:.0f}, integrity check "
            f"{'passed' if metrics['minisgl_integrity_ok'] == 1 else 'FAILED'}"
        )
        summary.update(
            pages_in_use_after=metrics["minisgl_kv_pages_used"],
            integrity_ok=metrics["minisgl_integrity_ok"],
        )
    return summary


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark online", description=__doc__.split("\n\n")[0]
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:30000")
    where.add_argument("--launch", metavar="MODEL_DIR", help="start a minisgl server for the run")
    parser.add_argument(
        "--peer-transformers",
        action="store_true",
        help="with --launch: then run the same load on `transformers serve`",
    )
    parser.add_argument("--model", help="the model name to request (default: the server's)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--num-requests", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None, help="seconds of load")
    parser.add_argument("--rate", type=float, default=math.inf, help="requests/s (Poisson)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--input-words", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json", type=Path, default=None, help="also append each server's figures as a JSON line"
    )
    args = parser.parse_args(argv)
    if args.num_requests is None and args.duration is None:
        parser.error("give --num-requests, --duration or both")
    if args.peer_transformers and not args.launch:
        parser.error("--peer-transformers needs --launch MODEL_DIR")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None

    figures: dict[str, dict[str, float]] = {}
    if args.url:
        model = (
            args.model
            or httpx.get(f"{args.url}/v1/models", headers=headers, timeout=30).json()["data"][0][
                "id"
            ]
        )
        figures["server"] = run_one(f"{model} at {args.url}", args.url, model, args, headers)
    else:
        port = free_port()
        server = launch_minisgl(args.launch, port)
        try:
            figures["minisgl"] = run_one(
                "minisgl",
                f"http://127.0.0.1:{port}",
                args.model or Path(args.launch).name,
                args,
                headers,
            )
        finally:
            stop(server)
    if args.peer_transformers:  # after minisgl has stopped: the two never share the CPU
        port = free_port()
        server = launch_transformers(args.launch, port)
        try:
            figures["transformers serve"] = run_one(
                "transformers serve", f"http://127.0.0.1:{port}", args.launch, args, None, extra={}
            )
        finally:
            stop(server)
    if args.json is not None:
        for server_name, summary in figures.items():
            append_result(args.json, {"benchmark": "online", "server": server_name, **summary})
    first = next(iter(figures.values()))
    return 1 if first["errors"] or first.get("pages_in_use_after", 0) else 0
