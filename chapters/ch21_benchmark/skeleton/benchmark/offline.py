"""Offline throughput: the engine's `LLM.generate` and transformers' `generate` on one workload.

Both sides get the same model, dtype, prompts and output lengths, greedy and ignoring EOS, so
every request generates exactly the tokens it asked for. transformers runs static batches in
arrival order (left-padded), each generating until its longest request is done. A result keeps
the tokens that count for each request, so two results can be checked to have done the same
work before their throughputs are compared.
"""

from __future__ import annotations

import gc
import shutil
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch

from .workload import Workload

T = TypeVar("T")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")  # copied


@dataclass
class OfflineResult:
    variant: str
    seconds: float  # wall time of the timed run
    tokens: list[list[int]]  # per request, the output tokens that count

    @property
    def output_tokens(self) -> int:
        return sum(map(len, self.tokens))

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def device_sync() -> None:
    """Wait for the GPU's queued work (kernels launch asynchronously); nothing on a CPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def release_gpu_memory() -> None:
    """Hand cached GPU memory back, so the next engine sizes its KV cache from all of it."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def save_random_checkpoint(
    config: Any,
    path: Path,
    tokenizer_dir: Path,
    init_device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """A transformers config's model with random weights (seed 0), saved at `path`.

    Benchmarks of large shapes need no real weights: speed does not depend on their values.
    Billions of parameters initialise in seconds on a GPU and in minutes on a CPU, but the
    device changes the random stream, so a checkpoint already measured keeps its `init_device`.
    The tokenizer files come from `tokenizer_dir`: prompts are token ids, and the tokenizer only
    turns outputs into text. They are checked before anything is built, so a missing one leaves
    no half-written checkpoint at `path` (FileNotFoundError).
    """
    from transformers import AutoModelForCausalLM

    missing = [name for name in TOKENIZER_FILES if not (tokenizer_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"no {', '.join(missing)} in {tokenizer_dir} to give the random checkpoint a "
            "tokenizer: provision the tiny models first (python tools/provision.py tiny)"
        )
    torch.manual_seed(0)
    with torch.device(init_device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(path)
    del model
    release_gpu_memory()
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, path / name)
    return path


def timed(
    run: Callable[[], T], warmup: Callable[[], object], sync: Callable[[], None] = device_sync
) -> tuple[T, float]:
    """Time `run` alone: warm up first, and stop the clock only once the device is done.

    `warmup()` pays the first-call costs (kernel compilation, allocator growth, graph capture)
    outside the timing; `sync()` before starting the clock drains the warm-up's queued work,
    and `sync()` after `run` makes the time include work `run` only queued. Returns run's value
    and the seconds between the two boundaries (time.perf_counter).
    """
    raise NotImplementedError("ch21: Time `run` alone: warm up first, and stop the clock only once the device is done.")


def requested_tokens(
    generated: Sequence[Sequence[int]], output_lens: Sequence[int]
) -> list[list[int]]:
    """The tokens that count of each row of a static batch: the first `output_len` of its row.

    A static batch generates until its longest request is done, so a shorter request's row
    runs on past what it asked for: those tokens cost time but are nobody's output, and only
    the requested ones count. Every row must have generated at least its request's tokens.
    """
    raise NotImplementedError("ch21: The tokens that count of each row of a static batch: the first `output_len` of its row.")


def speedups(results: Sequence[OfflineResult], baseline: str = "transformers") -> dict[str, float]:
    """Each variant's output throughput divided by the baseline's, all from one run.

    Only results that did the same work compare: every result must hold the same number of
    tokens for each request as the baseline (ValueError otherwise). The baseline's own ratio is
    1; without a baseline among the results there is nothing to compare to: {}.
    """
    raise NotImplementedError("ch21: Each variant's output throughput divided by the baseline's, all from one run.")


def warmup_workload(work: Workload, output_len: int = 2) -> Workload:
    """The warm-up's workload: `work`'s prompts, each rotated by one token ([a, b, c] ->
    [b, c, a]), with `output_len` tokens each (a prefill and a decode step).

    The rotation keeps the lengths and ids, but no timed prompt starts like a warm-up one, so
    the engine's prefix cache holds nothing the timed run could reuse: a warm-up on the timed
    prompts themselves hands the engine part of its prefill (the first two prompts of the
    uniform workload gave the timed run 96 of its 2,048 prompt tokens for free). Every prompt's
    shape, rather than two, also pays more of a CPU's first touches before the clock starts:
    every page a process touches for the first time costs a fault, and the engine's first
    uniform run took 52,863 of them after this warm-up against 94,910 after two prompts
    (getrusage on the course's two-core machine, 2026-12-03).
    """
    return Workload([p[1:] + p[:1] for p in work.prompts], [output_len] * len(work.prompts))


def greedy_params(work: Workload) -> list[Any]:
    """Each request's SamplingParams: greedy, exactly its output length (EOS ignored)."""
    from minisgl.core import SamplingParams

    return [SamplingParams(max_tokens=o, ignore_eos=True) for o in work.output_lens]


def run_engine(
    model: Path, work: Workload, dtype: torch.dtype, settings: dict[str, Any], variant: str
) -> OfflineResult:
    """The workload through `LLM.generate` (one call, every request queued at once), after a
    warm-up on `warmup_workload(work)`; `settings` are the engine's (pages of 16 tokens unless
    they say otherwise)."""
    from minisgl.llm import LLM

    warm = warmup_workload(work)
    params, warm_params = greedy_params(work), greedy_params(warm)
    with LLM(
        str(model),
        dtype=dtype,
        max_running_req=len(work.prompts),
        show_progress=False,
        max_seq_len=work.longest + 16,
        **{"page_size": 16, **settings},
    ) as llm:
        outputs, seconds = timed(
            lambda: llm.generate(work.prompts, params),
            warmup=lambda: llm.generate(warm.prompts, warm_params),
        )
    release_gpu_memory()
    return OfflineResult(variant, seconds, [o["token_ids"] for o in outputs])


def static_batch(hf: torch.nn.Module, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """transformers' greedy `generate` on one left-padded batch: `max_new` new ids per row."""
    pad = 0
    width = max(map(len, prompts))
    device = hf.device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad,
        )
    return out[:, width:].tolist()


def static_batches(hf: torch.nn.Module, work: Workload, batch_size: int) -> list[list[int]]:
    """The workload in static batches of `batch_size`, in arrival order: the tokens that count."""
    tokens: list[list[int]] = []
    for i in range(0, len(work.prompts), batch_size):
        lens = work.output_lens[i : i + batch_size]
        rows = static_batch(hf, work.prompts[i : i + batch_size], max(lens))
        tokens += requested_tokens(rows, lens)
    return tokens


def run_transformers(
    model: Path, work: Workload, dtype: torch.dtype, batch_size: int
) -> OfflineResult:
    """The workload through transformers' `generate`, in static batches of `batch_size`, after
    the same warm-up as the engine's (`warmup_workload`)."""
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    tokens, seconds = timed(
        partial(static_batches, hf, work, batch_size),
        warmup=partial(static_batches, hf, warmup_workload(work), batch_size),
    )
    del hf  # the weights go before the next variant loads its own
    release_gpu_memory()
    return OfflineResult("transformers", seconds, tokens)
