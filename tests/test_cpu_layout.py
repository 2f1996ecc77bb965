"""The CPU's weight layout (chapter 21's engine extension, engine/cpu_layout.py): given code, not
a stub, so its test lives outside the chapter's tests, which must all fail on the skeleton."""

from __future__ import annotations

import pytest
import torch
from conftest import SMOLLM2, TINY_MODELS, encode, hf_greedy_cached, require_model

from minisgl.benchmark import Workload
from minisgl.benchmark.offline import greedy_params
from minisgl.engine.cpu_layout import PROJECTIONS
from minisgl.layers import Linear
from minisgl.llm import LLM

MODEL = TINY_MODELS["qwen3"]


def test_a_cpu_engine_stores_its_projections_column_major_unless_told_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CPU every qkv, o, gate_up and down projection is the checkpoint's matrix laid out
    column-major (W^T contiguous); MINISGL_CPU_LAYOUT=row keeps chapter 3's row-major layout;
    the embedding (and the LM head tied to it) keeps its rows; both engines agree on tokens."""

    def projections(llm: LLM) -> dict[str, torch.Tensor]:
        model = llm.scheduler.engine.model
        found = {
            name: module.weight
            for name, module in model.named_modules()
            if isinstance(module, Linear) and name.rsplit(".", 1)[-1] in PROJECTIONS
        }
        assert len(found) == 4 * llm.scheduler.engine.model_config.num_layers
        assert model.model.embed_tokens.weight.is_contiguous()
        return found

    prompts = [[1, 15, 27, 300, 4, 99, 7], [1, 8, 8, 8, 2000]]
    params = greedy_params(Workload(prompts, [6, 6]))
    model = str(require_model(MODEL))
    with LLM(model, show_progress=False) as llm:
        column_major = {n: w.detach().clone() for n, w in projections(llm).items()}
        assert all(w.t().is_contiguous() for w in projections(llm).values())
        tokens = [o["token_ids"] for o in llm.generate(prompts, params)]
    monkeypatch.setenv("MINISGL_CPU_LAYOUT", "row")
    with LLM(model, show_progress=False) as llm:
        row_major = projections(llm)
        assert all(w.is_contiguous() for w in row_major.values())
        assert all(torch.equal(w, column_major[n]) for n, w in row_major.items())
        assert [o["token_ids"] for o in llm.generate(prompts, params)] == tokens


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land"]


@pytest.mark.parametrize(
    "path",
    [
        TINY_MODELS["qwen3"],
        TINY_MODELS["llama"],
        pytest.param(SMOLLM2, marks=pytest.mark.slow),  # ~20 s: 32 steps, both sides
    ],
    ids=lambda p: p.name,
)
def test_the_column_major_engine_decodes_transformers_greedy_tokens(path) -> None:  # noqa: ANN001
    """The layout changes the order of MKL's sums, not the tokens: the engine as built on a CPU
    (column-major) decodes what transformers' generate decodes, 32 tokens of several prompts
    batched together."""
    model = require_model(path)
    ids = encode(model, PROMPTS)
    with LLM(str(model), show_progress=False) as llm:
        assert llm.scheduler.engine.model.model.layers[0].mlp.down_proj.weight.t().is_contiguous()
        outputs = llm.generate(ids, greedy_params(Workload(ids, [32] * len(ids))))
    assert [o["token_ids"] for o in outputs] == [hf_greedy_cached(model, p, 32) for p in ids]
