"""One command that runs fastbert's GPU tests and benchmarks within a time budget."""
