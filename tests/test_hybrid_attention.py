"""Chapter 22's hybrid backend on the CPU: FlashInfer's stand-in (tests/test_ch17_gpu_attention.py)
for prefills and large decodes, the Triton kernels in Triton's interpreter for small decodes.
Each batch goes where its kind and size say, and the tokens are the torch backend's."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import greedy, guarded_llm, require_model
from test_ch17_gpu_attention import (
    MODEL,
    FakeFlashInfer,
    hand_batch,
    hand_engine,
    prompts,
    use_fake_flashinfer,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton runs on the CPU only interpreted"
)


def test_each_batch_is_prepared_and_run_by_the_backend_of_its_kind_and_size(monkeypatch):
    from minisgl.attention.fi import FlashInferMetadata
    from minisgl.attention.triton import TritonAttnMetadata

    monkeypatch.setenv("MINISGL_TRITON_DECODE_ROWS", "2")
    fake = FakeFlashInfer()
    engine = hand_engine(monkeypatch, fake, "hybrid", page_size=4)
    expected = {
        ("prefill", 1): FlashInferMetadata,
        ("decode", 1): TritonAttnMetadata,
        ("decode", 2): TritonAttnMetadata,
        ("decode", 3): FlashInferMetadata,
    }
    for (phase, rows), metadata in expected.items():
        seq_lens = [9, 14, 6][:rows]
        cached = [n - 1 for n in seq_lens] if phase == "decode" else [0] * rows
        batch = hand_batch(engine, seq_lens, cached, phase)
        runs_before = len(fake.log)
        engine.prepare_batch(batch)
        assert isinstance(batch.attn_metadata, metadata), (phase, rows)
        with torch.inference_mode():
            engine.run_model(batch)
        on_flashinfer = [entry for entry in fake.log[runs_before:] if entry[1] == "run"]
        layers = engine.model_config.num_layers
        assert len(on_flashinfer) == (layers if metadata is FlashInferMetadata else 0)


def test_greedy_tokens_equal_the_torch_backend_as_the_batch_shrinks(monkeypatch):
    """Seven requests of different lengths, four at a time: decodes of 3-4 rows on FlashInfer's
    stand-in, of 1-2 on Triton, and the torch backend's tokens."""
    from minisgl.kernels import paged_attention

    monkeypatch.setenv("MINISGL_TRITON_DECODE_ROWS", "2")
    fake = FakeFlashInfer()
    use_fake_flashinfer(monkeypatch, fake)
    triton_decodes = []
    decode = paged_attention.decode_attention
    monkeypatch.setattr(
        paged_attention,
        "decode_attention",
        lambda q, *args: triton_decodes.append(q.shape[0]) or decode(q, *args),
    )
    batch = prompts(7, seed=5)
    params = [greedy(4 + 3 * i) for i in range(len(batch))]
    tokens = {}
    for backend in ("torch", "hybrid"):
        llm = guarded_llm(
            require_model(MODEL),
            device="cpu",
            attention_backend=backend,
            page_size=4,
            num_pages=512,
            max_running_req=4,
            show_progress=False,
        )
        with llm:
            tokens[backend] = [out["token_ids"] for out in llm.generate(batch, params)]
    assert tokens["hybrid"] == tokens["torch"]
    assert ("decode", "run") in fake.log and ("prefill", "run") in fake.log
    assert triton_decodes and set(triton_decodes) <= {1, 2}


def test_the_threshold_comes_from_the_environment_and_a_bad_one_is_named(monkeypatch):
    from minisgl.attention.hybrid import TRITON_MAX_ROWS

    fake = FakeFlashInfer()
    for value, rows in (("", TRITON_MAX_ROWS), ("0", 0), ("64", 64)):
        monkeypatch.setenv("MINISGL_TRITON_DECODE_ROWS", value)
        assert (
            hand_engine(monkeypatch, fake, "hybrid", page_size=4).attn_backend.triton_max_rows
            == rows
        )
    monkeypatch.setenv("MINISGL_TRITON_DECODE_ROWS", "sixteen")
    with pytest.raises(ValueError, match="MINISGL_TRITON_DECODE_ROWS must be a number"):
        hand_engine(monkeypatch, fake, "hybrid", page_size=4)
