"""Experiment (not committed): the official workload with FlashInfer's FA3 kernels forced."""
import os, runpy, sys
import faulthandler
import flashinfer
faulthandler.dump_traceback_later(int(os.environ.get("HANG_S", "80")), exit=True)
mode = os.environ["FI_EXP"]
Dec, Pre = flashinfer.BatchDecodeWithPagedKVCacheWrapper, flashinfer.BatchPrefillWithPagedKVCacheWrapper
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
