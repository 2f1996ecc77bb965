"""Benchmarks: seeded workloads, offline throughput against transformers, the online client
and its latency metrics, and results recorded with the command that made them."""

from .workload import WORKLOADS, Workload, WorkloadSpec, make_workload
from .metrics import RequestResult, percentile, summarize
from .offline import OfflineResult, run_engine, run_transformers, speedups
from .client import run_load
from .results import append_result, read_results, read_results_dir
