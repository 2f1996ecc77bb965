from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

from tqdm import tqdm

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.utils import InvalidRequestError


def generate(
    self: LLM,
    prompts: Sequence[str] | Sequence[list[int]] | str,
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Generate for every prompt; one dict per prompt, in order: text, token_ids,
    prompt_token_ids, finish_reason ("stop" at EOS, "length" at max_tokens).

    `self` is an LLM: self.scheduler (a Scheduler) and self.tokenizer.
    """
    # reference body: llm/llm.py:LLM.generate
