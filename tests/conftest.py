"""Shared fixtures: where the course models live, and loaders cached per test session.

Chapter tests import `minisgl` from whatever tree is first on sys.path (the reference
`solutions/`, a snapshot under build/steps/, or a student's work/ tree).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

# Without a GPU, Triton's kernels run only in its interpreter, which must be chosen before
# triton is first imported (torch or transformers may import it while test files are collected;
# a test file that sets the variable itself comes too late then).
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock
from hypothesis import Phase, settings
from course.tiny_models import DENSE_TINY_MODELS

ROOT = Path(__file__).resolve().parent.parent

# Property-based chapter tests: the same examples on every run (a student's failure reproduces
# on the rerun line the judge prints), no example database left behind, no deadline (a shared
# machine's slow example is no failure), and no shrinking: the first failing example is reported
# at once, where shrinking a kernel's failure could outlast the judge's 30 s per test. A test
# sets its own, small, max_examples.
settings.register_profile(
    "course",
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
)
settings.load_profile("course")
# In a worker of pytest-xdist (CI runs two), torch takes the worker's share of the cores, and so
# do the processes a test starts: two workers of as many threads as there are cores would run
# twice as many threads as cores, and OpenMP's threads spin while they wait for each other.
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(workers))
    torch.set_num_threads(_share)
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
# The tools these tests start (steps.py check, mutate, grade; judge.py check) make a few runs
# each, on toy courses: a warm server would import torch and transformers (about 4 s) to save
# less than that, so their runs start cold here. tests/test_warm_runs.py tests warm runs, and
# CI's own `steps.py check` and `judge.py check` make theirs warm.
os.environ.setdefault("MINISGL_COLD_RUNS", "1")
MODELS = ROOT / "models"
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct"
# tools/provision.py's dense tiny checkpoints, by their short name ("qwen3" for tiny-qwen3).
TINY_MODELS = {name.removeprefix("tiny-"): MODELS / name for name in DENSE_TINY_MODELS}

# Examples are importable by tests (e.g. the stage 1 milestone's hand-batched loop).
sys.path.insert(0, str(ROOT / "examples"))


def require_model(path: Path) -> Path:
    if not (path / "config.json").is_file():
        pytest.fail(
            f"model {path.name} is not provisioned: run `.venv/bin/python tools/provision.py`",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return require_model(SMOLLM2)


@pytest.fixture(scope="session", params=sorted(TINY_MODELS))
def tiny_model_dir(request: pytest.FixtureRequest) -> Path:
    """Each tiny random checkpoint in turn (Llama with Llama-3 RoPE, Qwen2, Qwen3)."""
    return require_model(TINY_MODELS[request.param])


@lru_cache(maxsize=4)
def load_hf_model(path: Path) -> torch.nn.Module:
    """The transformers reference model in float32, loaded once per test session."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@lru_cache(maxsize=4)
def load_tokenizer(path: Path):  # noqa: ANN201 - a transformers tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def hf_greedy_with_margin(
    path: Path, prompt_ids: list[int], max_new_tokens: int
) -> tuple[list[int], float]:
    """What transformers generates greedily for one prompt, ignoring EOS, and the smallest gap
    between the two largest logits over its steps (how far the greedy choice was from a tie)."""
    model = load_hf_model(path)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    gaps = [(top[0, 0] - top[0, 1]).item() for top in (s.topk(2).values for s in out.logits)]
    return out.sequences[0, len(prompt_ids) :].tolist(), min(gaps)


# --- transformers' greedy tokens on SmolLM2, committed --------------------------------------
# Running transformers' generate on SmolLM2 takes seconds of a test's time limit, and its answer
# never changes: its greedy tokens are committed in GREEDY_FILE, with each prompt's smallest
# top-two logit gap. A prompt whose gap is under MIN_GREEDY_MARGIN is refused: float32 noise
# (~1e-5 in a logit on another CPU) could flip its greedy token there. A test that asks for a
# prompt not in the file fails and says how to record it; tests/test_transformers_greedy.py
# checks every committed entry against transformers itself.
GREEDY_FILE = ROOT / "tests" / "transformers_greedy.json"
COMMITTED_GREEDY_MODELS = {SMOLLM2.name}  # the tiny checkpoints are fast enough to run live
RECORD_GREEDY_ENV = "MINISGL_RECORD_GREEDY"  # =1: run transformers for what is missing and add it
MIN_GREEDY_MARGIN = 1e-3


@lru_cache(maxsize=1)
def committed_greedy() -> dict[tuple[str, tuple[int, ...]], dict[str, Any]]:
    entries = json.loads(GREEDY_FILE.read_text())["entries"] if GREEDY_FILE.is_file() else []
    return {(e["model"], tuple(e["prompt"])): e for e in entries}


def hf_greedy(path: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """What transformers generates greedily for one prompt, ignoring EOS (from GREEDY_FILE for
    SmolLM2). Greedy decoding is prefix-stable: the first k tokens of a longer continuation are
    the k-token continuation, so one entry serves every shorter request."""
    path = Path(path)
    if path.name not in COMMITTED_GREEDY_MODELS:
        return hf_greedy_with_margin(path, prompt_ids, max_new_tokens)[0]
    key = (path.name, tuple(prompt_ids))
    entry = committed_greedy().get(key)
    if entry is None or len(entry["tokens"]) < max_new_tokens:
        if os.environ.get(RECORD_GREEDY_ENV) != "1":
            pytest.fail(
                f"transformers' {max_new_tokens} greedy tokens on {path.name} for the prompt "
                f"{list(prompt_ids)[:8]}... are not in {GREEDY_FILE.relative_to(ROOT)}: record "
                f"them with {RECORD_GREEDY_ENV}=1 .venv/bin/python -m pytest <this test>",
                pytrace=False,
            )
        tokens, margin = hf_greedy_with_margin(path, prompt_ids, max_new_tokens)
        assert margin >= MIN_GREEDY_MARGIN, (
            f"transformers' greedy choice on this prompt is {margin:.1e} from a tie: another "
            "CPU could pick the other token; choose another prompt"
        )
        entry = committed_greedy()[key] = {
            "model": path.name,
            "prompt": list(prompt_ids),
            "tokens": tokens,
            "margin": round(margin, 4),
        }
        write_committed_greedy()
    return entry["tokens"][:max_new_tokens]


def write_committed_greedy() -> None:
    import transformers

    entries = sorted(committed_greedy().values(), key=lambda e: (e["model"], e["prompt"]))
    lines = ",\n".join(f"  {json.dumps(entry)}" for entry in entries)  # an entry a line
    version = json.dumps(transformers.__version__)
    GREEDY_FILE.write_text(f'{{"transformers": {version}, "entries": [\n{lines}\n]}}\n')


_HF_GREEDY_CACHE: dict[tuple[Path, tuple[int, ...]], list[int]] = {}


def hf_greedy_cached(path: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """hf_greedy, remembered for the whole session (the stage 2 tests ask for the same prompts
    again and again). Greedy decoding is prefix-stable: the first k tokens of a longer
    continuation are the k-token continuation, so one generate serves every shorter request."""
    key = (Path(path), tuple(prompt_ids))
    known = _HF_GREEDY_CACHE.get(key, [])
    if len(known) < max_new_tokens:
        known = _HF_GREEDY_CACHE[key] = hf_greedy(Path(path), list(prompt_ids), max_new_tokens)
    return known[:max_new_tokens]


def _check_minisgl_tree() -> None:
    """Under `tools/steps.py`, MINISGL_TREE names the snapshot being judged: the tests must
    import its minisgl, never another one (such as the pip-installed reference)."""
    tree = os.environ.get("MINISGL_TREE")
    if not tree:
        return
    import minisgl

    where = Path(minisgl.__file__ or next(iter(minisgl.__path__))).resolve()
    if not where.is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"MINISGL_TREE is {tree} but the tests imported minisgl from {where}")


_check_minisgl_tree()


# --- helpers of the stage 2 tests (chapters 7-11) --------------------------------------------
# minisgl is imported inside each helper: snapshots of earlier chapters have no scheduler.

SCHEDULER_MAX_STEPS = 500  # a scheduler that has not finished by then is stuck


def encode(model_dir: Path, prompts: list[str]) -> list[list[int]]:
    tokenizer = load_tokenizer(Path(model_dir))
    return [tokenizer.encode(p) for p in prompts]


def shared_prefix_prompts(seed: int) -> list[list[int]]:
    """Nine random prompts of token ids; every third starts with the same 20-token prefix, so
    the radix cache has something to share."""
    rng = random.Random(seed)
    shared = [rng.randrange(10, 5000) for _ in range(20)]
    return [
        (shared if i % 3 == 0 else [])
        + [rng.randrange(10, 5000) for _ in range(rng.randint(3, 60))]
        for i in range(9)
    ]


def greedy(max_tokens: int):  # noqa: ANN201 - a minisgl SamplingParams
    """Greedy sampling that ignores EOS, so every request runs to max_tokens."""
    from minisgl.core import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def run_until_idle(scheduler, max_steps: int = SCHEDULER_MAX_STEPS) -> list[list]:  # noqa: ANN001
    """Step a Scheduler until it is idle; each step's TokenOutputs. Integrity is checked."""
    steps: list[list] = []
    while scheduler.has_work:
        assert len(steps) < max_steps, "the scheduler never finished (a request is stuck)"
        steps.append(scheduler.step())
    scheduler.cache_manager.check_integrity()
    return steps


def random_prompts(
    seed: int, count: int, longest: int = 40, shortest: int = 3, ids_below: int = 400
) -> list[list[int]]:
    """`count` prompts of `shortest` to `longest` random ids in [10, ids_below), the same for
    the same arguments."""
    rng = random.Random(seed)
    return [
        [rng.randrange(10, ids_below) for _ in range(rng.randint(shortest, longest))]
        for _ in range(count)
    ]


def run_prompts(scheduler, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:  # noqa: ANN001
    """Queue every prompt (greedy), step until idle (the integrity check passes): the tokens
    each prompt got, in order."""
    uids = [scheduler.add_request(p, greedy(m)) for p, m in zip(prompts, max_tokens)]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    for outputs in run_until_idle(scheduler):
        for out in outputs:
            tokens[out.uid].append(out.token)
    return [tokens[uid] for uid in uids]


def guard_steps(scheduler, max_steps: int = SCHEDULER_MAX_STEPS):  # noqa: ANN001, ANN201
    """Make `scheduler.step` fail fast, with a clear message, once it has run `max_steps` steps
    without becoming idle: a stuck request (a leaked table row, a request that can never be
    admitted) then fails its test at once instead of spinning inside LLM.generate until the
    test file's timeout. Returns the scheduler."""
    step = scheduler.step
    busy_steps = 0

    def guarded_step() -> list:
        nonlocal busy_steps
        busy_steps += 1
        assert busy_steps <= max_steps, (
            f"the scheduler ran {max_steps} steps without becoming idle: a request is stuck "
            f"({len(scheduler.prefill_manager.pending_list)} waiting, "
            f"{len(scheduler.decode_manager.running_reqs)} running, "
            f"{scheduler.table_manager.available_size} free table rows; a leaked row or page?)"
        )
        outputs = step()
        if not scheduler.has_work:
            busy_steps = 0
        return outputs

    scheduler.step = guarded_step
    return scheduler


def guarded_llm(model_dir: Path, **config):  # noqa: ANN003, ANN201 - a minisgl LLM
    """An LLM whose scheduler has a step guard (`guard_steps`)."""
    from minisgl.llm import LLM

    llm = LLM(str(model_dir), **config)
    guard_steps(llm.scheduler)
    return llm


def engine_config(
    cache_type: str = "naive", enable_overlap: bool = False, pool_tokens: int = 2048
) -> Callable[..., dict[str, Any]]:
    """A test module's `config(page_size=1, **overrides)`: the LLM / SchedulerConfig keyword
    arguments its engines run with (on the CPU, 8 table rows, `pool_tokens` KV slots whatever
    the page size), each override replacing one of them."""

    def config(page_size: int = 1, **overrides: Any) -> dict[str, Any]:
        return {
            "cache_type": cache_type,
            "enable_overlap": enable_overlap,
            "device": "cpu",
            "show_progress": False,
            "page_size": page_size,
            "num_pages": pool_tokens // page_size,
            "max_running_req": 8,
        } | overrides

    return config


def generate(llm, prompts: list, params) -> list[dict]:  # noqa: ANN001 - a minisgl LLM
    """LLM.generate, after which the scheduler must be idle and no page leaked."""
    outputs = llm.generate(prompts, params)
    assert not llm.scheduler.has_work, "generate returned with requests still in the scheduler"
    llm.scheduler.cache_manager.check_integrity()
    return outputs


def llm_fixture(config):  # noqa: ANN001, ANN201 - config(**overrides) -> LLM kwargs
    """A module-scoped fixture `llms(model_dir, **overrides) -> LLM` that builds each distinct
    LLM (with a step guard) once per test module, with the module's own `config` defaults."""

    @pytest.fixture(scope="module")
    def llms():  # noqa: ANN202
        cache: dict[tuple, object] = {}

        def get(model_dir: Path, **overrides):  # noqa: ANN003, ANN202 - a minisgl LLM
            key = (model_dir, tuple(sorted(overrides.items())))
            if key not in cache:
                cache[key] = guarded_llm(model_dir, **config(**overrides))
            return cache[key]

        return get

    return llms


def build_site(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the course at `root` into `out` (drafts never allowed)."""
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_DOCS_DRAFT"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-q"]
    command += ["-f", str(root / "mkdocs.yml"), "-d", str(out)]
    return subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=300)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The course's site, built once per test run (the site and browser tests share it): under
    xdist the first worker that needs it builds it, under a lock, in the folder the workers'
    temporary folders share, and the others read it there."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, built = shared / "site", shared / "site.built"
    with FileLock(shared / "site.lock"):
        if not built.exists():
            result = build_site(ROOT, out)
            assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-3000:]}"
            built.touch()
    return out


# --- traces: a scheduler's run in events, the student's against the reference's ---------------


def record_forwards(scheduler) -> list[str]:  # noqa: ANN001 - a minisgl Scheduler
    """Events of every batch the scheduler's engine runs from now on: the phase, each request
    with its three lengths and table row, and the batch's input ids, positions and KV slots.
    (Test instrumentation: the engine's forward_batch is wrapped on this one object.)"""
    events: list[str] = []
    forward = scheduler.engine.forward_batch

    def recorded(batch, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        reqs = ", ".join(
            f"{r.uid} (cached {r.cached_len}, device {r.device_len}, max {r.max_device_len}, "
            f"row {r.table_idx})"
            for r in batch.reqs
        )
        events.append(f"{batch.phase} batch: {reqs}")
        for name in ("input_ids", "positions", "out_loc"):
            events.append(f"  its {name}: {getattr(batch, name).tolist()}")
        return forward(batch, *args, **kwargs)

    scheduler.engine.forward_batch = recorded
    return events


def raise_if_a_later_chapters_stub(error: Exception) -> None:
    """A trace that reached a later chapter's stub ("written in chapter N") would end alike on
    both sides: the workload, not the code under test, is wrong, so the test fails as such."""
    if "written in chapter" in str(error):
        raise error


def scheduler_trace(scheduler, requests: list[tuple[list[int], object]]) -> list[str]:  # noqa: ANN001
    """Queue `requests` (prompt ids, SamplingParams) and step until idle, recording in words
    what happens: each batch run (`record_forwards`), each token out, who runs and who waits
    after each step, the free pages, and the integrity check at the end. An exception ends the
    trace with its name."""
    forwards = record_forwards(scheduler)
    events: list[str] = []
    try:
        for ids, params in requests:
            uid = scheduler.add_request(ids, params)
            events.append(f"queued request {uid}: {len(ids)} prompt tokens, {params}")
        step = 0
        while scheduler.has_work:
            step += 1
            if step > SCHEDULER_MAX_STEPS:
                events.append(f"still busy after {SCHEDULER_MAX_STEPS} steps (a request is stuck)")
                break
            outputs = scheduler.step()
            events += [f"step {step}: ran a {event}" for event in forwards]
            forwards.clear()
            for out in outputs:
                reason = f", finished ({out.finish_reason})" if out.finish_reason else ""
                events.append(f"step {step}: request {out.uid} got token {out.token}{reason}")
            running = [
                f"{r.uid} (cached {r.cached_len}, device {r.device_len})"
                for r in scheduler.decode_manager.running_reqs.values()
            ]
            waiting = [p.uid for p in scheduler.prefill_manager.pending_list]
            events.append(f"step {step}: running {running}; waiting {waiting}")
            cm = scheduler.cache_manager
            events.append(f"step {step}: {cm.num_free_pages} of {cm.num_pages} pages free")
        scheduler.cache_manager.check_integrity()
        events.append("idle; no page leaked")
    except Exception as error:  # noqa: BLE001 - the trace ends with what went wrong
        raise_if_a_later_chapters_stub(error)
        events += forwards
        events.append(f"raised {type(error).__name__}: {error}")
    return events


def assert_same_trace(chapter: int, run: Callable[[], list[str]], what: str) -> None:
    """Run `run()` (a trace) on the student's code, then with chapter `chapter`'s reference
    stubs in place; fail at the first event where they part."""
    from course.differential import first_difference, use_reference_stubs

    yours = run()
    with use_reference_stubs(chapter):
        reference = run()
    difference = first_difference(yours, reference)
    assert difference is None, (
        f"{what}: your chapter {chapter} code and the reference part at {difference}"
    )
