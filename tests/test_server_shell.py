"""`python -m minisgl --shell`: a chat in the terminal, driven here through a pipe. Answers
stream to stdout, /reset forgets the conversation, /exit quits, and no process outlives the
shell. Each request carries the conversation so far (checked on a stand-in front end)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, TINY_MODELS, require_model

from minisgl.message import ReplyMsg
from minisgl.server import shell

SHELL_TIMEOUT_S = 180


def processes_running(marker: str) -> list[int]:
    """Pids whose command line contains `marker` (the shell forks its workers: same line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry.name))
    return found


def test_shell_answers_resets_and_exits_cleanly(tmp_path: Path) -> None:
    # A model path of its own, so that the processes of this shell are recognizable.
    model = tmp_path / "shell-model"
    model.symlink_to(require_model(TINY_MODELS["qwen3"]), target_is_directory=True)
    done = subprocess.run(
        [sys.executable, "-m", "minisgl", "--model", str(model), "--shell"],
        cwd=ROOT,
        input="Hello there\n/reset\nAnd again\n/exit\nnever read\n",
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "/reset" in out and "/exit" in out  # the banner says how to use it
    assert out.count("> ") == 4  # a prompt for each line up to /exit, none after
    assert "(conversation reset)" in out
    answers = [chunk for chunk in out.split("> ")[1:] if chunk.strip()]
    assert len(answers) >= 2 and all("[error]" not in a for a in answers), out
    assert processes_running(str(model)) == []


class RecordingFrontend:
    """Stands in for FrontendManager: records each request's messages, answers "answer N"."""

    def __init__(self) -> None:
        self.sent: list[list[dict[str, str]]] = []

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def submit(self, params: object, messages: list[dict[str, str]]) -> int:
        self.sent.append([dict(message) for message in messages])
        return len(self.sent)

    async def replies(self, uid: int) -> AsyncIterator[ReplyMsg]:
        yield ReplyMsg(uid, f"answer {uid}", finish_reason="stop")

    def abort(self, uid: int) -> None:
        pass


def test_each_turn_sends_the_history_and_reset_forgets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: Iterator[str] = iter(["hi", "again", "/reset", "fresh", "/exit"])
    frontend = RecordingFrontend()
    monkeypatch.setattr(shell, "FrontendManager", lambda tokenizer, api: frontend)
    monkeypatch.setattr(shell, "read_line", lambda: next(lines))
    addresses = SimpleNamespace(tokenizer="t", api="a")
    asyncio.run(shell.shell_loop(SimpleNamespace(model_name="m"), addresses))
    user = [{"role": "user", "content": text} for text in ("hi", "again", "fresh")]
    assert frontend.sent == [
        [user[0]],
        [user[0], {"role": "assistant", "content": "answer 1"}, user[1]],
        [user[2]],
    ]
