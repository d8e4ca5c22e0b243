"""Benchmark suites: kernel level and end to end (``pytest benchmarks``, CUDA only)."""
