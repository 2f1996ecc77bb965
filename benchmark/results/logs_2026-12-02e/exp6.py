"""Call 1 of 2026-12-02 (afternoon session): where the host's time goes in a batch-1 decode step.

One request (512-token prompt, pages of 16, graphs), random Qwen3-0.6B in bf16. After a
warm-up, each host-side piece of a decode step is timed alone over N calls (perf_counter, the
device drained before and after), then whole steps, then torch.profiler's CPU ops over 50 steps.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, "benchmark")
from decode_step import fill_decode_batch  # noqa: E402
from offline import resolve_model  # noqa: E402

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/exp6.jsonl")
N = 300


def emit(record: dict) -> None:
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")


def timed(name: str, fn, n: int = N) -> float:  # noqa: ANN001
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - start) / n
    torch.cuda.synchronize()
    total = (time.perf_counter() - start) / n
    print(f"  {name:<44} host {host * 1e6:8.1f} us   drained {total * 1e6:8.1f} us", flush=True)
    emit({"benchmark": "host_piece_batch1", "piece": name, "host_us": host * 1e6,
          "drained_us": total * 1e6})
    return host


def main() -> None:
    from minisgl.llm import LLM

    model = resolve_model("random-qwen3-0.6b", torch.bfloat16)
    with LLM(str(model), max_running_req=8, page_size=16, show_progress=False,
             max_seq_len=4096) as llm:
        sched = llm.scheduler
        fill_decode_batch(sched, 1, 512, 3000)
        for _ in range(30):
            sched.step()
        # allocate_paged is timed away from a page boundary: there it would take a page a call
        while next(iter(sched.decode_manager.running_reqs.values())).cached_len % 16 in (0, 15):
            sched.step()
        torch.cuda.synchronize()
        engine, runner = sched.engine, sched.engine.runner
        backend = engine.attn_backend
        batch = sched.decode_manager.schedule_next_batch()
        print(f"host pieces of a batch-1 decode step, context {batch.reqs[0].device_len}")
        timed("pick_batch", sched.pick_batch)
        timed("allocate_paged", lambda: sched.cache_manager.allocate_paged(batch.reqs))
        timed("table prepare_inputs", lambda: sched.table_manager.prepare_inputs(batch))
        described = backend.describe(batch, pad_to=1, pad_page=runner.pad_page)
        timed("fi describe", lambda: backend.describe(batch, pad_to=1, pad_page=runner.pad_page))
        wrapper = backend._graph_wrapper(1)
        timed("fi plan_decode (graph wrapper)", lambda: backend.plan_decode(wrapper, described))
        timed("runner.prepare (describe+plan)", lambda: runner.prepare(batch))
        args = engine.sampler.prepare(batch)
        timed("sampler.prepare", lambda: engine.sampler.prepare(batch))
        timed("runner.replay", lambda: runner.replay(batch), n=100)
        logits = runner.replay(batch)
        timed("sampler.sample", lambda: engine.sampler.sample(logits, args))
        timed("engine.forward_batch", lambda: engine.forward_batch(batch, args), n=100)
        tokens = engine.sampler.sample(logits, args).to(torch.int32)
        timed("table write_next_tokens", lambda: sched.table_manager.write_next_tokens(batch, tokens))
        timed("make_device_tensor(4 ints)",
              lambda: __import__("minisgl.utils").utils.make_device_tensor([1, 2, 3, 4], torch.int32, engine.device))
        timed("torch.cuda.Event()+record", lambda: torch.cuda.Event().record())
        timed("pinned empty(1)", lambda: torch.empty((1,), dtype=torch.int32, pin_memory=True))
        # whole steps, steady state
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200):
            sched.step()
        torch.cuda.synchronize()
        step = (time.perf_counter() - start) / 200
        print(f"  whole step: {step * 1e3:.3f} ms", flush=True)
        emit({"benchmark": "host_piece_batch1", "piece": "whole step", "host_us": step * 1e6})
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                sched.step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=45))
        while sched.has_work:
            sched.step()


if __name__ == "__main__":
    main()
