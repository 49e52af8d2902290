"""The project's tools, run from the repository root and never installed: the load test (`python -m
tools.loadtest`), the benchmarks (tools/benchmarks/), the Shapes ViT's training and evaluation
(tools/teaching/), the hostile files that the tests and the tools both use (tools/hostile/; tools never import
tests), and the shell entry points tools/setup, tools/test and tools/dashboard."""
