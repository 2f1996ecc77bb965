"""The course's benchmarks and GPU experiments, one command: `python -m benchmark SUBCOMMAND`.

Each subcommand is a module of this package with a `main(argv)`; they sit on `minisgl.benchmark`
(chapter 21: workloads, timing, results files). `benchmark/run_gpu.sh` lists what a GPU machine
runs, and `benchmark/results/` keeps the result lines the pages cite.
"""
