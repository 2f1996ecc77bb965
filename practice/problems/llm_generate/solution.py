from __future__ import annotations

from typing import Any, Sequence

from minisgl.core import SamplingParams
from minisgl.utils import InvalidRequestError


def generate(
    self,
    prompts: Sequence[str] | Sequence[list[int]] | str,
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Generate for every prompt; one dict per prompt, in order: text, token_ids,
    prompt_token_ids, finish_reason ("stop" at EOS, "length" at max_tokens).

    `self` is an LLM: self.scheduler (a Scheduler) and self.tokenizer.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    params = sampling_params if sampling_params is not None else SamplingParams()
    params_list = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    if len(params_list) != len(prompts):
        raise InvalidRequestError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
    prompt_ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    for ids, p in zip(prompt_ids, params_list):
        self.scheduler.check_request_fits(len(ids), p.max_tokens)

    uids = [self.scheduler.add_request(ids, p) for ids, p in zip(prompt_ids, params_list)]
    generated: dict[int, list[int]] = {uid: [] for uid in uids}
    finish_reason: dict[int, str] = {}
    while self.scheduler.has_work:
        for out in self.scheduler.step():
            generated[out.uid].append(out.token)
            if out.finish_reason is not None:
                finish_reason[out.uid] = out.finish_reason
    return [
        {
            "text": self.tokenizer.decode(generated[uid], skip_special_tokens=True),
            "token_ids": generated[uid],
            "prompt_token_ids": ids,
            "finish_reason": finish_reason[uid],
        }
        for uid, ids in zip(uids, prompt_ids)
    ]
