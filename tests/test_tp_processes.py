"""Tensor parallelism across real processes (chapter 16), beyond the chapter's own tests: a
server with `--tp 2` answers through the OpenAI client as the one-process engine does, and a
rank that dies mid-generation, killed or failing with an error, takes the whole group down
within a bound, with the launcher's one error naming it (and quoting its stderr), for the
offline `LLM` and for the server alike; no child process is left behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2, TINY_MODELS, require_model
from faulty_rank import FAULT, run_scheduler_failing_on_rank_1
from server_fixture import children_of, start_server

import minisgl.llm.tp
from minisgl.core import SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.launcher import ProcessDiedError
from minisgl.llm import LLM
from minisgl.server.args import parse_args
from minisgl.utils import ConfigError

pytestmark = pytest.mark.slow
GROUP_END_S = 30.0  # a dead rank must end the whole group within this
PROMPT = "The capital of France is"
TESTS = Path(__file__).resolve().parent
# The launcher's error for a rank that raised: its first line, then the end of its traceback.
FAILED_RANK = "the scheduler rank 1 process exited with status 1 (the others were stopped); "
FAILED_RANK += "its last lines on stderr:"


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def direct_children(pid: int) -> list[int]:
    """The processes `pid` started itself, oldest first (pids grow with start order)."""
    return sorted(child for child in children_of(pid) if parent_of(child) == pid)


def test_tp_size_without_rank_processes_is_a_clear_error() -> None:
    model = str(require_model(TINY_MODELS["qwen3"]))
    with pytest.raises(ConfigError, match=r"LLM\(\.\.\., tp_size=2\)"):
        Engine(EngineConfig(model, tp_size=2, show_progress=False))
    with pytest.raises(ConfigError, match="--tp must be >= 1"):
        parse_args(["--model", model, "--tp", "0"])


def test_llm_rank_killed_mid_generation_ends_the_group_with_a_clear_error() -> None:
    llm = LLM(str(require_model(TINY_MODELS["qwen3"])), tp_size=2, show_progress=False)
    scheduler = llm.scheduler
    rank1 = scheduler.ranks.processes["scheduler rank 1"]
    scheduler.add_request(llm.tokenizer.encode(PROMPT), SamplingParams(max_tokens=200))
    for _ in range(3):  # generating: prefill and the first decode steps
        scheduler.step()
    rank1.send_signal(signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ProcessDiedError, match="the scheduler rank 1 process killed by SIGKILL"):
        while scheduler.has_work:
            scheduler.step()
    assert time.monotonic() - start < GROUP_END_S
    llm.shutdown()  # returns at once: nothing is left to wait for
    assert all(p.poll() is not None for p in scheduler.ranks.processes.values())


@pytest.fixture(scope="module")
def tp_server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tp-server") / "server.log"


def test_server_tp2_answers_like_one_rank_and_stops_when_a_rank_dies(tp_server_log: Path) -> None:
    model = require_model(SMOLLM2)
    with LLM(str(model), show_progress=False) as llm:
        expected = llm.generate(PROMPT, SamplingParams(max_tokens=8))[0]["text"]
    server = start_server(model, tp_server_log, "--tp", "2")
    try:
        client = server.openai()
        reply = client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=8, temperature=0
        )
        assert reply.choices[0].text == expected

        schedulers = direct_children(server.process.pid)[:2]  # started first: ranks 0 and 1
        stream = client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=2000, temperature=0, stream=True
        )
        first_chunk = threading.Event()

        def read_stream() -> None:
            try:
                for _ in stream:
                    first_chunk.set()
            except Exception:  # the server going away cuts the stream: expected here
                pass

        reader = threading.Thread(target=read_stream, daemon=True)
        reader.start()
        assert first_chunk.wait(60), "no token streamed"
        os.kill(schedulers[1], signal.SIGKILL)
        status = server.process.wait(GROUP_END_S)
    finally:
        if server.process.poll() is None:
            server.process.kill()
    log = tp_server_log.read_text()
    assert status != 0
    assert "error: the scheduler rank 1 process killed by SIGKILL (the others were stopped)" in log
    assert not [pid for pid in schedulers if alive(pid)]


def test_a_rank_that_fails_ends_the_llm_and_the_server_with_the_same_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = require_model(TINY_MODELS["qwen3"])
    monkeypatch.setattr(minisgl.llm.tp, "run_scheduler", run_scheduler_failing_on_rank_1)
    llm = LLM(str(model), tp_size=2, show_progress=False)
    ranks = list(llm.scheduler.ranks.processes.values())
    start = time.monotonic()
    with pytest.raises(ProcessDiedError) as failure:
        llm.generate(PROMPT, SamplingParams(max_tokens=50))
    assert time.monotonic() - start < GROUP_END_S
    llm.shutdown()
    llm_error = str(failure.value)
    assert not [p.pid for p in ranks if alive(p.pid)]

    log = tmp_path / "server.log"
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    entry = ("-c", "import faulty_rank; faulty_rank.serve()")
    server = start_server(model, log, "--tp", "2", env={"PYTHONPATH": path}, entry=entry)
    try:
        children = children_of(server.process.pid)
        request = {"model": server.model, "prompt": PROMPT, "max_tokens": 50}
        start = time.monotonic()
        try:
            httpx.post(f"{server.base_url}/v1/completions", json=request, timeout=GROUP_END_S)
        except httpx.HTTPError:  # the server stopped before it could answer
            pass
        status = server.process.wait(GROUP_END_S)
        assert time.monotonic() - start < GROUP_END_S
    finally:
        if server.process.poll() is None:
            server.process.kill()
    assert status == 1
    assert not [pid for pid in children if alive(pid)]

    text = log.read_text()
    server_error = text[text.index(f"error: {FAILED_RANK}") + len("error: ") :]
    for error in (llm_error, server_error):
        assert error.startswith(FAILED_RANK + "\n"), error
        assert error.rstrip().endswith(f"RuntimeError: {FAULT}"), error


def test_cpu_ranks_share_the_cores_and_rank_0_gets_its_threads_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two ranks with a thread per core each would oversubscribe the cores (OpenMP's threads
    spin while they wait): each rank takes cores / ranks, and the user's process, rank 0, gets
    its own number back when the LLM closes. An OMP_NUM_THREADS the user set is left alone."""
    import torch

    model = str(require_model(TINY_MODELS["qwen3"]))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    with LLM(model, tp_size=2, show_progress=False, num_pages=256) as llm:
        assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) // 2)
        llm.generate([PROMPT], SamplingParams(max_tokens=2))
    assert torch.get_num_threads() == before
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    with LLM(model, tp_size=2, show_progress=False, num_pages=256):
        assert torch.get_num_threads() == 1
    torch.set_num_threads(before)
