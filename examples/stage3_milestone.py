# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Stage 3 milestone: a server under load
#
# The end state of stage 3: `python -m minisgl` serving SmolLM2 over HTTP, with the tokenizer
# worker and the scheduler in processes of their own. We hold 32 concurrent streaming clients
# against it for 8 seconds (a new request starts as soon as one finishes, each generating 16
# tokens), with `python -m benchmark online`, and read the figures: time to first token, inter-token
# latency, throughput and errors. Then, with the server idle, /metrics must show no request
# left, no KV page still in use, and a passing integrity check. Last, SIGTERM stops it all.

# %%
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(ROOT))  # the repository's benchmark package
from benchmark.online import (  # noqa: E402
    free_port,
    idle_metrics,
    launch_minisgl,
    run_load,
    stop,
    summarize,
)

MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
# Small enough to run in about twenty seconds on two CPU cores. The acceptance run of the course,
# 64 streams for 30 s, is python -m benchmark online with --concurrency 64 --duration 30.
CONCURRENCY = 32
DURATION_S = 8.0
OUTPUT_LEN = 16


def main() -> None:
    port = free_port()
    server = launch_minisgl(MODEL, port)
    url = f"http://127.0.0.1:{port}"
    try:
        print(
            f"{CONCURRENCY} concurrent streams for {DURATION_S:.0f} s, {OUTPUT_LEN} tokens "
            "each, against python -m minisgl"
        )
        results, seconds = asyncio.run(
            run_load(
                url,
                Path(MODEL).name,
                None,
                DURATION_S,
                rate=float("inf"),
                concurrency=CONCURRENCY,
                input_words=32,
                output_len=OUTPUT_LEN,
                seed=0,
                progress=False,
            )
        )
        s = summarize(results, seconds)
        print(f"errors: {s['errors']:.0f}")
        print(
            f"every request got all its tokens: "
            f"{all(r.output_tokens == OUTPUT_LEN for r in results if r.ok)}"
        )
        print(
            f"throughput: {s['request_throughput']:.2f} req/s, {s['token_throughput']:.1f} tokens/s"
        )
        print(f"TTFT: p50 {s['ttft_p50_ms']:.0f} ms, p99 {s['ttft_p99_ms']:.0f} ms")
        print(f"ITL: p50 {s['itl_p50_ms']:.1f} ms, p99 {s['itl_p99_ms']:.1f} ms")
        metrics = idle_metrics(url)
        assert metrics is not None
        print(
            f"idle after the load: running {metrics['minisgl_running_requests']:.0f}, "
            f"waiting {metrics['minisgl_waiting_requests']:.0f}, "
            f"KV pages in use {metrics['minisgl_kv_pages_used']:.0f}, integrity check "
            f"{'passed' if metrics['minisgl_integrity_ok'] == 1 else 'FAILED'}"
        )
    finally:
        stop(server)
        print(f"SIGTERM: exit status {server.returncode}")


if __name__ == "__main__":
    main()
