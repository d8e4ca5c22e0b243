#!/usr/bin/env bash
# Install fastbert, run its GPU tests and benchmarks in one command of at most 540 s, and
# leave two files in OUT: summary.txt (also printed last) and gpu-run.tar.gz (every result).
#
#   bash benchmarks/run_gpu.sh OUT             # on a machine with a CUDA GPU, no network
#   bash benchmarks/run_gpu.sh --dry-run OUT   # any machine: would every stage start?
#
# Beforehand, on a machine with a package index: python -m benchmarks.gpu_run.wheels --out .whl
# --python-version 3.12 (the GPU machine's Python) fetches the serve stage's web stack, which
# GPU images tend to lack, into .whl/ (ignored by git): copy that folder with the repository.
#
# The stages, in order of value, each with its cap in seconds (benchmarks/gpu_run/plan.py):
# install 40, environment 20, gpu-tests 150 (the covering core of the GPU test grid), bench 50
# (fastbert bench, BERT-base fp16, 1x128 32x128 8x512 64x512 64x512p, against HF eager and
# sdpa), bench-compile 80 (torch.compile max-autotune and default at 32x128), corpus 30
# (tokens/s, padding-free, fp16 and bf16), limits 15 (bf16 GEMM and copy), kernels 45 (the
# kernel suite), train-step 30, serve-model 15, serve 55 (fastbert serve at 1, 16 and 64
# clients); then, on what time is left, gpu-tests-rest, bench-compile-rest (torch.compile at
# the other shapes), splade-head, gemm-configs and e2e-suite. A stage that reaches its cap is
# interrupted (it reports what it measured) and the next one starts.
# Knobs (environment): BUDGET_S (540), GPU_TEST_WORKERS (12, fewer on a smaller machine),
# PYTHON (python3). docs/benchmarks.md describes the run and the files.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = "--dry-run" ]; then
    exec "${PYTHON:-python3}" -m benchmarks.gpu_run --dry-run "${2:?usage: benchmarks/run_gpu.sh [--dry-run] OUT}"
fi
exec "${PYTHON:-python3}" -m benchmarks.gpu_run "${1:?usage: benchmarks/run_gpu.sh [--dry-run] OUT}"
