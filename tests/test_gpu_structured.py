"""Chapter 25 on a GPU: the grammar sampler masks logits on the device, never waits for it
inside a step, and constrained requests end in valid JSON with the GPU's backends (FlashInfer,
CUDA graphs, overlap). Skipped without CUDA and xgrammar.

The CPU tests check the same contract on the CPU, where no copy is ever asynchronous: a
`torch.tensor(..., device="cuda")` from a Python list, which waits for every forward queued on
the device, shows only here (torch's sync debug mode makes it raise).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_MODELS, load_tokenizer, require_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
xgrammar = pytest.importorskip("xgrammar")

QWEN3 = TINY_MODELS["qwen3"]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
# At least 60 letters: no request can end (and so be released) in the steps under test.
LONG_TEXT = "[a-z ]{60,400}"


def scheduler_on_cuda(enable_overlap: bool):  # noqa: ANN201 - a minisgl Scheduler
    from minisgl.scheduler import Scheduler, SchedulerConfig

    return Scheduler(
        SchedulerConfig(
            str(require_model(QWEN3)),
            device="cuda",
            page_size=16,
            num_pages=512,
            max_running_req=16,
            cache_type="radix",
            enable_overlap=enable_overlap,
            show_progress=False,
        )
    )


def test_the_mask_forbids_on_the_gpu_exactly_what_the_grammar_forbids():
    """The bitmask filled on the host, applied to CUDA logits on the constrained rows only:
    -inf exactly where a row's grammar forbids a token, every other logit unchanged."""
    from minisgl.structured import StructuredParams
    from minisgl.structured.sampler import GrammarSampler
    from minisgl.utils import make_device_tensor

    config = json.loads((require_model(QWEN3) / "config.json").read_text())
    vocab, eos = config["vocab_size"], config["eos_token_id"]
    sampler = GrammarSampler(torch.device("cuda"), vocab, 0, str(QWEN3), [eos])
    matchers = {
        0: sampler.matcher(StructuredParams(json_schema=PERSON)),
        3: sampler.matcher(StructuredParams(regex="(yes|no)")),
    }
    for token in load_tokenizer(QWEN3).encode('{"name"'):  # part-way through the object
        assert matchers[0].accept_token(token)
    bitmask = sampler.fill_mask(matchers, 5)
    logits = torch.randn(5, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    masked = logits.clone()
    xgrammar.apply_token_bitmask_inplace(
        masked, make_device_tensor(bitmask, torch.int32, masked.device), indices=list(matchers)
    )
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    allowed = bits.flatten(1)[:, :vocab].bool()
    expected = logits.cpu().clone()
    for row in matchers:
        expected[row][~allowed[row]] = float("-inf")
    assert torch.equal(masked.cpu(), expected)
    allowed_counts = [int(allowed[row].sum()) for row in matchers]
    print(f"tokens allowed: {allowed_counts} of {vocab}")
    assert all(0 < count < vocab for count in allowed_counts)


@pytest.mark.parametrize("enable_overlap", [True, False], ids=["overlap", "no-overlap"])
def test_a_constrained_step_never_synchronizes_with_the_device(enable_overlap):
    """Steps with constrained and free rows under torch's sync debug mode "error": a blocking
    copy between host and device (the rows of the constrained tokens built as a pageable
    `torch.tensor(..., device=...)`, say) or an `.item()` raises. The only wait allowed is the
    copy's event, which the scheduler and the sampler synchronize on explicitly."""
    from minisgl.core import SamplingParams
    from minisgl.structured import StructuredParams

    scheduler = scheduler_on_cuda(enable_overlap)
    for i in range(8):
        params = SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.8, seed=i)
        if i % 2 == 0:
            params = StructuredParams(max_tokens=64, temperature=0.8, seed=i, regex=LONG_TEXT)
        scheduler.add_request([(5 * i + j) % 400 + 1 for j in range(20 + i)], params)
    for _ in range(4):  # the prefill, and decode steps that compile and capture what they need
        scheduler.step()
    sampler = scheduler.engine.sampler
    masked_before = sampler.masked_steps
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(6):
            scheduler.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sampler.masked_steps - masked_before == 6, "every step under test had a constraint"


@pytest.mark.parametrize("enable_overlap", [True, False], ids=["overlap", "no-overlap"])
def test_constrained_requests_end_in_valid_json_on_the_gpu(enable_overlap):
    """Eight JSON requests and eight free ones in one batch, to the end: each JSON output parses,
    has the schema's fields, and ends by "stop" on the grammar's end-of-sequence."""
    from minisgl.core import SamplingParams
    from minisgl.structured import StructuredParams

    scheduler = scheduler_on_cuda(enable_overlap)
    constrained = {}
    for i in range(16):
        ids = [(7 * i + j) % 400 + 1 for j in range(12 + i)]
        if i % 2:
            scheduler.add_request(ids, SamplingParams(max_tokens=40, temperature=0.8, seed=i))
        else:
            params = StructuredParams(max_tokens=120, temperature=0.8, seed=i, json_schema=PERSON)
            constrained[scheduler.add_request(ids, params)] = []
    reasons = {}
    while scheduler.has_work:
        for out in scheduler.step():
            if out.uid in constrained:
                constrained[out.uid].append(out.token)
                if out.finish_reason is not None:
                    reasons[out.uid] = out.finish_reason
    tokenizer = load_tokenizer(QWEN3)
    for uid, tokens in constrained.items():
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        assert reasons[uid] == "stop", f"request {uid} ended by {reasons[uid]}: {text!r}"
        value = json.loads(text)
        assert set(value) == {"name", "age"} and 0 <= value["age"] <= 120, text
    print(f"{len(constrained)} JSON outputs valid, e.g. {tokenizer.decode(tokens)!r}")
