"""Chapter 21 tests: the benchmark package. A seeded workload is reproducible, within its bounds
and the one the committed H200 results were measured on; latencies and percentiles come out of
synthetic stream timestamps as the trace was built; a stream without text counts its tokens
and is no error; the timing and the token accounting count only what they should; an offline
run on tiny-qwen3 does the same work in the engine and in transformers; four concurrent
streaming clients against a live server get sane figures."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TINY_MODELS, require_model
from course.differential import (
    EXACT,
    Tolerance,
    assert_same_call,
    call_differences,
    describe,
    reference_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from server_fixture import LiveServer, start_server

from minisgl.benchmark import (
    WORKLOADS,
    OfflineResult,
    RequestResult,
    WorkloadSpec,
    make_workload,
    percentile,
    read_results_dir,
    run_engine,
    run_load,
    run_transformers,
    speedups,
    summarize,
)
from minisgl.benchmark import offline
from minisgl.benchmark.offline import requested_tokens, timed

MODEL = TINY_MODELS["qwen3"]
RESULTS = ROOT / "benchmark" / "results"


def reference_percentile(values: list[float], q: int) -> float:
    """The standard library's linear interpolation between ranks (q in 1..99)."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# --- the seeded workload --------------------------------------------------------------------


def test_a_workload_is_reproducible_and_each_seed_gives_its_own() -> None:
    spec = WorkloadSpec(16, (4, 40), (2, 30))
    first, again, other = make_workload(spec, 5), make_workload(spec, 5), make_workload(spec, 6)
    assert (first.prompts, first.output_lens) == (again.prompts, again.output_lens)
    assert (first.prompts, first.output_lens) != (other.prompts, other.output_lens)
    random.seed(123)  # the global generator neither matters nor is touched
    state = random.getstate()
    assert make_workload(spec, 5).prompts == first.prompts
    assert random.getstate() == state, "make_workload changed the global generator"


def test_lengths_and_ids_stay_within_their_bounds_both_ends_included() -> None:
    spec = WorkloadSpec(300, (1, 3), (5, 7), token_ids=(10, 12))
    work = make_workload(spec, 0)
    assert len(work.prompts) == len(work.output_lens) == spec.num_requests
    assert {len(p) for p in work.prompts} == set(range(1, 4))
    assert set(work.output_lens) == set(range(5, 8))
    assert {i for p in work.prompts for i in p} == set(range(10, 13))


def test_the_official_workload_is_the_one_the_committed_results_measured() -> None:
    """The draw order (each prompt's length then its ids, then every output length) decides
    which tokens the official workload has: the H200 results record their counts."""
    recorded = {
        (r["input_tokens"], r["output_tokens"])
        for r in read_results_dir(RESULTS, benchmark="offline", workload="official")
    }
    assert recorded, "no official results under benchmark/results/"
    work = make_workload(WORKLOADS["official"], 0)
    assert {(work.input_tokens, work.output_tokens)} == recorded


def documented_draw(spec: WorkloadSpec, seed: int) -> tuple[list[list[int]], list[int]]:
    """The draw order make_workload's docstring spells out, step by step."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(spec.num_requests):
        length = rng.randint(*spec.input_lens)
        prompts.append([rng.randint(*spec.token_ids) for _ in range(length)])
    return prompts, [rng.randint(*spec.output_lens) for _ in range(spec.num_requests)]


def bounds(low: int, span: int) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(st.integers(low, low + 50), st.integers(0, span)).map(
        lambda pair: (pair[0], pair[0] + pair[1])
    )


@settings(max_examples=40)
@given(
    num_requests=st.integers(0, 12),
    input_lens=bounds(1, 20),
    output_lens=bounds(1, 300),
    token_ids=bounds(0, 10_000),
    seed=st.integers(0, 2**32),
)
def test_any_workload_is_drawn_in_the_documented_order(
    num_requests: int,
    input_lens: tuple[int, int],
    output_lens: tuple[int, int],
    token_ids: tuple[int, int],
    seed: int,
) -> None:
    spec = WorkloadSpec(num_requests, input_lens, output_lens, token_ids)
    work = make_workload(spec, seed)
    prompts, lens = documented_draw(spec, seed)
    assert [len(p) for p in work.prompts] == [len(p) for p in prompts], (
        "prompt lengths differ from the documented draw (each prompt's length, then its ids)"
    )
    assert work.prompts == prompts, "token ids differ from the documented draw"
    assert work.output_lens == lens, "output lengths differ: drawn after all the prompts?"
    assert all(type(i) is int for p in work.prompts for i in p), "ids must be Python ints"


# --- latency metrics from stream timestamps -------------------------------------------------


def synthetic_stream(
    rng: random.Random, pieces: int, tokens_per_piece: int = 1, text: bool = True
) -> dict:
    """A stream built from its parts: when it was sent, its TTFT, its gaps and its tail
    (`text=False`: its tokens decoded to no text, as ids beyond the tokenizer's do)."""
    sent = rng.uniform(0, 10)
    ttft = rng.uniform(0.05, 0.5)
    gaps = [rng.uniform(0.001, 0.05) for _ in range(pieces - 1)]
    tail = rng.uniform(0.001, 0.01)  # the [DONE] after the last piece
    times = [sent + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    result = RequestResult(
        ok=True,
        sent_s=sent,
        piece_s=times,
        done_s=times[-1] + tail,
        output_tokens=pieces * tokens_per_piece,
        text_chars=3 * pieces if text else 0,
    )
    return {"result": result, "ttft": ttft, "gaps": gaps, "latency": times[-1] + tail - sent}


def test_ttft_itl_and_latency_come_from_the_timestamps() -> None:
    rng = random.Random(0)
    for pieces in (1, 2, 9):
        stream = synthetic_stream(rng, pieces)
        result = stream["result"]
        assert result.ttft_s == pytest.approx(stream["ttft"])
        assert result.itl_s == pytest.approx(stream["gaps"])
        assert len(result.itl_s) == pieces - 1
        assert result.latency_s == pytest.approx(stream["latency"])


def test_percentile_interpolates_linearly_between_ranks() -> None:
    rng = random.Random(1)
    for n in (2, 3, 10, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (1, 25, 50, 90, 99):
            assert percentile(values, q) == pytest.approx(reference_percentile(values, q)), (n, q)
        assert percentile(values, 0) == min(values) and percentile(values, 100) == max(values)
    assert percentile([4.0], 99) == 4.0
    assert math.isnan(percentile([], 50))


def test_summarize_pools_the_gaps_and_counts_only_successful_requests() -> None:
    rng = random.Random(2)
    streams = [synthetic_stream(rng, pieces, 2) for pieces in (1, 3, 6, 12)]
    failed = RequestResult(ok=False, error="HTTP 500", sent_s=0.0, piece_s=[9.0], done_s=99.0)
    failed.output_tokens = 1000
    seconds = 7.5
    summary = summarize([s["result"] for s in streams] + [failed], seconds)

    tokens = sum(s["result"].output_tokens for s in streams)  # the server's counts, not pieces
    assert summary["requests"] == 5 and summary["errors"] == 1
    assert summary["output_tokens"] == tokens
    assert summary["token_throughput"] == pytest.approx(tokens / seconds)
    assert summary["request_throughput"] == pytest.approx(len(streams) / seconds)
    pooled = {
        "ttft": [s["ttft"] for s in streams],
        "itl": [gap for s in streams for gap in s["gaps"]],
        "latency": [s["latency"] for s in streams],
    }
    for name, values in pooled.items():
        for q in (50, 90, 99):
            expected = reference_percentile(values, q) * 1e3
            assert summary[f"{name}_p{q}_ms"] == pytest.approx(expected), f"{name}_p{q}_ms"


def test_streams_without_text_count_their_tokens_apart_from_the_errors() -> None:
    rng = random.Random(4)
    with_text = [synthetic_stream(rng, pieces) for pieces in (2, 5)]
    silent = synthetic_stream(rng, 4, text=False)  # a chunk per token, every one without text
    # The server sent no chunk for its tokens, only the closing one: no piece, so no TTFT.
    unseen = RequestResult(ok=True, sent_s=1.0, done_s=3.5, output_tokens=9)
    broken = RequestResult(ok=False, error="RemoteProtocolError", sent_s=0.0, done_s=0.0)
    seconds = 4.0
    summary = summarize([s["result"] for s in [*with_text, silent]] + [unseen, broken], seconds)

    assert math.isnan(unseen.ttft_s) and unseen.itl_s == []
    assert summary["requests"] == 5 and summary["errors"] == 1
    assert summary["streams_without_text"] == 2
    tokens = sum(s["result"].output_tokens for s in [*with_text, silent]) + 9
    assert summary["output_tokens"] == tokens
    assert summary["token_throughput"] == pytest.approx(tokens / seconds)
    assert summary["request_throughput"] == pytest.approx(4 / seconds)
    ttfts = [s["ttft"] for s in [*with_text, silent]]
    latencies = [s["latency"] for s in [*with_text, silent]] + [2.5]
    for q in (50, 90, 99):
        assert summary[f"ttft_p{q}_ms"] == pytest.approx(reference_percentile(ttfts, q) * 1e3)
        expected = reference_percentile(latencies, q) * 1e3
        assert summary[f"latency_p{q}_ms"] == pytest.approx(expected)


times = st.floats(0, 1e4, allow_nan=False)


@settings(max_examples=60)
@given(values=st.lists(times, max_size=30), q=st.floats(0, 100))
def test_percentile_is_the_documented_interpolation_and_leaves_its_input_alone(values, q) -> None:
    given_values = list(values)
    got = percentile(values, q)
    assert values == given_values, "percentile reordered the caller's list: sort a copy"
    if not values:
        assert math.isnan(got), "no values have no percentile (nan), not 0"
        return
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low, high = math.floor(k), math.ceil(k)
    expected = ordered[low] + (ordered[high] - ordered[low]) * (k - low)
    assert got == pytest.approx(expected, abs=1e-9), f"rank k = {k:.3f} of {len(values)} values"
    assert ordered[low] <= got + 1e-9 and got <= ordered[high] + 1e-9
    assert percentile(values, 0) == ordered[0] and percentile(values, 100) == ordered[-1]


def test_percentile_weighs_the_two_ranks_by_the_fraction_of_k() -> None:
    # k = 3 * 40 / 100 = 1.2: 20% of the way from rank 1 (10) to rank 2 (20)
    assert percentile([30.0, 0.0, 20.0, 10.0], 40) == pytest.approx(12.0)
    assert percentile([1.0, 3.0], 50) == pytest.approx(2.0)  # even count: the two middle ones


@settings(max_examples=40)
@given(
    sent=times,
    waits=st.lists(st.floats(0, 5, allow_nan=False), max_size=8),
    tail=st.floats(0, 5, allow_nan=False),
)
def test_a_streams_latencies_follow_from_its_timestamps(sent, waits, tail) -> None:
    pieces = list(itertools.accumulate(waits, initial=sent))[1:]
    done = (pieces[-1] if pieces else sent) + tail
    result = RequestResult(ok=True, sent_s=sent, piece_s=pieces, done_s=done)
    if pieces:
        assert result.ttft_s == pytest.approx(waits[0], abs=1e-6), "TTFT: sent_s to first piece"
    else:
        assert math.isnan(result.ttft_s), "a stream without pieces has no TTFT (nan)"
    assert result.itl_s == pytest.approx(waits[1:], abs=1e-6), "ITL: each piece minus the last"
    assert result.latency_s == pytest.approx(done - sent, abs=1e-6), "latency: sent_s to done_s"


SUMMARY_KEYS = {
    "requests",
    "errors",
    "streams_without_text",
    "seconds",
    "output_tokens",
    "request_throughput",
    "token_throughput",
} | {f"{name}_p{q}_ms" for name in ("ttft", "itl", "latency") for q in (50, 90, 99)}


def test_summarize_reports_exactly_the_documented_keys_in_milliseconds() -> None:
    result = RequestResult(
        ok=True, sent_s=1.0, piece_s=[1.25, 1.5, 2.0], done_s=2.5, output_tokens=7, text_chars=4
    )
    summary = summarize([result], 2.0)
    assert set(summary) == SUMMARY_KEYS
    assert summary["seconds"] == 2.0
    assert summary["ttft_p50_ms"] == pytest.approx(250.0), "TTFT 0.25 s is 250 ms"
    assert summary["itl_p99_ms"] == pytest.approx((0.25 + 0.99 * 0.25) * 1e3), "gaps 0.25, 0.5 s"
    assert summary["latency_p90_ms"] == pytest.approx(1500.0)
    assert summary["streams_without_text"] == 0 and summary["errors"] == 0


def test_a_failed_request_is_an_error_whatever_its_message_and_counts_nowhere_else() -> None:
    failed = RequestResult(ok=False, error="", sent_s=0.0, piece_s=[0.5], done_s=0.75)
    failed.output_tokens, failed.text_chars = 50, 0
    good = RequestResult(ok=True, sent_s=0.0, piece_s=[0.1], done_s=0.2, output_tokens=3)
    good.text_chars = 5
    summary = summarize([failed, good], 1.0)
    assert summary["errors"] == 1, "ok=False is an error, with or without a message"
    assert summary["streams_without_text"] == 0, "a broken stream is an error, not a silent one"
    assert summary["output_tokens"] == 3 and summary["request_throughput"] == pytest.approx(1.0)
    assert summary["ttft_p99_ms"] == pytest.approx(100.0), "a failed stream's TTFT counted"


def test_a_run_where_every_request_failed_has_no_latency_and_no_throughput() -> None:
    failed = [RequestResult(ok=False, error="HTTP 503", sent_s=0.0, done_s=1.0) for _ in range(3)]
    summary = summarize(failed, 2.0)
    assert summary["requests"] == 3 and summary["errors"] == 3
    assert summary["output_tokens"] == 0 and summary["token_throughput"] == 0
    assert summary["request_throughput"] == 0
    for key in SUMMARY_KEYS:
        if key.endswith("_ms"):
            assert math.isnan(summary[key]), f"{key}: no latency at all is nan, not a number"


# --- offline accounting ---------------------------------------------------------------------


def test_timed_leaves_the_warmup_out_and_waits_for_the_device() -> None:
    calls: list[str] = []

    def warmup() -> None:
        calls.append("warmup")
        time.sleep(1.0)

    def run() -> str:
        calls.append("run")
        time.sleep(0.05)
        return "value"

    def sync() -> None:  # a device still busy with what was queued: 0.1 s to drain
        calls.append("sync")
        time.sleep(0.1)

    value, seconds = timed(run, warmup, sync)
    assert value == "value"
    assert calls == ["warmup", "sync", "run", "sync"]
    assert 0.15 <= seconds < 0.9, f"{seconds:.3f} s: run plus one sync, without the warm-up"


def test_only_the_requested_tokens_of_a_static_batch_count() -> None:
    rng = random.Random(3)
    lens = [rng.randint(1, 12) for _ in range(6)]
    rows = [[rng.randrange(100) for _ in range(max(lens))] for _ in lens]
    kept = requested_tokens(rows, lens)
    assert [len(k) for k in kept] == lens
    assert all(k == row[: len(k)] for k, row in zip(kept, rows))
    with pytest.raises(ValueError):
        requested_tokens([[1, 2]], [3])


def test_speedups_compare_throughputs_of_the_same_work() -> None:
    work = [[1] * 3, [2] * 5]
    base = OfflineResult("transformers", 4.0, work)
    engine = OfflineResult("minisgl", 0.5, work)
    ratios = speedups([base, engine])
    assert ratios["transformers"] == pytest.approx(1.0)
    assert ratios["minisgl"] == pytest.approx(engine.tokens_per_s / base.tokens_per_s)
    assert speedups([engine]) == {}
    with pytest.raises(ValueError):
        speedups([base, OfflineResult("minisgl", 0.5, [[1] * 3, [2] * 4])])


class FakeClock:
    """time.perf_counter for `timed`, advanced only by what the test's callables do."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def test_timed_counts_exactly_the_run_and_its_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up 100 s, the warm-up's drain 10 s, the run 1 s, its drain 0.5 s: 1.5 s."""
    clock = FakeClock()
    monkeypatch.setattr(offline.time, "perf_counter", clock)
    drains = iter([10.0, 0.5])
    value, seconds = timed(
        lambda: clock.spend(1.0) or "out",
        warmup=lambda: clock.spend(100.0),
        sync=lambda: clock.spend(next(drains)),
    )
    assert value == "out"
    assert seconds == pytest.approx(1.5), (
        f"{seconds} s: the clock must start after warm-up and its sync, and stop after the "
        "sync that follows run"
    )


@settings(max_examples=40)
@given(
    rows=st.lists(
        st.tuples(st.lists(st.integers(0, 99), max_size=10), st.integers(0, 10)), max_size=8
    )
)
def test_requested_tokens_keeps_each_rows_first_output_len_tokens(rows) -> None:
    generated = [tuple(row) for row, _ in rows]  # any sequence of ids, e.g. a tensor row
    lens = [n for _, n in rows]
    short = [i for i, (row, n) in enumerate(rows) if len(row) < n]
    if short:
        with pytest.raises(ValueError):
            requested_tokens(generated, lens)
        return
    kept = requested_tokens(generated, lens)
    assert kept == [list(row[:n]) for row, n in rows], "each row's first output_len tokens"
    assert all(type(k) is list for k in kept), "each request's tokens as a list"


def test_speedups_compare_the_work_request_by_request_not_in_total() -> None:
    base = OfflineResult("transformers", 4.0, [[1] * 3, [2] * 5])
    swapped = OfflineResult("minisgl", 1.0, [[1] * 5, [2] * 3])  # same total, other requests
    with pytest.raises(ValueError):
        speedups([base, swapped])
    fewer = OfflineResult("minisgl", 1.0, [[1] * 3])
    with pytest.raises(ValueError):
        speedups([base, fewer])


def test_speedups_take_any_baseline_anywhere_in_the_results() -> None:
    work = [[1] * 4, [2] * 6]
    fast = OfflineResult("graphs", 0.5, work)
    slow = OfflineResult("eager", 2.0, work)
    other = OfflineResult("transformers", 8.0, work)
    ratios = speedups([fast, other, slow], baseline="eager")
    assert ratios == pytest.approx({"graphs": 4.0, "transformers": 0.25, "eager": 1.0})
    assert list(ratios) == ["graphs", "transformers", "eager"], "one ratio per result, in order"
    assert speedups([fast, other], baseline="eager") == {}


def test_an_offline_run_on_tiny_qwen3_does_the_same_work_in_the_engine_and_transformers() -> None:
    model = require_model(MODEL)
    work = make_workload(WorkloadSpec(6, (8, 40), (4, 20)), 1)
    engine = run_engine(model, work, torch.float32, {}, "minisgl")
    hf = run_transformers(model, work, torch.float32, batch_size=4)
    for result in (engine, hf):
        assert [len(t) for t in result.tokens] == work.output_lens, result.variant
        assert result.output_tokens == work.output_tokens and result.seconds > 0
    ratios = speedups([hf, engine])
    assert ratios["minisgl"] == pytest.approx(engine.tokens_per_s / hf.tokens_per_s)


# --- the online client against a live server ------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    directory = Path(tempfile.mkdtemp(prefix="minisgl-ch21-"))
    try:  # on the stubs the server never starts: its log folder still goes
        live = start_server(require_model(MODEL), directory / "server.log")
        yield live
        live.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def most_in_flight(results: list[RequestResult]) -> int:
    """The largest number of requests between their sending and their stream's end at once."""
    events = sorted([(r.sent_s, 1) for r in results] + [(r.done_s, -1) for r in results])
    now = most = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def test_four_concurrent_streams_against_a_live_server_give_sane_figures(server) -> None:  # noqa: ANN001
    output_len, clients = 8, 4
    results, seconds = asyncio.run(
        run_load(
            server.base_url,
            server.model,
            num_requests=8,
            duration_s=None,
            rate=math.inf,
            concurrency=clients,
            input_words=12,
            output_len=output_len,
            seed=0,
            progress=False,
        )
    )
    assert most_in_flight(results) == clients
    for r in results:
        assert r.ok, r.error
        assert r.output_tokens == output_len
        assert 0 < r.ttft_s <= r.latency_s
        assert len(r.itl_s) == len(r.piece_s) - 1 and all(gap >= 0 for gap in r.itl_s)
        assert r.ttft_s + sum(r.itl_s) <= r.latency_s + 1e-9
    summary = summarize(results, seconds)
    assert summary["errors"] == 0 and summary["output_tokens"] == 8 * output_len
    assert summary["token_throughput"] == pytest.approx(8 * output_len / seconds)
    for name in ("ttft", "itl", "latency"):
        assert 0 <= summary[f"{name}_p50_ms"] <= summary[f"{name}_p90_ms"]
        assert summary[f"{name}_p90_ms"] <= summary[f"{name}_p99_ms"] <= seconds * 1e3


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. Floats within rounding: a correct figure may be computed in
# another order (a percentile of milliseconds, or of seconds times 1000).

ROUNDING = Tolerance(rtol=1e-9, atol=1e-9)


def assert_same_observed(
    stub: Callable,
    observed: Callable[[Callable], Callable],
    *args: object,
    build: Callable[[], tuple] | None = None,
    tolerance: Tolerance = ROUNDING,
) -> None:
    """assert_same_call of `observed(stub)` against `observed(reference)`: a wrapper that adds
    to the stub's value what the comparison cannot see by itself, or leaves out of it what the
    contract leaves free."""
    reference = observed(reference_of(stub))
    found = call_differences(
        observed(stub), *args, reference=reference, build=build, tolerance=tolerance
    )
    assert not found, (
        f"{stub.__qualname__} differs from the reference on these inputs:\n  "
        + "\n  ".join(found)
        + f"\ninputs: {', '.join(describe(a) for a in args or build())}"  # type: ignore[misc]
    )


@settings(max_examples=30)
@given(
    num_requests=st.integers(0, 6),
    input_lens=bounds(1, 20),
    output_lens=bounds(1, 300),
    token_ids=bounds(0, 10_000) | st.just((7, 7)),
    seed=st.integers(0, 2**32),
)
def test_make_workload_matches_the_reference(
    num_requests: int,
    input_lens: tuple[int, int],
    output_lens: tuple[int, int],
    token_ids: tuple[int, int],
    seed: int,
) -> None:
    """Any spec (no request, ranges of one value) and seed: the same prompts and lengths,
    as Python ints, and the global generator left as it was (its next draw compared)."""

    def drawing(function: Callable) -> Callable:
        def call(spec: WorkloadSpec, seed: int) -> tuple:
            random.seed(1234)
            return function(spec, seed), random.random()

        return call

    spec = WorkloadSpec(num_requests, input_lens, output_lens, token_ids)
    assert_same_observed(make_workload, drawing, spec, seed, tolerance=EXACT)


FLOATS = st.floats(0, 1e4, allow_nan=False)


@settings(max_examples=50)
@given(
    values=st.lists(FLOATS, max_size=12) | st.lists(st.sampled_from([0.5, 2.0]), max_size=5),
    q=st.sampled_from([0.0, 50.0, 99.0, 100.0]) | st.floats(0, 100),
)
def test_percentile_matches_the_reference(values: list[float], q: float) -> None:
    """No value, one, repeated ones, any; q at both ends, the median, and any: the same
    percentile (nan for none) and the caller's list left as it was."""
    assert_same_call(percentile, values, q, tolerance=ROUNDING)


@st.composite
def request_results(draw: st.DrawFn) -> RequestResult:
    """A request as its client recorded it: sent, pieces (maybe none) at non-decreasing times
    after it, the end of its stream after them; ok or broken, with or without text."""
    sent = draw(FLOATS)
    waits = draw(st.lists(st.floats(0, 5, allow_nan=False), max_size=5))
    pieces = list(itertools.accumulate(waits, initial=sent))[1:]
    ok = draw(st.booleans())
    return RequestResult(
        ok=ok,
        error="" if ok else draw(st.sampled_from(["", "HTTP 503"])),
        sent_s=sent,
        piece_s=pieces,
        done_s=(pieces[-1] if pieces else sent) + draw(st.floats(0, 5, allow_nan=False)),
        output_tokens=draw(st.integers(0, 3)) * len(pieces) + draw(st.integers(0, 1)),
        text_chars=draw(st.sampled_from([0, 0, 5, 17])),
    )


@settings(max_examples=40)
@given(result=request_results())
def test_request_latencies_match_the_reference(result: RequestResult) -> None:
    """ttft_s, itl_s and latency_s, with no piece, one, several."""
    for figure in (RequestResult.ttft_s, RequestResult.itl_s, RequestResult.latency_s):
        assert_same_call(figure.fget, result)


def any_key_order(function: Callable) -> Callable:
    """The summary with its keys sorted: the contract names the keys, not their order."""

    def call(results: list[RequestResult], seconds: float) -> dict[str, float]:
        return dict(sorted(function(results, seconds).items()))

    return call


@settings(max_examples=40)
@given(
    results=st.lists(request_results(), max_size=6),
    seconds=st.sampled_from([1.0, 0.25]) | st.floats(1e-3, 1e3),
)
def test_summarize_matches_the_reference(results: list[RequestResult], seconds: float) -> None:
    """Runs of no request, only failed ones, streams without text or without pieces, and any
    mix: the same figures (keys in any order, values within rounding, nan where none)."""
    assert_same_observed(summarize, any_key_order, results, seconds, tolerance=ROUNDING)


class TimedScript:
    """The callables `timed` gets, on a fake clock: each spends its time and notes its call;
    run returns `value` (or raises, `fails`)."""

    def __init__(self, costs: dict[str, float], drains: list[float], fails: bool) -> None:
        self.clock = FakeClock()
        self.costs, self.drains, self.fails = costs, list(drains), fails
        self.calls: list[str] = []

    def warmup(self) -> str:
        self.calls.append("warmup")
        self.clock.spend(self.costs["warmup"])
        return "the warm-up's value"

    def run(self) -> list[int]:
        self.calls.append("run")
        self.clock.spend(self.costs["run"])
        if self.fails:
            raise RuntimeError("out of memory")
        return [1, 2, 3]

    def sync(self) -> None:
        self.calls.append("sync")
        self.clock.spend(self.drains.pop(0) if self.drains else 0.0)


def on_the_script_clock(function: Callable) -> Callable:
    """timed(run, warmup[, sync]) with time.perf_counter the script's clock; the calls the
    script saw are returned beside timed's value."""

    def call(script: TimedScript, with_sync: bool) -> tuple:
        saved = offline.time.perf_counter
        offline.time.perf_counter = script.clock
        try:
            if with_sync:
                return function(script.run, script.warmup, script.sync), script.calls
            return function(script.run, script.warmup), script.calls
        finally:
            offline.time.perf_counter = saved

    return call


@settings(max_examples=30)
@given(
    costs=st.fixed_dictionaries({"warmup": st.floats(0, 100), "run": st.floats(0, 10)}),
    drains=st.lists(st.floats(0, 10), min_size=2, max_size=2),
    fails=st.sampled_from([False, False, True]),
    with_sync=st.sampled_from([True, True, False]),
)
def test_timed_matches_the_reference(
    costs: dict[str, float], drains: list[float], fails: bool, with_sync: bool
) -> None:
    """Warm-ups, runs and drains of any length (none too), a run that raises, the default
    sync (no device here): the same value, seconds, and calls in the same order."""
    assert_same_observed(
        timed,
        on_the_script_clock,
        build=lambda: (TimedScript(costs, drains, fails), with_sync),
    )


@settings(max_examples=40)
@given(
    rows=st.lists(
        st.tuples(st.lists(st.integers(0, 99), max_size=6), st.integers(0, 6), st.booleans()),
        max_size=5,
    )
)
def test_requested_tokens_matches_the_reference(rows: list) -> None:
    """Rows (lists or tuples) longer than, exactly as long as, or shorter than their
    request's output: the same tokens, or a ValueError from both (its wording is free)."""
    generated = [tuple(row) if as_tuple else list(row) for row, _, as_tuple in rows]
    lens = [n for _, n, _ in rows]
    if any(len(row) < n for row, n, _ in rows):
        with pytest.raises(ValueError):
            reference_of(requested_tokens)(generated, lens)
        with pytest.raises(ValueError):
            requested_tokens(generated, lens)
        return
    assert_same_call(requested_tokens, generated, lens)


@st.composite
def offline_results(draw: st.DrawFn) -> tuple[list[OfflineResult], str]:
    """Results of one run (each variant once, in any order) and the baseline's name: mostly
    one of the variants, at any place; sometimes none. Either all did the same work, or one
    did other work (a request's count off by one, a request missing)."""
    counts = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(any))
    variants = draw(st.permutations(["transformers", "minisgl", "graphs", "eager"]))
    variants = variants[: draw(st.sampled_from([2, 4, 3, 1, 0]))]
    works = [list(counts) for _ in variants]
    if variants and draw(st.integers(0, 3)) == 0:
        work = works[draw(st.integers(0, len(works) - 1))]
        change = draw(st.sampled_from(["one more", "one less", "drop last"]))
        if change == "one more" or not work[0]:
            work[0] += 1
        elif change == "one less":
            work[0] -= 1
        else:
            work.pop()
    seconds = st.sampled_from([1.0, 0.5]) | st.floats(1e-3, 1e3)
    results = [
        OfflineResult(variant, draw(seconds), [[7] * n for n in work])
        for variant, work in zip(variants, works)
    ]
    baseline = draw(st.sampled_from([*variants, *variants, "transformers", "nothing"]))
    return results, baseline


@settings(max_examples=40)
@given(case=offline_results())
def test_speedups_matches_the_reference(case: tuple[list[OfflineResult], str]) -> None:
    """With the baseline present or absent, first or anywhere, and work that matches it or
    not: the same ratios in the same order (within rounding), {} or the ValueError."""
    results, baseline = case
    assert_same_call(speedups, results, baseline, tolerance=ROUNDING)
