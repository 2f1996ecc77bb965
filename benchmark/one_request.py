"""One request's time per output token, for whichever `minisgl` is first on the path.

    PYTHONPATH=solutions python benchmark/one_request.py --engine minisgl --model DIR
    PYTHONPATH=.peer/mini-sglang/python python benchmark/one_request.py --engine upstream \
        --model DIR

A script of its own, importing nothing of this repository, so that the same code drives this
engine and upstream mini-sglang (`python -m benchmark peer` runs it for each): both have
`LLM(model_path, **settings)`, `LLM.generate(token_id_lists, SamplingParams)` and
`SamplingParams(temperature, ignore_eos, max_tokens)`. The request is a prompt of 512 random
ids (seed 0, below 10,000 as in the official workload) and 512 new tokens, greedy, ignoring
EOS. One untimed run first (CUDA graphs, kernel compilation), then `--repeat` timed runs;
prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
from minisgl.core import SamplingParams
from minisgl.llm import LLM

PROMPT_LEN = 512
OUTPUT_LEN = 512
# Upstream's default prefill backend on an H200 is FA3 from sgl_kernel, not installed there
# (its wheel is far over what a device call carries): FlashInfer for both phases.
SETTINGS = {"upstream": {"attention_backend": "fi"}, "minisgl": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(SETTINGS), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    prompt = [rng.randrange(10000) for _ in range(PROMPT_LEN)]
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=OUTPUT_LEN)
    llm = LLM(args.model, dtype=torch.bfloat16, **SETTINGS[args.engine])
    llm.generate([prompt], [params])  # untimed: graphs captured, kernels compiled
    seconds = []
    for _ in range(args.repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate([prompt], [params])
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    print(
        json.dumps(
            {
                "engine": args.engine,
                "seconds": seconds,
                "ms_per_token": 1000 * median / OUTPUT_LEN,
                "prompt_len": PROMPT_LEN,
                "output_len": OUTPUT_LEN,
                "settings": SETTINGS[args.engine],
            }
        )
    )


if __name__ == "__main__":
    main()
