"""Measurements, run from the repository root: `python -m tools.benchmarks.benchmark` (core, dashboard,
browser, cold start), `python -m tools.benchmarks.benchmark_dataset` (many images),
`python -m tools.benchmarks.gpu_parity` (GPU against CPU)."""
