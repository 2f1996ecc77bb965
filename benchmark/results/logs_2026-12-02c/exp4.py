"""Call 4 of 2026-12-02 (day): where the GPU idles in the official workload, by phase.

CUDA events recorded just before and just after each scheduler step's launch (Scheduler._forward):
the time between one step's end event and the next step's start event on the GPU is time the
device waited for the host; the time inside is the step's device time (with any wait for the
host's launches inside it, as in an eager prefill). No profiler: the host runs at full speed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, "benchmark")
import offline  # noqa: E402
from minisgl.benchmark import WORKLOADS, make_workload  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.scheduler import Scheduler  # noqa: E402

OUT = Path(sys.argv[1])
records: list[tuple[str, int, torch.cuda.Event, torch.cuda.Event]] = []
forward, generate = Scheduler._forward, LLM.generate


def timed_forward(self, forward_input):  # noqa: ANN001
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = forward(self, forward_input)
    end.record()
    records.append((forward_input.batch.phase, forward_input.batch.size, start, end))
    return out


def fresh_generate(llm, *args, **kwargs):  # noqa: ANN001
    records.clear()
    return generate(llm, *args, **kwargs)


Scheduler._forward, LLM.generate = timed_forward, fresh_generate
model = offline.resolve_model(offline.RANDOM_MODEL, torch.bfloat16)
work = make_workload(WORKLOADS["official"], 0)
for run in range(2):
    result = offline.run_variant(model, "official", work, torch.bfloat16, "minisgl", 1)
    torch.cuda.synchronize()
    buckets: dict[tuple[str, str], list[float]] = {}
    edges = offline.StepClock.BUCKETS
    prev_end = None
    for phase, size, start, end in records:
        low = max(b for b in edges if b <= size)
        key = (phase, str(low))
        inside = start.elapsed_time(end) / 1e3
        gap = prev_end.elapsed_time(start) / 1e3 if prev_end is not None else 0.0
        acc = buckets.setdefault(key, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += inside
        acc[2] += gap
        prev_end = end
    total_in = sum(v[1] for v in buckets.values())
    total_gap = sum(v[2] for v in buckets.values())
    print(f"run {run}: {result.seconds:.2f} s; device inside steps {total_in:.3f} s, gaps between steps {total_gap:.3f} s")
    for (phase, low), (n, inside, gap) in buckets.items():
        print(f"  {phase:8s} from {low:>4}: {n:4d} steps, inside {inside:.3f} s ({inside / n * 1e3:.2f} ms), gaps {gap:.3f} s ({gap / n * 1e3:.3f} ms)")
    with OUT.open("a") as f:
        f.write(json.dumps({"benchmark": "official_step_gaps", "run": run, "seconds": result.seconds,
                            "inside_s": total_in, "gaps_s": total_gap,
                            "buckets": {f"{p}:{l}": v for (p, l), v in buckets.items()},
                            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
