"""Every feature with every other: the options that change a step's path, combined.

Each feature has its chapter's tests; this file runs them together. A cell of the matrix is one
value of every option below; the engine runs six requests on tiny-qwen3 in a KV pool a quarter
of their worst case, and the cell passes when
- plain requests get transformers' greedy tokens, and constrained ones valid JSON that ends with
  "stop" (ignoring EOS is no use there: the grammar ends the object);
- the cache manager's integrity check holds afterwards;
- optimistic admission preempted at least once (the pool is tight enough to matter).
A combination the engine cannot serve must be refused when it is built, with a ConfigError that
names the options; none is today. The pairwise cells (every value of every option meets every
value of every other at least once) run in every test run. The slow tests run the whole product
with the torch backend, and the Triton kernels (in Triton's interpreter, some seventy times slower
a cell) on every path by which a batch reaches attention: page sizes, mixed batches, verify
batches, and re-prefills after preemption over a radix-cached prefix.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import jsonschema
import pytest
from conftest import TINY_MODELS, hf_greedy_cached, require_model

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.structured import StructuredParams
from minisgl.utils import div_ceil

OPTIONS: dict[str, list[Any]] = {
    "admission": ["conservative", "optimistic"],
    "mixed_batches": [False, True],
    "speculative_tokens": [0, 2],
    "structured": [False, True],  # not an engine option: the requests' parameters
    "cache_type": ["radix", "naive"],
    "enable_overlap": [False, True],
    "page_size": [1, 4],
    "attention_backend": ["torch", "triton"],  # triton in Triton's interpreter on a CPU
}
MODEL = TINY_MODELS["qwen3"]
# Six prompts of 7 to 21 ids that repeat themselves, so prompt lookup finds drafts.
PROMPTS = [[11 + i, 37, 5 + i, 99, 41, 23, 7 + i] * (1 + i % 3) for i in range(6)]
PLAIN_TOKENS = 10
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "count"],
    "additionalProperties": False,
}
SCHEMA_TOKENS = 40  # an object of this schema takes far fewer tokens


Cell = dict[str, Any]


def all_cells() -> list[Cell]:
    return [dict(zip(OPTIONS, values)) for values in itertools.product(*OPTIONS.values())]


def cost(cell: Cell) -> int:
    """A cell's time, roughly: Triton's interpreter takes about seventy times the torch
    backend's (8 s against 0.1 s for a plain cell on two cores), and constrained requests (up to
    40 tokens) about three times plain ones (10 tokens)."""
    return (70 if cell["attention_backend"] == "triton" else 1) * (3 if cell["structured"] else 1)


def pairwise_cells() -> list[Cell]:
    """Cells in which every pair of values of two options occurs: greedily, the cell of the
    whole product that covers most pairs not yet covered, the cheapest of those, until none
    is left (the same cells on every run)."""

    def pairs(cell: Cell) -> set[tuple[tuple[str, Any], tuple[str, Any]]]:
        return set(itertools.combinations(sorted(cell.items(), key=str), 2))

    uncovered = set().union(*(pairs(cell) for cell in all_cells()))
    chosen = []
    while uncovered:
        best = max(all_cells(), key=lambda cell: (len(pairs(cell) & uncovered), -cost(cell)))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def cell_id(cell: Cell) -> str:
    return "-".join(
        f"{name}={value}" for name, value in cell.items() if value not in (False, 0, None)
    )


def preemptions(llm: LLM) -> int:
    """Preemptions so far: chapter 23's preemptor sits in a layer of the scheduler's step
    policy, under chapter 24's speculative layer when that wraps it."""
    policy: Any = llm.scheduler.policy
    while not hasattr(policy, "preemptor"):
        if not hasattr(policy, "inner"):
            return 0  # the scheduler itself: neither mixed batches nor optimistic admission
        policy = policy.inner
    return policy.preemptor.preemptions if policy.preemptor is not None else 0


def run_cell(cell: Cell) -> None:
    options = {name: value for name, value in cell.items() if name != "structured"}
    structured = cell["structured"]
    max_tokens = SCHEMA_TOKENS if structured else PLAIN_TOKENS
    page = options["page_size"]
    worst = sum(div_ceil(len(p) + max_tokens, page) + 1 for p in PROMPTS)  # pages
    largest = max(div_ceil(len(p) + max_tokens, page) + 1 for p in PROMPTS)
    with LLM(
        str(require_model(MODEL)),
        device="cpu",
        show_progress=False,
        num_pages=max(largest, worst // 4),
        max_running_req=len(PROMPTS),
        max_extend_tokens=32,  # a batch's prompts are cut into chunks of 32 tokens
        **options,
    ) as llm:
        params = [
            StructuredParams(max_tokens=SCHEMA_TOKENS, json_schema=json.dumps(SCHEMA))
            if structured
            else SamplingParams(max_tokens=PLAIN_TOKENS, ignore_eos=True)
            for _ in PROMPTS
        ]
        outputs = llm.generate(PROMPTS, params)
        assert not llm.scheduler.has_work
        llm.scheduler.cache_manager.check_integrity()
        preempted = preemptions(llm)
    for prompt, out in zip(PROMPTS, outputs):
        if structured:
            jsonschema.validate(json.loads(out["text"]), SCHEMA)
            assert out["finish_reason"] == "stop", out
        else:
            assert out["token_ids"] == hf_greedy_cached(MODEL, prompt, PLAIN_TOKENS), prompt
    if options["admission"] == "optimistic":
        assert preempted >= 1, "the pool should be tight enough to preempt"


def run_cells(cells: list[Cell]) -> None:
    """Every cell, then one failure that lists each failing cell."""
    failed = []
    for cell in cells:
        try:
            run_cell(cell)
        except Exception as error:  # noqa: BLE001 - collect every failing cell, then report
            failed.append(f"{cell_id(cell)}: {type(error).__name__}: {str(error)[:200]}")
    assert not failed, "\n".join(failed)


def skip_without_interpreter(cell: Cell) -> Any:
    """A cell's parameter: skipped where its Triton kernels could not run on the CPU."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it without a GPU
    skip = cell["attention_backend"] == "triton" and not interpreted
    marks = [pytest.mark.skip("Triton runs on the CPU only in its interpreter")] if skip else []
    return pytest.param(cell, id=cell_id(cell), marks=marks)


@pytest.mark.parametrize("cell", [skip_without_interpreter(cell) for cell in pairwise_cells()])
def test_a_pairwise_cell_generates_right(cell: Cell) -> None:
    run_cell(cell)


@pytest.mark.slow
def test_every_cell_with_the_torch_backend_generates_right() -> None:
    run_cells([cell for cell in all_cells() if cell["attention_backend"] == "torch"])


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton runs on the CPU only interpreted"
)
def test_the_triton_kernels_on_every_path_to_attention_generate_right() -> None:
    paths = {"page_size", "mixed_batches", "speculative_tokens"}
    hardest = {"admission": "optimistic", "cache_type": "radix", "attention_backend": "triton"}
    cells = [
        cell
        for cell in all_cells()
        if all(cell[name] == value for name, value in hardest.items())
        and all(
            cell[name] == OPTIONS[name][0] for name in OPTIONS if name not in paths | set(hardest)
        )
    ]
    assert len(cells) == 8
    run_cells(cells)


def test_the_pairwise_cells_meet_every_pair_of_values() -> None:
    cells = pairwise_cells()
    for (a, values_a), (b, values_b) in itertools.combinations(OPTIONS.items(), 2):
        for pair in itertools.product(values_a, values_b):
            assert any((cell[a], cell[b]) == pair for cell in cells), (a, b, pair)
    assert len(cells) < len(all_cells()) / 10
