"""Chapter 25 tests: structured output (StructuredParams, GrammarSampler, response_format).

A constrained request's every output must follow its grammar. Random weights are the hard
case: the model would write garbage, so only the mask makes the output valid. Every JSON output
is parsed and validated against its schema with `jsonschema`; every regex output must match the
whole regex; a grammar that is complete forces end-of-sequence. Unconstrained requests in the
same batch keep exactly their tokens, with overlap on and off, the radix cache and chunked
prefill. The sampler's parts are checked one by one against xgrammar's own matchers.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import torch
import xgrammar
from conftest import (
    SMOLLM2,
    TINY_MODELS,
    assert_same_trace,
    encode,
    engine_config,
    generate,
    llm_fixture,
    load_tokenizer,
    scheduler_trace,
)
from course.differential import assert_same_call, call_differences, reference_function
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Batch, Req, SamplingParams
from minisgl.message import UserMsg, deserialize, serialize
from minisgl.scheduler.prefill import ChunkedReq
from minisgl.server.protocol import ChatCompletionRequest, CompletionRequest, request_params
from minisgl.structured import StructuredParams
from minisgl.structured.response_format import ANY_OBJECT
from minisgl.structured.sampler import GrammarSampler, GrammarSamplingArgs, SampledTokens
from minisgl.utils import InvalidRequestError

QWEN3 = TINY_MODELS["qwen3"]
EOS = 2  # the end-of-sequence token of every course model (SmolLM2's tokenizer)
VOCAB = 49152

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
SCHEMAS = {
    "required fields": PERSON,
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 1,
        "maxItems": 3,
    },
    "nested": {
        "type": "object",
        "properties": {
            "owner": PERSON,
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        },
        "required": ["owner", "tags"],
    },
}
REGEXES = [r"\+1-[0-9]{3}-[0-9]{4}", r"(yes|no)", r"[a-z]{2,5}@[a-z]{3}\.(com|org)"]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Hi",
]


def check_json(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


# --- StructuredParams ---------------------------------------------------------------------------


def test_a_dict_schema_is_kept_as_its_json_text():
    params = StructuredParams(max_tokens=7, json_schema=PERSON)
    assert params.json_schema == json.dumps(PERSON) and params.regex is None
    assert params.max_tokens == 7 and isinstance(params, SamplingParams)
    text = json.dumps(PERSON)
    assert StructuredParams(json_schema=text).json_schema == text
    assert StructuredParams(regex="a+").regex == "a+"


@pytest.mark.parametrize("fields", [{}, {"json_schema": PERSON, "regex": "a"}])
def test_exactly_one_constraint_is_required(fields):
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredParams(**fields)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"json_schema": "{not json"}, ["json_schema", "not valid JSON"]),
        ({"json_schema": {"type": "bogus"}}, ["json_schema", "bogus"]),
        ({"regex": "(ab"}, ["regex", "parenthesis"]),
    ],
)
def test_a_constraint_the_grammar_cannot_follow_is_an_invalid_request(fields, words):
    with pytest.raises(InvalidRequestError) as error:
        StructuredParams(**fields)
    assert all(w in str(error.value) for w in words), str(error.value)
    assert ".cc:" not in str(error.value), "the message names the reason, not xgrammar's C++"


def test_ignore_eos_and_the_base_checks_are_refused():
    with pytest.raises(InvalidRequestError, match="ignore_eos"):
        StructuredParams(regex="a", ignore_eos=True)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        StructuredParams(regex="a", max_tokens=0)


def test_a_constraint_survives_the_trip_between_processes():
    msg = UserMsg(3, [1, 2], StructuredParams(max_tokens=5, temperature=0.5, json_schema=PERSON))
    back = deserialize(serialize(msg))
    assert isinstance(back.sampling_params, StructuredParams)
    assert back == msg


# --- GrammarSampler, part by part ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sampler() -> GrammarSampler:
    return GrammarSampler(torch.device("cpu"), VOCAB, 0, str(QWEN3), [EOS])


def make_req(params: SamplingParams, uid: int = 0, cls: type[Req] = Req) -> Req:
    """A new request of a 3-token prompt that may generate all its max_tokens."""
    return cls(torch.tensor([5, 6, 7], dtype=torch.int32), uid, 0, params.max_tokens, uid, params)


def reference_mask(sampler: GrammarSampler, params: StructuredParams, prefix: list[int]):
    """xgrammar's own mask after `prefix`: a matcher of our own, fed the same tokens."""
    matcher = xgrammar.GrammarMatcher(sampler.compiler.compile_grammar(params.grammar()))
    for token in prefix:
        assert matcher.accept_token(token)
    mask = xgrammar.allocate_token_bitmask(1, VOCAB)
    matcher.fill_next_token_bitmask(mask, 0)
    return mask[0]


def allowed(mask_row: torch.Tensor) -> set[int]:
    logits = torch.zeros(1, VOCAB)
    xgrammar.apply_token_bitmask_inplace(logits, mask_row.view(1, -1))
    return set(torch.nonzero(logits[0] == 0).flatten().tolist())


def test_prepare_gives_each_constrained_row_its_own_matcher_for_its_whole_life(sampler):
    plain = make_req(SamplingParams(temperature=0.7, top_k=5), 0)
    json_req = make_req(StructuredParams(json_schema=PERSON, temperature=1.0, seed=9), 1)
    chunk = make_req(StructuredParams(regex="a"), 2, ChunkedReq)
    regex_req = make_req(StructuredParams(regex="(yes|no)"), 3)
    batch = Batch([plain, json_req, chunk, regex_req], "prefill")
    args = sampler.prepare(batch)
    assert isinstance(args, GrammarSamplingArgs)
    assert sorted(args.matchers) == [1, 3], "only constrained rows that sample get a matcher"
    assert args.matchers[1] is not args.matchers[3]
    base = GrammarSampler.__mro__[1].prepare(sampler, batch)
    assert args.all_greedy == base.all_greedy is False
    for name in ("greedy", "temperature", "top_k", "top_p"):
        assert torch.equal(getattr(args, name), getattr(base, name)), name
    assert args.row_seeds == base.row_seeds and list(args.row_seeds) == [1], "the seeded row"
    again = sampler.prepare(Batch([regex_req, json_req], "decode"))
    assert again.matchers[0] is args.matchers[3] and again.matchers[1] is args.matchers[1]
    fresh = sampler.prepare(Batch([make_req(StructuredParams(regex="(yes|no)"), 4)], "prefill"))
    assert fresh.matchers[0] is not args.matchers[3], "each request has a matcher of its own"


def test_prepare_goes_on_with_the_grammar_of_a_resumed_request_after_its_tokens(sampler):
    """A request preempted by recompute (chapter 23) comes back as a new Req: its prompt ends
    with the tokens it had generated, and max_tokens minus those are left. Its matcher must have
    accepted them, not start the grammar over (which wrote a second object into the first)."""
    params = StructuredParams(json_schema=PERSON, max_tokens=30)
    generated = load_tokenizer(QWEN3).encode('{"name": "Al', add_special_tokens=False)
    ids = torch.tensor([5, 6, 7, *generated], dtype=torch.int32)
    resumed = Req(ids, 0, 0, params.max_tokens - len(generated), 0, params)
    args = sampler.prepare(Batch([resumed], "prefill"))
    mask = sampler.fill_mask(args.matchers, 1)[0]
    assert torch.equal(mask, reference_mask(sampler, params, generated))
    assert not torch.equal(mask, reference_mask(sampler, params, [])), "not the grammar's start"
    new = make_req(params, 1)  # a request that generated nothing yet starts at the beginning
    fresh = sampler.fill_mask(sampler.prepare(Batch([new], "prefill")).matchers, 1)[0]
    assert torch.equal(fresh, reference_mask(sampler, params, []))


def test_fill_mask_sets_each_constrained_row_from_its_matcher_and_leaves_the_rest_open(sampler):
    params = StructuredParams(json_schema=PERSON)
    opening = reference_mask(sampler, params, [])
    matcher = xgrammar.GrammarMatcher(sampler.compiler.compile_grammar(params.grammar()))
    done = xgrammar.GrammarMatcher(sampler.compiler.compile_grammar(params.grammar()))
    assert done.accept_string('{"name": "a", "age": 1}') and done.accept_token(EOS)
    assert done.is_terminated()
    mask = sampler.fill_mask({1: matcher, 3: done}, 4)
    assert mask.shape == (4, (VOCAB + 31) // 32) and mask.dtype == torch.int32
    assert torch.equal(mask[1], opening)
    assert len(allowed(mask[1])) < VOCAB
    for row in (0, 2, 3):
        assert bool((mask[row] == -1).all()), f"row {row} must allow every token"


def test_accept_unaccepted_advances_each_matcher_by_its_token_once(sampler):
    [yes] = encode(QWEN3, ["yes"])[0]
    params = StructuredParams(regex="(yes|no)!")
    first = xgrammar.GrammarMatcher(sampler.compiler.compile_grammar(params.grammar()))
    second = xgrammar.GrammarMatcher(sampler.compiler.compile_grammar(params.grammar()))
    sampler.unaccepted = SampledTokens([first, second], torch.tensor([yes, yes]), None)
    sampler.accept_unaccepted()
    assert sampler.unaccepted is None
    for matcher in (first, second):
        mask = xgrammar.allocate_token_bitmask(1, VOCAB)
        matcher.fill_next_token_bitmask(mask, 0)
        assert torch.equal(mask[0], reference_mask(sampler, params, [yes]))
    sampler.accept_unaccepted()  # nothing left: no second acceptance
    assert first.accept_string("!") and first.accept_token(EOS) and first.is_terminated()
    sampler.unaccepted = SampledTokens([first], torch.tensor([yes]), None)
    sampler.accept_unaccepted()  # a terminated matcher takes no token (the scheduler drops it)
    assert sampler.unaccepted is None
    sampler.unaccepted = SampledTokens([second], torch.tensor([yes]), None)
    with pytest.raises(RuntimeError, match=str(yes)):
        sampler.accept_unaccepted()


class CopyInFlight:
    """Stands for the copy of sampled tokens to the host (a CUDA event): the tokens are only
    there once `synchronize` returns."""

    def __init__(self, host: torch.Tensor, tokens: list[int]) -> None:
        self.host, self.tokens = host, tokens

    def synchronize(self) -> None:
        self.host.copy_(torch.tensor(self.tokens))


def test_accept_unaccepted_waits_for_the_copy_before_reading_the_tokens(sampler):
    [yes] = encode(QWEN3, ["yes"])[0]
    params = StructuredParams(regex="(yes|no)!")
    matcher = xgrammar.GrammarMatcher(sampler.compiler.compile_grammar(params.grammar()))
    host = torch.tensor([EOS])  # what the host buffer held before the copy: not allowed yet
    sampler.unaccepted = SampledTokens([matcher], host, CopyInFlight(host, [yes]))
    sampler.accept_unaccepted()
    mask = xgrammar.allocate_token_bitmask(1, VOCAB)
    matcher.fill_next_token_bitmask(mask, 0)
    assert torch.equal(mask[0], reference_mask(sampler, params, [yes]))


def test_sample_masks_the_constrained_rows_and_keeps_their_tokens_for_the_next_step(sampler):
    plain = make_req(SamplingParams(), 10)
    digits = make_req(StructuredParams(regex="[0-9]+"), 11)
    seeded = make_req(StructuredParams(regex="(yes|no)", temperature=1.0, seed=3), 12)
    args = sampler.prepare(Batch([plain, digits, seeded], "prefill"))
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    original = logits.clone()
    steps, seconds = sampler.masked_steps, sampler.mask_seconds
    tokens = sampler.sample(logits, args)
    assert tokens[0] == original[0].argmax(), "an unconstrained row is sampled as before"
    assert int(tokens[1]) in allowed(reference_mask(sampler, digits.sampling_params, []))
    assert int(tokens[1]) == max(
        allowed(reference_mask(sampler, digits.sampling_params, [])), key=lambda t: original[1, t]
    ), "greedy picks the best allowed token"
    assert int(tokens[2]) in allowed(reference_mask(sampler, seeded.sampling_params, []))
    assert sampler.masked_steps == steps + 1 and sampler.mask_seconds > seconds
    kept = sampler.unaccepted
    assert kept is not None and kept.copy_done_event is None
    assert kept.matchers == [args.matchers[1], args.matchers[2]]
    assert kept.tokens.tolist() == [int(tokens[1]), int(tokens[2])]
    # The next step accepts them first: its mask follows on from the kept tokens.
    args = sampler.prepare(Batch([digits], "decode"))
    sampler.sample(torch.randn(1, VOCAB), args)
    assert args.matchers[0] is kept.matchers[0]
    # An unconstrained batch leaves nothing to accept and counts no masked step.
    sampler.accept_unaccepted()
    steps = sampler.masked_steps
    plain_args = sampler.prepare(Batch([plain], "decode"))
    assert sampler.sample(original[:1].clone(), plain_args) == original[0].argmax()
    assert sampler.unaccepted is None and sampler.masked_steps == steps


class SlowMatcher:
    """A matcher whose accept_token takes a while, to see that `mask_seconds` times it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.accepted: list[int] = []

    def is_terminated(self) -> bool:
        return False

    def accept_token(self, token: int) -> bool:
        time.sleep(self.seconds)
        self.accepted.append(token)
        return True


def test_sample_accepts_the_last_tokens_even_unconstrained_and_times_the_accepting(sampler):
    slow = SlowMatcher(0.05)
    sampler.unaccepted = SampledTokens([slow], torch.tensor([5]), None)
    steps, seconds = sampler.masked_steps, sampler.mask_seconds
    args = sampler.prepare(Batch([make_req(SamplingParams(), 20)], "decode"))
    sampler.sample(torch.randn(1, VOCAB), args)
    assert slow.accepted == [5] and sampler.unaccepted is None
    assert sampler.mask_seconds - seconds >= slow.seconds, "mask_seconds times the accepting"
    assert sampler.masked_steps == steps, "a step without a constrained row is not a masked step"


# --- the engine, end to end on random weights ---------------------------------------------------

config = engine_config()
llms = llm_fixture(config)
SETUPS = {
    "plain": dict(),
    "overlap": dict(enable_overlap=True),
    "overlap-radix-chunk7-page16": dict(
        enable_overlap=True, cache_type="radix", max_extend_tokens=7, page_size=16
    ),
}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_every_output_validates_against_its_schema_on_random_weights(setup, llms):
    llm = llms(QWEN3, **SETUPS[setup])
    prompts = encode(QWEN3, PROMPTS)
    cases = [(p, name) for p in prompts for name in SCHEMAS]
    params = [StructuredParams(max_tokens=80, json_schema=SCHEMAS[n]) for _, n in cases]
    outputs = generate(llm, [p for p, _ in cases], params)
    for (_, name), out in zip(cases, outputs):
        check_json(out["text"], SCHEMAS[name])
        assert out["finish_reason"] == "stop" and out["token_ids"][-1] == EOS, name


@pytest.mark.parametrize("overlap", [False, True])
def test_json_stays_valid_when_optimistic_admission_preempts_constrained_requests(overlap):
    """Twelve schema requests on 80 KV slots, admitted optimistically: five are preempted and
    resumed mid-object (chapter 23), and every one still ends in valid JSON."""
    from minisgl.llm import LLM

    prompts = encode(QWEN3, PROMPTS)
    cases = [(prompts[i % len(prompts)], list(SCHEMAS)[i % len(SCHEMAS)]) for i in range(12)]
    tight = config(num_pages=80, max_running_req=12, admission="optimistic", enable_overlap=overlap)
    with LLM(str(QWEN3), **tight) as llm:
        params = [StructuredParams(max_tokens=48, json_schema=SCHEMAS[n]) for _, n in cases]
        outputs = generate(llm, [p for p, _ in cases], params)
        preemptions = llm.scheduler.policy.preemptor.preemptions
    assert preemptions >= 5, f"only {preemptions} preemptions: the pool is not tight enough"
    for (_, name), out in zip(cases, outputs):
        check_json(out["text"], SCHEMAS[name])
        assert out["finish_reason"] == "stop", name


@pytest.mark.parametrize("overlap", [False, True])
def test_aborting_a_constrained_request_mid_object_leaves_its_neighbour_valid(overlap):
    """An abort (chapter 11) drops the request, and with it its matcher: the sampler keys them
    weakly, so the aborted grammar does not outlive it, and the other request's JSON is whole."""
    import gc

    from minisgl.scheduler import Scheduler, SchedulerConfig
    from minisgl.utils import load_tokenizer as load_minisgl_tokenizer

    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(enable_overlap=overlap)))
    kept, aborted = encode(QWEN3, PROMPTS[:2])
    params = StructuredParams(max_tokens=48, json_schema=json.dumps(PERSON))
    uids = [scheduler.add_request(ids, params) for ids in (kept, aborted)]
    outputs = [out for _ in range(4) for out in scheduler.step()]
    assert scheduler.abort_request(uids[1])
    while scheduler.has_work:
        outputs += scheduler.step()
    scheduler.cache_manager.check_integrity()
    gc.collect()
    left = {req.uid for req in scheduler.engine.sampler.matchers}
    assert uids[1] not in left, "the aborted request's matcher outlived it"
    tokens = [out.token for out in outputs if out.uid == uids[0]]
    assert outputs[-1].uid == uids[0] and outputs[-1].finish_reason == "stop"
    text = load_minisgl_tokenizer(str(QWEN3)).decode(tokens, skip_special_tokens=True)
    check_json(text, PERSON)


def test_regex_outputs_match_the_whole_regex_with_sampling_too(llms):
    llm = llms(QWEN3, enable_overlap=True)
    prompts = encode(QWEN3, PROMPTS[:2])
    params = [
        StructuredParams(max_tokens=40, regex=r, temperature=t, seed=s)
        for r in REGEXES
        for t, s in ((0.0, None), (1.0, 7))
    ]
    outputs = generate(llm, [prompts[i % 2] for i in range(len(params))], params)
    for p, out in zip(params, outputs):
        assert re.fullmatch(p.regex, out["text"]), (p.regex, out["text"])
        assert out["finish_reason"] == "stop"


def test_a_complete_grammar_forces_end_of_sequence(llms):
    llm = llms(QWEN3)
    [out] = generate(llm, encode(QWEN3, PROMPTS[:1]), StructuredParams(max_tokens=20, regex="yes"))
    assert out["text"] == "yes" and out["finish_reason"] == "stop"
    assert out["token_ids"][-1] == EOS and EOS not in out["token_ids"][:-1]


@pytest.mark.parametrize("setup", list(SETUPS))
def test_unconstrained_neighbours_keep_exactly_their_tokens(setup, llms):
    llm = llms(QWEN3, **SETUPS[setup])
    prompts = encode(QWEN3, PROMPTS)
    free = [SamplingParams(max_tokens=n) for n in (9, 4, 12, 6)]
    alone = generate(llm, prompts, free)
    mixed_params: list[SamplingParams] = []
    for p in free:
        mixed_params += [p, StructuredParams(max_tokens=30, json_schema=SCHEMAS["enum"])]
    mixed = generate(llm, [p for p in prompts for _ in (0, 1)], mixed_params)
    for i, out in enumerate(alone):
        assert mixed[2 * i]["token_ids"] == out["token_ids"], "a constrained neighbour changed it"
        check_json(mixed[2 * i + 1]["text"], SCHEMAS["enum"])


def test_overlap_and_the_radix_cache_change_no_constrained_token(llms):
    prompts = encode(QWEN3, PROMPTS)
    params = [StructuredParams(max_tokens=60, json_schema=SCHEMAS["nested"]) for _ in prompts]
    runs = [generate(llms(QWEN3, **SETUPS[s]), prompts, params) for s in SETUPS]
    for outputs in runs[1:]:
        assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in runs[0]]


# --- response_format ----------------------------------------------------------------------------


@pytest.mark.parametrize("request_type", [CompletionRequest, ChatCompletionRequest])
def test_response_format_asks_for_the_right_constraint(request_type):
    prompt = (
        {"prompt": "Hi"}
        if request_type is CompletionRequest
        else {"messages": [{"role": "user", "content": "Hi"}]}
    )

    def params(**fields):
        body = request_type(model="m", max_tokens=9, temperature=0.5, seed=4, **prompt, **fields)
        return request_params(body)

    assert type(params()) is SamplingParams
    assert type(params(response_format={"type": "text"})) is SamplingParams
    json_object = params(response_format={"type": "json_object"})
    assert isinstance(json_object, StructuredParams)
    assert json.loads(json_object.json_schema) == ANY_OBJECT and json_object.regex is None
    schema = params(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        }
    )
    assert isinstance(schema, StructuredParams) and json.loads(schema.json_schema) == PERSON
    for p in (json_object, schema):
        assert (p.max_tokens, p.temperature, p.seed, p.top_p) == (9, 0.5, 4, 1.0)


@pytest.mark.parametrize(
    "response_format, words",
    [
        ({"type": "xml"}, "response_format.type"),
        ("json", "response_format"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "name"),
        ({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": 3}}}, "schema"),
    ],
)
def test_a_bad_response_format_is_an_invalid_request(response_format, words):
    body = CompletionRequest(model="m", prompt="Hi", response_format=response_format)
    with pytest.raises(InvalidRequestError, match=re.escape(words)):
        request_params(body)


# --- the real model ------------------------------------------------------------------------------


SUBJECTS = [
    "a cat",
    "a city",
    "a chef",
    "a river",
    "a robot",
    "a song",
    "a bridge",
    "a bee",
]  # 2 a schema


@pytest.fixture(scope="module")
def smollm2_llm():  # noqa: ANN201 - a minisgl LLM, built before the test's clock starts
    """SmolLM2 with its grammars compiled: one token under each schema reads the vocabulary
    into xgrammar and compiles the four grammars (about two seconds) before the test runs."""
    from minisgl.llm import LLM

    with LLM(str(SMOLLM2), **config(max_running_req=len(SUBJECTS), num_pages=2048)) as llm:
        warm = [StructuredParams(max_tokens=1, json_schema=schema) for schema in SCHEMAS.values()]
        llm.generate(["{"] * len(warm), warm)
        yield llm


@pytest.mark.slow
def test_smollm2_answers_8_prompts_with_valid_json_under_four_schemas(smollm2_llm):
    names = list(SCHEMAS)
    prompts = [
        smollm2_llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Describe {s} as JSON."}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for s in SUBJECTS
    ]
    params = [
        StructuredParams(max_tokens=64, json_schema=SCHEMAS[names[i % len(names)]])
        for i in range(len(prompts))
    ]
    outputs = generate(smollm2_llm, prompts, params)
    for i, out in enumerate(outputs):
        check_json(out["text"], SCHEMAS[names[i % len(names)]])
        assert out["finish_reason"] == "stop"
    assert len(outputs) == len(SUBJECTS)


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments, and
# exceptions must match. A grammar matcher is a C++ object: it compares by its state (the mask
# it fills now, whether it is terminated) and by which matcher it is; matchers are walked
# through their grammars by generated choices among the tokens each allows (end-of-sequence
# too, where the output is complete). Last, whole runs of constrained and free requests: the
# tokens, step by step, yours against the chapter's reference stubs.

GRAMMARS = {  # the constraints the matchers of these comparisons follow
    "person": dict(json_schema=PERSON),
    "enum": dict(json_schema=SCHEMAS["enum"]),
    "yes or no": dict(regex=r"(yes|no)!"),
    "digits": dict(regex=r"[0-9]{1,3}"),
}


COMPILED: dict[tuple[int, str], tuple[Any, Any]] = {}


def compiled(compiler: Any, name: str) -> Any:
    """Grammar `name` compiled against the vocabulary (once: every sampler shares a compiler)."""
    key = (id(compiler), name)
    if key not in COMPILED:
        grammar = compiler.compile_grammar(StructuredParams(**GRAMMARS[name]).grammar())
        COMPILED[key] = (compiler, grammar)  # the compiler kept, so that its id stays its own
    return COMPILED[key][1]


def allowed_now(matcher: Any) -> list[int]:
    mask = xgrammar.allocate_token_bitmask(1, VOCAB)
    matcher.fill_next_token_bitmask(mask, 0)
    return sorted(allowed(mask[0]))


def walked(sampler: GrammarSampler, name: str, picks: list[int]) -> tuple[Any, list[int]]:
    """A matcher of grammar `name` after a walk of len(picks) allowed tokens (pick 0 takes
    end-of-sequence where it is allowed), and the tokens taken; the walk ends with the grammar."""
    matcher = xgrammar.GrammarMatcher(compiled(sampler.compiler, name))
    taken = []
    for pick in picks:
        if matcher.is_terminated():
            break
        tokens = allowed_now(matcher)
        token = EOS if pick == 0 and EOS in tokens else tokens[pick % len(tokens)]
        assert matcher.accept_token(token)
        taken.append(token)
    return matcher, taken


def matcher_state(matcher: Any) -> tuple[bool, torch.Tensor]:
    """What a matcher is now: terminated or not, and the mask it fills."""
    mask = xgrammar.allocate_token_bitmask(1, VOCAB)
    if not matcher.is_terminated():
        matcher.fill_next_token_bitmask(mask, 0)
    return matcher.is_terminated(), mask[0]


WALKS = st.lists(st.integers(0, 40), max_size=8)  # a walk's choices among the allowed tokens
BASE_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.sampled_from([0, 1, 16]),
        "temperature": st.sampled_from([0.0, 0.7, -1.0]),
        "top_p": st.sampled_from([1.0, 0.5]),
        "ignore_eos": st.booleans(),
        "seed": st.sampled_from([None, 3]),
    },
)
CONSTRAINTS = [
    {},
    dict(json_schema=PERSON),
    dict(json_schema=json.dumps(SCHEMAS["enum"])),
    dict(json_schema={}),
    dict(json_schema="{not json"),
    dict(json_schema={"type": "bogus"}),
    dict(json_schema=PERSON, regex="a"),
    dict(regex="(yes|no)"),
    dict(regex="(ab"),
    dict(regex=""),
]


@settings(max_examples=8)
@given(fields=BASE_FIELDS)
def test_post_init_matches_the_reference(fields):
    """Every constraint (a dict or a text schema, a regex, none, both, ones xgrammar refuses)
    with base fields in and out of range and ignore_eos on and off: the fields after, or the
    exception (its type, and the fields its message names)."""
    for constraint in CONSTRAINTS:

        def build() -> tuple[StructuredParams]:
            params = StructuredParams.__new__(StructuredParams)
            for f in dataclasses.fields(StructuredParams):
                setattr(params, f.name, f.default)
            for name, value in (fields | constraint).items():
                setattr(params, name, copy.deepcopy(value))
            return (params,)

        assert_same_call(StructuredParams.__post_init__, build=build)


# Rows of a batch: (kind, grammar, tokens generated before this Req was made, walk after).
ROWS = st.lists(
    st.tuples(
        st.sampled_from(["free", "constrained", "chunk", "seeded", "known"]),
        st.sampled_from(list(GRAMMARS)),
        WALKS,  # what a resumed request generated before (a walk of its grammar)
        st.lists(st.integers(1, 40), min_size=1, max_size=2),  # a known matcher's steps since
    ),
    min_size=1,
    max_size=5,
)


def batch_of(sampler: GrammarSampler, rows: list[tuple]) -> Batch:
    """A batch of free, constrained (new or resumed after generating some tokens), chunked,
    seeded rows; a "known" row's request had its matcher made by an earlier step (the
    reference's prepare) and advanced since. The matchers of known rows are kept in
    `sampler._earlier`, by uid."""
    reqs, known = [], []
    for uid, (kind, grammar, before, since) in enumerate(rows):
        constraint = GRAMMARS[grammar]
        if kind == "free":
            params: SamplingParams = SamplingParams(max_tokens=20, temperature=0.7, seed=uid)
        else:
            seeded = dict(temperature=1.0, seed=uid) if kind == "seeded" else {}
            params = StructuredParams(max_tokens=20, **constraint, **seeded)
        generated = [] if kind in ("free", "known") else walked(sampler, grammar, before)[1]
        generated = generated[:19]
        ids = torch.tensor([5, 6, 7, *generated], dtype=torch.int32)
        cls = ChunkedReq if kind == "chunk" else Req
        req = cls(ids, uid, 0, params.max_tokens - len(generated), 100 + uid, params)
        reqs.append(req)
        if kind == "known":
            known.append((req, grammar, since))
    batch = Batch(reqs, "prefill")
    earlier = reference_function(GrammarSampler, "prepare")
    sampler._earlier = {}
    if known:
        args = earlier(sampler, Batch([req for req, _, _ in known], "prefill"))
        for (req, grammar, since), matcher in zip(known, args.matchers.values()):
            for pick in since:  # the steps it took since: it is no longer at the start
                tokens = allowed_now(matcher)
                if not matcher.is_terminated():
                    assert matcher.accept_token(tokens[pick % len(tokens)])
            sampler._earlier[req.uid] = matcher
    return batch


@pytest.fixture(scope="module")
def fresh_sampler(sampler: GrammarSampler) -> Callable[[], GrammarSampler]:
    """A new GrammarSampler (its generator seeded alike) for each side of a comparison."""
    return lambda: GrammarSampler(torch.device("cpu"), VOCAB, 0, str(QWEN3), [EOS])


@settings(max_examples=20)
@given(rows=ROWS)
def test_prepare_matches_the_reference(fresh_sampler, rows):
    """The base arguments, which rows get a matcher, each matcher's state (a resumed request's
    goes on after its tokens), which matcher it is (a known request's own, the one kept for
    its request) and the requests that have one."""

    def build() -> tuple:
        sampler = fresh_sampler()
        return sampler, batch_of(sampler, rows)

    def observe(result: Any, sampler: GrammarSampler, batch: Batch) -> dict[str, Any]:
        matchers = getattr(result, "matchers", {})
        base = {k: v for k, v in vars(result).items() if k != "matchers"}
        reqs = batch.reqs
        return {
            "type": type(result).__name__,
            "base arguments": base,
            "rows with a matcher": sorted(matchers),
            "their states": {row: matcher_state(m) for row, m in matchers.items()},
            "kept for their request": {
                row: sampler.matchers.get(reqs[row]) is m for row, m in matchers.items()
            },
            "the known request's own": {
                row: sampler._earlier.get(reqs[row].uid) is m for row, m in matchers.items()
            },
            "requests with a matcher": sorted(req.uid for req in sampler.matchers.keys()),
        }

    assert_same_call(GrammarSampler.prepare, build=build, observe=observe)


UNACCEPTED = st.lists(
    st.tuples(st.sampled_from(list(GRAMMARS)), WALKS, st.integers(0, 40)), max_size=4
)


def with_unaccepted(
    sampler: GrammarSampler, entries: list[tuple], refused: bool, in_flight: bool
) -> None:
    """sampler.unaccepted: matchers walked through their grammars (some terminated) with a
    token each that the grammar allows now (a terminated one's: any), or with `refused` the
    last one's a token it does not allow; on its way to the host or there."""
    matchers, tokens = [], []
    for i, (grammar, walk, pick) in enumerate(entries):
        matcher, _ = walked(sampler, grammar, walk)
        options = [EOS, 9] if matcher.is_terminated() else allowed_now(matcher)
        if refused and i == len(entries) - 1 and not matcher.is_terminated():
            options = sorted(set(range(VOCAB)) - set(options))[:50]
        matchers.append(matcher)
        tokens.append(options[pick % len(options)])
    sampler._given = matchers
    if not entries:
        sampler.unaccepted = None
        return
    host = torch.tensor(tokens)
    event = None
    if in_flight:  # the host buffer holds stale tokens until synchronize
        event, host = CopyInFlight(torch.zeros_like(host), tokens), torch.zeros_like(host)
        event.host = host
    sampler.unaccepted = SampledTokens(matchers, host, event)


def accepting(accept: Callable[[GrammarSampler], None]) -> Callable[..., str]:
    """`accept(sampler)`, with a RuntimeError (a token the grammar refused) as its result, so
    that what it leaves behind is compared too."""

    def run(sampler: GrammarSampler) -> str:
        try:
            accept(sampler)
        except RuntimeError:
            return "raised RuntimeError"
        return "returned"

    return run


@settings(max_examples=25)
@given(entries=UNACCEPTED, refused=st.booleans(), in_flight=st.booleans())
def test_accept_unaccepted_matches_the_reference(fresh_sampler, entries, refused, in_flight):
    """Nothing to accept, or up to four matchers (some terminated) with their tokens, on their
    way to the host or there, a refused one or not: what it raises, each matcher's state
    after, and what is left unaccepted (even after a refusal)."""

    def build() -> tuple[GrammarSampler]:
        sampler = fresh_sampler()
        with_unaccepted(sampler, entries, refused, in_flight)
        return (sampler,)

    def observe(result: str, sampler: GrammarSampler) -> tuple:
        return result, sampler.unaccepted, [matcher_state(m) for m in sampler._given]

    found = call_differences(
        accepting(GrammarSampler.accept_unaccepted),
        build=build,
        reference=accepting(reference_function(GrammarSampler, "accept_unaccepted")),
        observe=observe,
    )
    assert not found, "GrammarSampler.accept_unaccepted differs:\n  " + "\n  ".join(found)


@settings(max_examples=25)
@given(
    entries=st.lists(st.tuples(st.sampled_from(list(GRAMMARS)), WALKS), max_size=3),
    rows=st.lists(st.integers(0, 5), min_size=3, max_size=3, unique=True),
    extra=st.integers(0, 2),
)
def test_fill_mask_matches_the_reference(fresh_sampler, entries, rows, extra):
    """Matchers at rows out of order (some terminated) in batches with rows of no matcher:
    the bitmask, and each matcher's state after."""

    def build() -> tuple:
        sampler = fresh_sampler()
        matchers = {row: walked(sampler, g, walk)[0] for row, (g, walk) in zip(rows, entries)}
        size = max(matchers, default=0) + 1 + extra
        return sampler, matchers, size

    def observe(result: torch.Tensor, sampler: GrammarSampler, matchers: dict, rows: int):
        return result, {row: matcher_state(m) for row, m in matchers.items()}

    assert_same_call(GrammarSampler.fill_mask, build=build, observe=observe)


@settings(max_examples=20)
@given(
    rows=ROWS,
    entries=UNACCEPTED,
    in_flight=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sample_matches_the_reference(fresh_sampler, rows, entries, in_flight, seed):
    """A batch of free and constrained rows (greedy, seeded, sampled), the last step's tokens
    left to accept or none: the tokens, the logits after (masked in place on the constrained
    rows), the matchers' states, what is kept to accept next and the masked steps."""

    def build() -> tuple:
        sampler = fresh_sampler()
        with_unaccepted(sampler, entries, refused=False, in_flight=in_flight)
        batch = batch_of(sampler, rows)
        args = reference_function(GrammarSampler, "prepare")(sampler, batch)
        logits = torch.randn(batch.size, VOCAB, generator=torch.Generator().manual_seed(seed))
        return sampler, logits, args

    def observe(tokens: torch.Tensor, sampler: GrammarSampler, logits: torch.Tensor, args: Any):
        kept = sampler.unaccepted
        return {
            "tokens": tokens,
            "logits": logits,
            "matchers of the batch": {r: matcher_state(m) for r, m in args.matchers.items()},
            "the last step's matchers": [matcher_state(m) for m in sampler._given],
            "kept to accept": None
            if kept is None
            else (
                [[r for r, m in args.matchers.items() if m is k] for k in kept.matchers],
                kept.tokens,
                kept.copy_done_event,
            ),
            "masked_steps": sampler.masked_steps,
        }

    assert_same_call(GrammarSampler.sample, build=build, observe=observe)


RESPONSE_FORMATS = [
    None,  # no response_format
    {"type": "text"},
    {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}},
    {"type": "json_schema", "json_schema": {"name": "any"}},  # no schema: any JSON
    {"type": "json_schema"},
    {"type": "json_schema", "json_schema": {"schema": PERSON}},
    {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
    {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": 3}}},
    {"type": "xml"},
    "json",
    {},
]


def invalid_request(function: Callable[..., Any], arguments: tuple) -> str | None:
    """The message of the InvalidRequestError `function(*arguments)` raises, if it does."""
    try:
        function(*arguments)
    except InvalidRequestError as error:
        return str(error)
    return None


@settings(max_examples=6)
@given(
    chat=st.booleans(),
    max_tokens=st.sampled_from([1, 9]),
    temperature=st.sampled_from([0.0, 0.5]),
    seed=st.sampled_from([None, 4]),
    ignore_eos=st.booleans(),
)
def test_apply_response_format_matches_the_reference(
    chat, max_tokens, temperature, seed, ignore_eos
):
    """Every kind of response_format (none, text, json_object, json_schema with or without its
    parts, ones the API does not define, a schema the grammar cannot follow) on completions
    and chats, with the request's own sampling fields: the parameters, or the exception,
    whose message must name where the request is wrong as the reference's does (its first
    "response_format..." path)."""
    from minisgl.structured import response_format as module

    for response_format in RESPONSE_FORMATS:

        def build() -> tuple:
            extra = {} if response_format is None else {"response_format": response_format}
            prompt = {"messages": [{"role": "user", "content": "Hi"}]} if chat else {"prompt": "Hi"}
            kind = ChatCompletionRequest if chat else CompletionRequest
            body = kind(model="m", **prompt, **copy.deepcopy(extra))
            params = SamplingParams(
                max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=ignore_eos
            )
            return body, params

        assert_same_call(module.apply_response_format, build=build)
        theirs = invalid_request(reference_function(module, "apply_response_format"), build())
        where = re.match(r"response_format(\.\w+)*", theirs or "")
        if where is not None:
            yours = invalid_request(module.apply_response_format, build()) or ""
            assert where.group() in yours, (
                f"apply_response_format: for response_format={response_format!r} your message "
                f"{yours!r} does not say where the request is wrong ({where.group()!r}), as "
                f"the reference's {theirs!r} does"
            )


TRACE_SETUPS = {
    "plain": dict(),
    "overlap, radix, chunks of 7, page 4": dict(
        enable_overlap=True, cache_type="radix", max_extend_tokens=7, page_size=4
    ),
}


@pytest.mark.parametrize("setup", list(TRACE_SETUPS))
def test_the_scheduler_runs_constrained_requests_as_the_reference_does(setup):
    """Every stub in the loop: constrained requests (a schema, regexes, greedy and seeded)
    beside free ones, their tokens step by step (each the best or a draw among what the mask
    allows) and the batches, and the masked steps, as with the chapter's reference code."""
    from minisgl.scheduler import Scheduler, SchedulerConfig

    prompts = encode(QWEN3, PROMPTS)
    requests = [
        (prompts[0], StructuredParams(max_tokens=16, json_schema=SCHEMAS["enum"])),
        (prompts[1], SamplingParams(max_tokens=5)),
        (prompts[2], StructuredParams(max_tokens=8, regex=r"(yes|no)!")),
        (prompts[3], StructuredParams(max_tokens=6, regex=r"[0-9]{2,4}", temperature=1.0, seed=5)),
    ]

    def run() -> list[str]:
        scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(**TRACE_SETUPS[setup])))
        events = scheduler_trace(scheduler, requests)
        return events + [f"{scheduler.engine.sampler.masked_steps} masked steps"]

    assert_same_trace(25, run, setup)
