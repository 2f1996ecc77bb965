"""The throwaway wrapper of 2026-12-01's two H200 calls (README.md beside it): runs
benchmark/offline.py with FlashInfer's wrapper classes forced by FI_EXP.

FI_EXP: plain (nothing forced), nowait (the plan wait of 146eb07 skipped), tc-decode (decode
on FA2's tensor cores), fa3-decode (on FA3's), fa3-prefill, fa3-both. A run still going after
HANG_S seconds prints every thread's stack and exits.
"""

import faulthandler
import os
import runpy
import sys

import flashinfer

faulthandler.dump_traceback_later(int(os.environ.get("HANG_S", "80")), exit=True)
mode = os.environ["FI_EXP"]
Dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper
Pre = flashinfer.BatchPrefillWithPagedKVCacheWrapper
if mode in ("fa3-decode", "fa3-both", "tc-decode"):

    class D(Dec):
        def __init__(self, *a, **k):
            k["use_tensor_cores"] = True
            k["backend"] = "fa3" if "fa3" in mode else "auto"
            super().__init__(*a, **k)

    flashinfer.BatchDecodeWithPagedKVCacheWrapper = D
if mode in ("fa3-prefill", "fa3-both"):

    class P(Pre):
        def __init__(self, *a, **k):
            k["backend"] = "fa3"
            super().__init__(*a, **k)

    flashinfer.BatchPrefillWithPagedKVCacheWrapper = P
if mode == "nowait":
    from minisgl.attention import fi

    fi.FlashInferBackend._plan = lambda self, wrapper, *a, **k: wrapper.plan(*a, **k)
sys.argv = ["benchmark/offline.py"] + sys.argv[1:]
sys.path.insert(0, "benchmark")
runpy.run_path("benchmark/offline.py", run_name="__main__")
