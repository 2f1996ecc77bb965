"""`python -m minisgl --model DIR --shell`: chat with the model in the terminal.

The shell is a front end like the API server: it sends chat requests to the same tokenizer and
scheduler processes, and prints each reply's text pieces as they arrive. The conversation's
history goes with every request; /reset forgets it, /exit (or Ctrl-D) quits.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from minisgl.core import SamplingParams
from minisgl.server.args import ServerArgs
from minisgl.server.frontend import FrontendManager

if TYPE_CHECKING:
    from minisgl.server.launch import Addresses

SHELL_MAX_TOKENS = 256

HELP = "Type a message and press Enter. /reset forgets the conversation, /exit quits."


async def chat_turn(
    frontend: FrontendManager, history: list[dict[str, str]], params: SamplingParams
) -> str:
    """Send the conversation, print the answer as it streams, return the whole answer."""
    uid = frontend.submit(params, messages=history)
    pieces = []
    try:
        async for reply in frontend.replies(uid):
            if reply.error is not None:
                print(f"[error] {reply.error}", end="")
                break
            print(reply.text, end="", flush=True)
            pieces.append(reply.text)
    finally:
        frontend.abort(uid)  # Ctrl-C mid-answer: stop generating
        print()
    return "".join(pieces)


async def shell_loop(args: ServerArgs, addresses: Addresses) -> None:
    frontend = FrontendManager(addresses.tokenizer, addresses.api)
    frontend.start()
    params = SamplingParams(max_tokens=SHELL_MAX_TOKENS)
    history: list[dict[str, str]] = []
    print(f"minisgl shell: {args.model_name}. {HELP}")
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, read_line)
            if line is None or line.strip() == "/exit":
                return
            if line.strip() == "/reset":
                history.clear()
                print("(conversation reset)")
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            answer = await chat_turn(frontend, history, params)
            history.append({"role": "assistant", "content": answer})
    finally:
        frontend.close()


def read_line() -> str | None:
    """One line typed by the user; None at end of input (Ctrl-D, or a closed pipe)."""
    try:
        return input("> ")
    except EOFError:
        return None


def run_shell(args: ServerArgs, addresses: Addresses) -> None:
    """Chat until /exit, Ctrl-D or Ctrl-C."""
    try:
        asyncio.run(shell_loop(args, addresses))
    except KeyboardInterrupt:
        print(file=sys.stderr)
