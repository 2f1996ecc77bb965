"""The official workload with each of FlashInfer's decode kernels, one run.

    python -m benchmark flashinfer-decode --choices tensor-cores,cuda-cores,fa3 --json r.jsonl
    python -m benchmark flashinfer-decode --choices tensor-cores,hybrid-128,hybrid-192

FlashInfer decodes one query per request either on CUDA cores (its decode kernel) or on tensor
cores (its prefill kernel with one query per request: FA2's, or FA3's on Hopper). The engine
always takes FA2's tensor cores (`attention/fi.py`). This runs `benchmark/offline.py`'s official
workload on the random Qwen3-0.6B once per choice, the wrapper class's arguments forced to the
choice's, and appends an `offline` line per choice whose variant is `decode <choice>`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from minisgl.benchmark import WORKLOADS, append_result, make_workload

from .checkpoints import RANDOM_MODEL, resolve_model
from .throughput import run_variant

CHOICES: dict[str, dict[str, Any]] = {
    "tensor-cores": {"use_tensor_cores": True},
    "cuda-cores": {"use_tensor_cores": False},
    "fa3": {"use_tensor_cores": True, "backend": "fa3"},
}
# "hybrid-N": the graphs of N rows or more decode on CUDA cores, the rest on tensor cores. From
# batch 128 up the official workload's steps wait for the host, not the GPU, and the tensor-core
# decode's plan costs the host more (it takes the longest KV length with Python's max() over a
# tensor of them).
HYBRID = "hybrid-"


def choice_arguments(choice: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The wrapper arguments `choice` forces, for a wrapper made with `kwargs`."""
    if not choice.startswith(HYBRID):
        return CHOICES[choice]
    indptr = kwargs.get("paged_kv_indptr_buffer")
    graph_rows = len(indptr) - 1 if kwargs.get("use_cuda_graph") and indptr is not None else 0
    return {"use_tensor_cores": graph_rows < int(choice.removeprefix(HYBRID))}


@contextmanager
def decode_kernel(choice: str) -> Iterator[None]:
    """Every decode wrapper made inside the block (eager and graphs') uses `choice`'s kernel."""
    import flashinfer

    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper

    class Forced(wrapper):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **(kwargs | choice_arguments(choice, kwargs)))

    with mock.patch.object(flashinfer, "BatchDecodeWithPagedKVCacheWrapper", Forced):
        yield


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark flashinfer-decode", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=RANDOM_MODEL)
    parser.add_argument(
        "--choices", default=",".join(CHOICES), help=", ".join(CHOICES) + f", {HYBRID}N"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    model = resolve_model(args.model, torch.bfloat16)
    work = make_workload(WORKLOADS["official"], 0)
    print(f"{'decode kernel':<15}{'out tokens':>11}{'seconds':>9}{'tok/s':>10}")
    for choice in args.choices.split(","):
        with decode_kernel(choice):
            result = run_variant(model, "official", work, torch.bfloat16, "minisgl", 1)
        print(
            f"{choice:<15}{result.output_tokens:>11}{result.seconds:>9.2f}"
            f"{result.tokens_per_s:>10.1f}",
            flush=True,
        )
        if args.json:
            append_result(
                args.json,
                {
                    "benchmark": "offline",
                    "workload": "official",
                    "variant": f"decode {choice}",
                    "device": torch.cuda.get_device_name(),
                    "tp": 1,
                    "seconds": result.seconds,
                    "output_tokens": result.output_tokens,
                    "input_tokens": work.input_tokens,
                },
            )
    return 0
