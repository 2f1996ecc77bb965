"""`python -m benchmark SUBCOMMAND [options]`: one entry point for every benchmark.

python -m benchmark --help                 # the subcommands
python -m benchmark offline --help         # one subcommand's options
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module of this package, what it measures). Modules are imported only when
# their subcommand runs: several import GPU-only libraries (FlashInfer, Triton) at the top.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "offline": ("throughput", "offline throughput of the engine's variants against transformers"),
    "online": ("online", "a live server under concurrent streaming clients: TTFT, ITL, tok/s"),
    "peer": ("peer", "upstream mini-sglang beside this engine: offline, one request, online (GPU)"),
    "decode-step": ("decode_step", "a decode step's time at fixed batch sizes (GPU)"),
    "cpu-step": ("cpu_step", "where one CPU decode step goes: its parts and operators"),
    "cpu-versus": ("cpu_versus", "the engine's CPU decode step against transformers'"),
    "attention-kernels": ("attention_kernels", "paged attention kernels alone (GPU)"),
    "flashinfer-decode": (
        "flashinfer_decode",
        "the official workload per FlashInfer decode kernel",
    ),
    "launch-costs": ("launch_costs", "what each kind of kernel launch costs the host (GPU)"),
    "profile-step": ("profile_step", "one prefill and one decode step's kernels (GPU)"),
    "overlap-timeline": ("overlap_timeline", "the overlap scheduler's timeline as an SVG (GPU)"),
    "moe": ("moe", "chapter 20: a Qwen3-30B-A3B shape against transformers (GPU)"),
    "tp": ("tp", "chapter 16: a Qwen3-8B shape at TP=1 and TP=2 (GPUs)"),
    "mixed": ("mixed", "chapter 23: admission on a tight pool, decode latency under a prefill"),
    "speculative": ("speculative", "chapter 24: acceptance and tok/s with drafts off and on"),
    "structured": ("structured", "chapter 25: JSON validity and the grammar mask's cost"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in SUBCOMMANDS.items()]
    return "usage: python -m benchmark SUBCOMMAND [options]\n\nsubcommands:\n" + "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, *rest = argv
    if name not in SUBCOMMANDS:
        print(f"unknown subcommand {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__package__}.{SUBCOMMANDS[name][0]}")
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
