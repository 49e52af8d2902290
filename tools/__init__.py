"""The project's tools, run from the repository root and never installed: the load test (`python -m
tools.loadtest`), the benchmarks (tools/benchmarks/), the Shapes ViT's training and evaluation
(tools/teaching/), and the shell entry points tools/setup, tools/test and tools/dashboard."""
