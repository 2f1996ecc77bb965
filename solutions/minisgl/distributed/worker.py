"""The main of a rank process started by `RankProcesses`: `python -m minisgl.distributed.worker`.

It reads `(target, args)` pickled on stdin and runs `target(*args)`. It needs no watch on its
parent: a rank spends its life in, or between, collectives with rank 0, and the first one after
rank 0 is gone fails (gloo at once, NCCL after its timeout).
"""

from __future__ import annotations

import pickle
import signal
import sys

from minisgl.utils import exit_on_error


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle: it stops us
    target, args = pickle.load(sys.stdin.buffer)
    with exit_on_error():
        target(*args)


if __name__ == "__main__":
    main()
