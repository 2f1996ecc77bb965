# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 15: an OpenAI-compatible server
#
# We launch `python -m minisgl` on SmolLM2 (three processes: API server, tokenizer worker,
# scheduler), talk to it with the official `openai` client as any application would, stream a
# chat answer piece by piece, run eight requests at once, read /metrics, and stop the server
# with SIGTERM: every process exits and the socket directory is gone.

# %%
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
from openai.types import Completion

ROOT = Path(__file__).resolve().parent.parent if "__file__" in globals() else Path.cwd()
MODEL = os.environ.get("MINISGL_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
STARTUP_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(port: int) -> subprocess.Popen:
    server = subprocess.Popen(
        [sys.executable, "-m", "minisgl", "--model", MODEL, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    start = time.monotonic()
    while time.monotonic() - start < STARTUP_TIMEOUT_S:
        if server.poll() is not None:
            sys.exit(f"the server exited with status {server.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.3)
    server.kill()
    sys.exit("the server did not start")


async def eight_at_once(client: openai.AsyncOpenAI, model: str) -> list[Completion]:
    prompts = [f"Fact number {i} about the sea:" for i in range(8)]
    return await asyncio.gather(
        *(
            client.completions.create(
                model=model, prompt=p, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
            )
            for p in prompts
        )
    )


def main() -> None:
    port = free_port()
    server = launch(port)
    try:
        base = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
        model = client.models.list().data[0].id
        print(f"serving {model}\n")

        question = [{"role": "user", "content": "Name three planets."}]
        start = time.perf_counter()
        stream = client.chat.completions.create(
            model=model, messages=question, max_tokens=32, temperature=0, stream=True
        )
        pieces, first_at = [], None
        for chunk in stream:
            piece = chunk.choices[0].delta.content or ""
            if piece and first_at is None:
                first_at = time.perf_counter() - start
            pieces.append(piece)
        total = time.perf_counter() - start
        print(
            f"streamed chat: {len(pieces)} pieces, first after {first_at * 1e3:.0f} ms, "
            f"all after {total * 1e3:.0f} ms"
        )
        print(f"  {''.join(pieces)!r}\n")

        start = time.perf_counter()
        replies = asyncio.run(
            eight_at_once(openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none"), model)
        )
        seconds = time.perf_counter() - start
        tokens = sum(r.usage.completion_tokens for r in replies)
        print(
            f"8 completions at once: {tokens} tokens in {seconds:.2f} s, "
            f"{tokens / seconds:.1f} tokens/s"
        )
        print(f"  finish reasons: {sorted({r.choices[0].finish_reason for r in replies})}\n")

        print("/metrics:")
        for line in httpx.get(f"{base}/metrics").text.splitlines():
            if not line.startswith("#"):
                print(" ", line)
    finally:
        server.send_signal(signal.SIGTERM)
        print(f"\nSIGTERM: the server exited with status {server.wait(60)}")


if __name__ == "__main__":
    main()
